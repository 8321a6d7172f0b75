"""The gateway's bounds on what one client may cost it, each on its own and by random
search: the body's pre-scan, the caps read as the engine reads them, the input estimate,
the byte budget, the damping of refusal storms and the sampling of their logs, the usage
found in an answer of any size, the cap on answers that are not streamed, and the loop-lag
rule that keeps a late event loop from ejecting workers.

The same bounds against a real gateway on loopback are in tests/test_gateway_hostile_clients.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairpool.api.gateway_config import ClientLimits
from fairpool.runtime import LoopLag
from fairpool_gateway.body import (
    ENVELOPE_BYTES,
    LOGPROB_FIELDS,
    as_engine_int,
    check_shape,
    load_json,
    parse_body,
    prepare,
)
from fairpool_gateway.budget import ByteLimits, BytesInFlight, OverBudget
from fairpool_gateway.metrics import SampledLog
from fairpool_gateway.protocol import ENDPOINTS, GatewayError, validate
from fairpool_gateway.proxy import UsageScanner, WholeRelay
from fairpool_gateway.refusals import MAX_DELAY, Refusals, Storms

pytestmark = pytest.mark.unit

BURST, RATE = Storms().burst, Storms().rate  # the defaults

#: Small bounds on arrays and strings, which the generated documents reach; none on the
#: objects and numbers the parser counts itself.
LIMITS = ClientLimits.model_validate(
    {"maxJsonArrays": 10, "maxJsonStrings": 25, "maxJsonObjects": 10_000, "maxJsonNumbers": 10_000}
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------- the pre-scan


def counts(value: Any) -> tuple[int, int]:
    """Arrays and strings (keys included) in a parsed document."""
    if isinstance(value, list):
        arrays, strings = 1, 0
        for item in value:
            a, s = counts(item)
            arrays, strings = arrays + a, strings + s
        return arrays, strings
    if isinstance(value, dict):
        arrays, strings = 0, len(value)
        for item in value.values():
            a, s = counts(item)
            arrays, strings = arrays + a, strings + s
        return arrays, strings
    return 0, 1 if isinstance(value, str) else 0


# Text full of what the upper bounds count: brackets and quotes inside strings.
TRICKY_TEXT = st.text(alphabet='ab[]{}"\\,: ', max_size=12)
DOCUMENTS = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(TRICKY_TEXT, inner, max_size=5),
    max_leaves=60,
)


@given(body=st.dictionaries(st.text(max_size=3), DOCUMENTS, max_size=4))
def test_the_prescan_refuses_exactly_the_bodies_over_a_bound(body: dict[str, Any]) -> None:
    """Whatever brackets and quotes the text holds, a body is refused for its arrays or
    strings iff it has more than the limits allow (objects and numbers are the parser's
    own counts, checked as they are built)."""
    arrays, strings = counts(body)
    try:
        load_json(json.dumps(body).encode(), LIMITS)
        refused = None
    except GatewayError as error:
        refused = error.message
    over = arrays > LIMITS.max_json_arrays or strings > LIMITS.max_json_strings
    assert (refused is not None) == over, (arrays, strings, refused)
    if refused is not None:
        assert "arrays" in refused or "strings" in refused


def test_a_bomb_of_empty_lists_is_refused_before_it_is_built() -> None:
    bomb = b'{"model":"m","prompt":[' + b",".join([b"[]"] * 1_300_000) + b"]}"
    tracemalloc.start()
    try:
        with pytest.raises(GatewayError, match="more than 20000 JSON arrays"):
            load_json(bomb, ClientLimits())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # parsed, it would be some 200 MB


def test_a_bomb_of_short_strings_is_refused_before_it_is_built() -> None:
    bomb = b'{"model":"m","input":[' + b",".join([b'"ab"'] * 800_000) + b"]}"
    tracemalloc.start()
    try:
        with pytest.raises(GatewayError, match="more than 200000 strings"):
            load_json(bomb, ClientLimits())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_brackets_and_quotes_in_text_are_not_counted() -> None:
    text = 'x = [a[i] for i in range(3)]; s = "q"\n' * 30_000  # 60k brackets, 60k quotes
    body = json.dumps({"model": "m", "prompt": text}).encode()
    assert load_json(body, ClientLimits())["prompt"] == text


def test_a_large_body_is_parsed_off_the_event_loop() -> None:
    seen: list[str] = []
    limits = ClientLimits()

    def parse(body: bytes) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            import fairpool_gateway.body as body_module

            original = body_module.load_json

            def recording(*args: Any) -> dict[str, Any]:
                seen.append(threading.current_thread().name)
                return original(*args)

            body_module.load_json = recording
            try:
                return await parse_body(body, limits)
            finally:
                body_module.load_json = original

        return asyncio.run(go())

    parse(json.dumps({"prompt": "x" * 100}).encode())
    parse(json.dumps({"prompt": "x" * 200_000}).encode())
    assert seen[0] == threading.main_thread().name
    assert seen[1] != threading.main_thread().name


# ---------------------------------------------------------------------- engine-read caps


ENGINE_INTS = st.one_of(
    st.integers(-50, 50),
    st.integers(-50, 50).map(float),
    st.integers(-50, 50).map(str),
    st.integers(-50, 50).map(lambda n: f" {n}.0 "),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-50, max_value=50),
    st.text(max_size=4),
    st.none(),
)


@given(field=st.sampled_from(["n", "best_of", *LOGPROB_FIELDS]), value=ENGINE_INTS)
def test_caps_hold_for_every_value_the_engine_reads_as_an_integer(field: str, value: Any) -> None:
    limits = ClientLimits()
    cap = limits.max_logprobs if field in LOGPROB_FIELDS else limits.max_choices
    read = as_engine_int(value)
    document = {"model": "m", field: value}
    try:
        check_shape(document, limits)
        refused = False
    except GatewayError as error:
        refused = True
        assert error.param == field
    if read is None:
        assert not refused and document[field] == value  # the engine refuses it itself
        return
    too_much = read > cap or (read < 0 and field in LOGPROB_FIELDS)
    assert refused == too_much
    if not refused:
        assert document[field] == read  # the engine is sent what was checked


def test_the_findings_coerced_types_are_refused() -> None:
    for value in (9.0, "100", " 9 ", "9.0"):
        with pytest.raises(GatewayError, match="n: at most 8"):
            check_shape({"n": value}, ClientLimits())
    with pytest.raises(GatewayError, match="prompt_logprobs: at most 20"):
        check_shape({"prompt_logprobs": 21}, ClientLimits())
    with pytest.raises(GatewayError, match="prompt_logprobs: must not be negative"):
        check_shape({"prompt_logprobs": -1}, ClientLimits())


# ---------------------------------------------------------------------- the input estimate


CHAT = next(endpoint for endpoint in ENDPOINTS if endpoint.path == "/v1/chat/completions")


def estimate(document: dict[str, Any]) -> int:
    parsed = prepare(document, validate(document, CHAT), CHAT, "acme", share_cache=False)
    return parsed.estimated_input_tokens


@given(
    tools=st.integers(0, 400_000),
    parts=st.integers(0, 50),
    text=st.text(max_size=200),
)
def test_every_prompt_bearing_field_counts_in_the_estimate(tools: int, parts: int, text: str):
    """Text in `tools`, in non-text content parts and in any field counts at the prompt's
    rate beyond the envelope's allowance: the estimate never falls below what those fields
    hold."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 400}}
    ] * parts
    document = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d" * tools}}],
    }
    other = len(json.dumps(document["tools"], separators=(",", ":"))) + parts * 430
    role_tags = len("<|user|>\n\n")
    assert estimate(document) * 4 >= len(text) + other - ENVELOPE_BYTES - role_tags


def test_four_hundred_kilobytes_of_tools_are_not_four_tokens() -> None:
    small = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    large = {
        **small,
        "tools": [{"type": "function", "function": {"name": "f", "description": "d" * 400_000}}],
    }
    assert estimate(small) <= 4
    assert estimate(large) >= 99_000


# ---------------------------------------------------------------------- bytes in flight


@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(["take", "back", "end"]),
            st.integers(0, 400),
        ),
        max_size=60,
    )
)
def test_bodies_never_hold_more_than_the_budgets(steps: list[tuple[str, str, int]]) -> None:
    budget = BytesInFlight(lambda: ByteLimits(total=1000, per_tenant=600))
    holdings = {tenant: budget.holding(tenant) for tenant in "abc"}
    for tenant, action, amount in steps:
        holding = holdings[tenant]
        if action == "take":
            try:
                holding.take(amount)
            except OverBudget as error:
                assert error.status in (429, 503)
        elif action == "back":
            holding.give_back(amount)
        else:
            holding.release()
        assert budget.total <= 1000
        assert all(budget.held_by(name) <= 600 for name in "abc")
        assert budget.total == sum(h.held for h in holdings.values())
    for holding in holdings.values():
        holding.release()
    assert budget.total == 0 and not budget.by_tenant


@given(steps=st.lists(st.tuples(st.sampled_from("ab"), st.booleans()), max_size=80))
def test_a_tenant_holds_at_most_its_open_requests(steps: list[tuple[str, bool]]) -> None:
    """Opening (True) and ending (False) requests of two tenants in any order: each holds
    at most `requests_per_tenant` at once, refusals are 429s, and every end is counted."""
    budget = BytesInFlight(lambda: ByteLimits(1 << 30, 1 << 30, requests_per_tenant=3))
    open_ones: dict[str, list[Any]] = {"a": [], "b": []}
    for tenant, opening in steps:
        if opening:
            try:
                open_ones[tenant].append(budget.holding(tenant))
            except OverBudget as error:
                assert error.status == 429 and error.code == "too_many_open_requests"
                assert len(open_ones[tenant]) == 3
        elif open_ones[tenant]:
            holding = open_ones[tenant].pop(0)
            holding.release()
            holding.release()  # again: harmless
        assert all(budget.requests.get(t, 0) == len(h) <= 3 for t, h in open_ones.items())


def test_an_answer_waits_for_room_and_every_answer_moves() -> None:
    async def scenario() -> None:
        budget = BytesInFlight(lambda: ByteLimits(total=100, per_tenant=100))
        first, second = budget.holding("a"), budget.holding("a")
        await first.take_when_room(90)
        await second.take_when_room(50)  # holds nothing yet: it may always move
        waiting = asyncio.ensure_future(second.take_when_room(10))
        await asyncio.sleep(0)
        assert not waiting.done()  # 150 held: no room until some is given back
        first.release()
        await asyncio.wait_for(waiting, 5)
        assert budget.total == 60

    asyncio.run(scenario())


# ---------------------------------------------------------------------- refusal storms


@given(gaps=st.lists(st.floats(0, 2, allow_nan=False), min_size=1, max_size=200))
def test_refusals_pass_undamped_at_most_at_the_buckets_rate(gaps: list[float]) -> None:
    """In any stretch of T seconds, at most BURST + RATE·T refusals go out at once; every
    other one is held back, never longer than MAX_DELAY (nor than its Retry-After)."""
    clock = Clock()
    refusals = Refusals(clock=clock)
    undamped: list[float] = []
    for gap in gaps:
        clock.now += gap
        delay = refusals.delay("acme", retry_after=7.0)
        assert delay in (0.0, MAX_DELAY)
        if delay == 0:
            undamped.append(clock.now)
    for start in range(len(undamped)):
        for end in range(start, len(undamped)):
            span = undamped[end] - undamped[start]
            assert end - start + 1 <= BURST + RATE * span + 1e-9


def test_a_refusal_that_read_a_large_body_costs_more_and_a_storm_is_refused_unread() -> None:
    clock = Clock()
    refusals = Refusals(clock=clock)
    bomb = 4 << 20  # a 4 MiB body read, then refused: five tokens
    assert [refusals.delay("bomber", 1.0, bomb) for _ in range(5)] == [0, 0, 0, 0, 1.0]
    assert refusals.storming("bomber") and not refusals.storming("other")
    clock.now += (BURST + 1) / RATE  # the debt is repaid, the bucket refills
    assert not refusals.storming("bomber")


def test_a_storm_of_one_tenant_does_not_damp_another() -> None:
    clock = Clock()
    refusals = Refusals(clock=clock)
    assert all(refusals.delay("storm", 1.0) == 0 for _ in range(int(BURST)))
    assert refusals.delay("storm", 0.3) == 0.3  # no longer than its Retry-After
    assert refusals.delay("other", 1.0) == 0
    clock.now += 2 / RATE  # the damped refusal's debt is repaid, and a token more
    assert refusals.delay("storm", 1.0) == 0


@given(gaps=st.lists(st.floats(0, 0.5, allow_nan=False), max_size=100))
def test_sampled_logs_write_at_most_one_line_a_second_and_lose_no_count(gaps: list[float]):
    """Lines at least a second apart; each says exactly how many were left out since the
    last line written."""
    clock = Clock()
    sampled = SampledLog(interval=1.0, clock=clock)
    written_at: list[float] = []
    left_out_since = 0
    for gap in gaps:
        clock.now += gap
        said = sampled.admit("acme")
        if said is None:
            left_out_since += 1
            continue
        assert said == left_out_since
        assert not written_at or clock.now - written_at[-1] >= 1.0
        written_at.append(clock.now)
        left_out_since = 0
    assert bool(written_at) == bool(gaps)  # the first is always written


# ---------------------------------------------------------------------- usage, answers


USAGE = {"prompt_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}, "completion_tokens": 4}


@given(
    before=st.integers(0, 20_000),
    after=st.integers(0, 20_000),
    cuts=st.lists(st.integers(1, 50_000), max_size=12),
)
def test_the_usage_is_found_however_the_answer_is_cut(before: int, after: int, cuts: list[int]):
    """vLLM writes `prompt_logprobs` after the usage: however long the text around it and
    wherever the chunks end, the scanner finds the last usage object."""
    document = {
        "choices": [{"text": "u" * before}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        "later": {"usage": USAGE},
        "prompt_logprobs": ["p" * after],
    }
    answer = json.dumps(document, separators=(",", ":")).encode()
    scanner = UsageScanner()
    start = 0
    for cut in sorted({min(cut, len(answer)) for cut in cuts}):
        scanner.feed(answer[start:cut])
        start = cut
    scanner.feed(answer[start:])
    assert scanner.usage is not None
    assert (scanner.usage.prompt_tokens, scanner.usage.cached_tokens) == (7, 3)
    assert scanner.usage.completion_tokens == 4


class UnsizedAnswer:
    """An engine's answer without a Content-Length, as long as it likes."""

    status = 200

    def __init__(self, chunk: bytes, count: int) -> None:
        self.chunk, self.left = chunk, count
        self.content = self
        self.closed = False

    async def readany(self) -> bytes:
        await asyncio.sleep(0)
        if self.left == 0:
            return b""
        self.left -= 1
        return self.chunk

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        pass


def test_an_answer_past_the_cap_fails_having_held_no_more_than_its_buffer() -> None:
    async def scenario() -> None:
        budget = BytesInFlight(lambda: ByteLimits(total=1 << 30, per_tenant=1 << 30))
        holding = budget.holding("acme")
        engine = UnsizedAnswer(b"x" * 65536, count=10_000)  # 655 MB, if read whole
        outcomes: list[Any] = []
        relay = WholeRelay(
            engine,  # type: ignore[arg-type]
            idle_timeout=60,
            cap=1 << 20,
            reserved_output=5,
            on_end=outcomes.append,
            holding=holding,
        )
        taken = 0
        async for chunk in relay.chunks(lambda: 0.0):
            taken += len(chunk)
            assert holding.held <= relay.buffer_bytes + 65536
        (outcome,) = outcomes
        assert outcome.status == 502 and "maxAnswerBytes" in (relay.error or "")
        assert taken <= 1 << 20 and engine.closed
        relay.close()
        assert holding.held == 0

    asyncio.run(scenario())


# ---------------------------------------------------------------------- the loop's own lag


def test_the_loop_lag_sees_a_blocked_loop() -> None:
    async def scenario() -> float:
        lag = LoopLag(interval=0.01)
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.05)
        started = time.monotonic()
        time.sleep(0.3)  # the loop is held, as a long parse on it would hold it
        blocked = lag.late_since(started)
        task.cancel()
        return blocked

    assert asyncio.run(scenario()) >= 0.29
