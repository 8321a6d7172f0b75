"""The gateway's fair queue: VTC order across tenants in front of saturated workers.

The property test states VTC's bound (Lemma 4.3, OSDI'24 §4.1; see
tests/test_policy_properties.py) for the gateway's setting, where no KV memory bounds what
is in flight but the pool's slots S do. After a tenant's last release, when it had the
least counter, its counter can grow by one prefill and the output of its at most S
requests in flight: w_e·L + S·w_q·O. The usage reported at finish may refund cached prompt
tokens (the gateway charged the whole prompt), which can lower another waiting tenant's
counter by the prefill of its S requests in flight: S·w_e·L. (Reported completions are at
least what the gateway counted while streaming, so output is only ever charged more.)
So U = w_e·L + S·w_q·O + S·w_e·L, and waiting tenants' counters stay within U / w_min.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairpool.sched import CostModel, TenantWeights
from fairpool_gateway.fair_queue import FairQueue
from fairpool_gateway.limits import Rejection

COST = CostModel()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Pool:
    """A pool of `slots` workers, busy with exactly what the queue has in flight."""

    def __init__(self, slots: int = 0, weights: Mapping[str, float] | None = None) -> None:
        self.slots = slots
        self.clock = FakeClock()
        self.queue = FairQueue(self.has_capacity, COST, weights or {}, clock=self.clock)
        self.released: list[str] = []

    def has_capacity(self) -> bool:
        return self.queue.in_flight() < self.slots

    async def client(
        self,
        request_id: str,
        tenant: str,
        input_tokens: int = 100,
        max_tokens: int = 50,
        queued_limit: int | None = None,
        timeout: float = math.inf,
    ) -> None:
        await self.queue.enter(request_id, tenant, input_tokens, max_tokens, queued_limit, timeout)
        self.released.append(request_id)

    def start(self, request_id: str, tenant: str, **options: object) -> asyncio.Task[None]:
        return asyncio.create_task(self.client(request_id, tenant, **options))  # type: ignore[arg-type]


async def let_tasks_run(rounds: int = 4) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def finished(*tasks: asyncio.Task[None]) -> None:
    """Let the loop run, then require `tasks` to be over (a bug fails here, not hangs)."""
    await let_tasks_run()
    assert all(task.done() for task in tasks)
    await asyncio.gather(*tasks)


# ---------------------------------------------------------------------- admission


def test_a_request_is_admitted_at_once_when_there_is_capacity_and_charged_its_prompt():
    async def scenario() -> None:
        pool = Pool(slots=1)
        await pool.queue.enter("r1", "a", 100, 50, None, math.inf)
        assert pool.queue.in_flight("a") == 1
        assert pool.queue.state()["a"]["served"] == 100.0
        waiting = pool.start("r2", "a")
        await let_tasks_run()
        assert pool.queue.queued("a") == 1 and not waiting.done()
        pool.queue.finish("r1")
        await let_tasks_run()
        assert waiting.done() and pool.released == ["r2"]

    asyncio.run(scenario())


def test_a_request_joins_the_queue_when_others_wait_even_with_capacity():
    async def scenario() -> None:
        pool = Pool(slots=0)
        first = pool.start("a0", "a")
        await let_tasks_run()
        pool.slots = 2  # capacity came back, but nobody called wake() yet
        await finished(first, pool.start("b0", "b"))  # b0 queues and wakes: both go
        assert sorted(pool.released) == ["a0", "b0"]

    asyncio.run(scenario())


# ---------------------------------------------------------------------- fairness


def release_order(weights: Mapping[str, float]) -> tuple[list[str], list[float]]:
    """50 requests of a flooding tenant queued, then 5 of a light one; one worker serves
    them one at a time (100 prompt, 50 output tokens each). Returns the release order and
    the gap between the two tenants' weighted service while the light one waits."""

    async def scenario() -> tuple[list[str], list[float]]:
        pool = Pool(slots=0, weights=weights)
        tasks = [pool.start(f"a{i}", "a") for i in range(50)]
        await let_tasks_run()
        tasks += [pool.start(f"b{i}", "b") for i in range(5)]
        await let_tasks_run()
        assert pool.queue.queued() == 55
        pool.slots = 1
        pool.queue.wake()
        gaps = []
        for _ in range(55):
            await let_tasks_run()
            (request_id,) = pool.released[-1:]
            pool.queue.record_output(request_id, 50)
            pool.queue.finish(request_id, prompt_tokens=100, completion_tokens=50)
            if pool.queue.queued("b"):
                state = pool.queue.state()
                gaps.append(
                    state["a"]["served"] / TenantWeights(weights)["a"]
                    - state["b"]["served"] / TenantWeights(weights)["b"]
                )
        await finished(*tasks)
        assert len(pool.released) == len(set(pool.released)) == 55
        return pool.released, gaps

    return asyncio.run(scenario())


def test_a_light_tenant_is_served_between_a_floods_requests_equal_weights():
    order, gaps = release_order({})
    fifo = [f"a{i}" for i in range(50)] + [f"b{i}" for i in range(5)]
    assert order[:10] == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3", "a4", "b4"]
    assert order[10:] == fifo[5:50]  # each tenant's own requests stay in arrival order
    assert fifo.index("b4") == 54  # where FIFO would have served the light tenant's last
    assert all(abs(gap) <= 200 for gap in gaps)  # within one request's service


def test_a_light_tenant_of_weight_two_gets_two_requests_per_flood_request():
    order, gaps = release_order({"b": 2.0})
    assert order[:8] == ["a0", "b0", "b1", "a1", "b2", "b3", "a2", "b4"]
    assert all(abs(gap) <= 200 for gap in gaps)


def test_a_tenant_that_joins_is_lifted_to_the_least_waiting_counter():
    async def scenario() -> None:
        pool = Pool(slots=1)
        await pool.client("a0", "a", input_tokens=1000)
        waiting = pool.start("a1", "a")
        await let_tasks_run()
        late = pool.start("b0", "b")
        await let_tasks_run()
        state = pool.queue.state()
        assert state["b"]["counter"] == state["a"]["counter"] == 1000.0
        pool.queue.finish("a0")
        await let_tasks_run()
        assert pool.released[-1] == "a1"  # tie: the earlier arrival
        pool.queue.finish("a1")
        await finished(waiting, late)

    asyncio.run(scenario())


def test_set_weights_applies_to_later_charges():
    async def scenario() -> None:
        pool = Pool(slots=2)
        pool.queue.set_weights({"b": 4.0})
        await pool.client("b0", "b", input_tokens=100)
        assert pool.queue.state()["b"]["counter"] == 25.0

    asyncio.run(scenario())


# ---------------------------------------------------------------------- refusals and exits


def test_queued_limit_refuses_at_once():
    async def scenario() -> None:
        pool = Pool(slots=0)
        held = [pool.start(f"a{i}", "a", queued_limit=2) for i in range(2)]
        await let_tasks_run()
        with pytest.raises(Rejection) as refused:
            await finished(pool.start("a2", "a", queued_limit=2))
        assert refused.value.reason == "queued" and refused.value.retry_after > 0
        assert "2 queued" in refused.value.message
        other = pool.start("b0", "b", queued_limit=2)  # other tenants have their own limit
        await let_tasks_run()
        assert pool.queue.queued("a") == 2 and pool.queue.queued("b") == 1
        with pytest.raises(Rejection):
            await finished(pool.start("c0", "c", queued_limit=0))  # 0: never wait
        pool.slots = 10
        pool.queue.wake()
        await finished(*held, other)
        await pool.client("c1", "c", queued_limit=0)  # admitted at once: no wait needed
        assert pool.queue.state()["c"]["served"] == 100.0

    asyncio.run(scenario())


def test_a_timed_out_request_leaves_the_queue_uncharged():
    async def scenario() -> None:
        pool = Pool(slots=0)
        with pytest.raises(Rejection) as refused:
            # wait_for only turns a broken timeout into a failure instead of a hang
            await asyncio.wait_for(pool.client("a0", "a", timeout=0.01), timeout=10)
        assert refused.value.reason == "queue_timeout"
        assert refused.value.retry_after > 0
        assert pool.queue.queued() == 0
        pool.slots = 1
        pool.queue.wake()
        assert pool.queue.in_flight() == 0 and pool.released == []
        assert pool.queue.state().get("a", {}).get("served", 0.0) == 0.0

    asyncio.run(scenario())


def test_a_release_at_the_moment_of_the_timeout_wins_once():
    async def scenario() -> None:
        pool = Pool(slots=0)
        task = pool.start("a0", "a", timeout=0.0)
        await asyncio.sleep(0)  # the task is queued with its timer due; it has not fired
        pool.slots = 1
        pool.queue.wake()
        await finished(task)  # released, not timed out
        assert pool.queue.in_flight() == 1 and pool.queue.queued() == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_queue():
    async def scenario() -> None:
        pool = Pool(slots=0)
        gone = pool.start("a0", "a")
        stays = pool.start("b0", "b")
        await let_tasks_run()
        gone.cancel()
        await let_tasks_run()
        assert gone.cancelled() and pool.queue.queued() == 1
        pool.slots = 1
        pool.queue.wake()
        await finished(stays)
        assert pool.released == ["b0"] and pool.queue.in_flight() == 1

    asyncio.run(scenario())


def test_a_waiter_cancelled_just_before_a_wake_does_not_hold_up_the_others():
    async def scenario() -> None:
        pool = Pool(slots=0)
        gone = pool.start("a0", "a")
        stays = pool.start("b0", "b")
        await let_tasks_run()
        gone.cancel()  # its task has not cleaned up when ...
        pool.slots = 1
        pool.queue.wake()  # ... capacity comes back, with a0 first in VTC order
        await finished(stays)
        assert gone.cancelled() and pool.released == ["b0"]

    asyncio.run(scenario())


def test_a_waiter_cancelled_after_its_release_is_undone_and_its_place_passed_on():
    async def scenario() -> None:
        pool = Pool(slots=0)
        gone = pool.start("a0", "a")
        stays = pool.start("b0", "b")
        await let_tasks_run()
        pool.slots = 1
        pool.queue.wake()  # releases a0 ...
        gone.cancel()  # ... whose client leaves before its task resumes
        await finished(stays)
        assert gone.cancelled() and pool.released == ["b0"]
        assert pool.queue.in_flight() == 1 and pool.queue.in_flight("a") == 0
        assert pool.queue.state()["a"]["served"] == 0.0
        pool.queue.finish("a0")  # a caller's finish() on it is harmless

    asyncio.run(scenario())


def test_finish_on_a_queued_request_withdraws_it():
    async def scenario() -> None:
        pool = Pool(slots=0)
        task = pool.start("a0", "a")
        await let_tasks_run()
        pool.queue.finish("a0")
        await let_tasks_run()
        assert task.cancelled() and pool.queue.queued() == 0

    asyncio.run(scenario())


# ---------------------------------------------------------------------- charging


def test_finish_with_usage_makes_the_charge_exact():
    async def scenario() -> None:
        pool = Pool(slots=3)
        await pool.client("r1", "a", input_tokens=100)
        pool.queue.record_output("r1", 30)
        assert pool.queue.state()["a"]["served"] == 160.0
        pool.queue.finish("r1", prompt_tokens=120, cached_tokens=40, completion_tokens=35)
        assert pool.queue.state()["a"]["served"] == COST.service(80, 35)
        pool.queue.finish("r1", prompt_tokens=1, completion_tokens=1)  # idempotent
        pool.queue.record_output("r1", 5)  # late tokens of a finished request are ignored
        assert pool.queue.state()["a"]["served"] == COST.service(80, 35)

        await pool.client("r2", "b", input_tokens=100)
        pool.queue.record_output("r2", 50)
        pool.queue.finish("r2", prompt_tokens=100, cached_tokens=100, completion_tokens=20)
        assert pool.queue.state()["b"]["served"] == COST.service(0, 20)  # a refund

        await pool.client("r3", "c", input_tokens=100)
        pool.queue.record_output("r3", 7)
        pool.queue.finish("r3")  # no usage: what was charged stays
        state = pool.queue.state()["c"]
        assert state["served"] == COST.service(100, 7)
        assert state["in_flight"] == 0 and state["queued"] == 0

    asyncio.run(scenario())


def test_state_reports_the_longest_wait_by_the_clock():
    async def scenario() -> None:
        pool = Pool(slots=0)
        task = pool.start("a0", "a")
        await let_tasks_run()
        pool.clock.now += 7.5
        assert pool.queue.state()["a"] == {
            "counter": 0.0,
            "served": 0.0,
            "queued": 1.0,
            "in_flight": 0.0,
            "longest_wait": 7.5,
        }
        task.cancel()
        await let_tasks_run()

    asyncio.run(scenario())


# ---------------------------------------------------------------------- property

TENANTS = ["a", "b", "c"]
MAX_INPUT = 40
MAX_OUTPUT = 40
MAX_SLOTS = 3

arrival = st.tuples(
    st.just("enter"),
    st.sampled_from(TENANTS),
    st.integers(1, MAX_INPUT),
    st.integers(1, MAX_OUTPUT),
)
event = st.one_of(
    arrival,
    st.tuples(st.just("burst"), st.integers(2, 15), arrival),
    st.tuples(st.just("slots"), st.integers(0, MAX_SLOTS)),
    st.tuples(st.just("stream"), st.integers(1, 20)),
    st.tuples(st.just("serve"), st.integers(0, MAX_INPUT)),
    st.tuples(
        st.just("finish"),
        st.integers(0, 1000),
        st.integers(0, MAX_INPUT),  # cached prompt tokens (capped at the prompt)
        st.integers(0, MAX_OUTPUT),  # completion tokens beyond those streamed (capped)
    ),
    st.tuples(st.just("cancel"), st.integers(0, 1000)),
    st.tuples(st.just("release_and_cancel"), st.integers(0, 1000)),
    st.tuples(st.just("wake")),
)
weights = st.dictionaries(st.sampled_from(TENANTS), st.sampled_from([0.5, 1.0, 2.0, 3.0]))
queue_limits = st.dictionaries(st.sampled_from(TENANTS), st.one_of(st.none(), st.integers(0, 6)))


def vtc_bound(table: TenantWeights) -> float:
    growth = COST.prefill(MAX_INPUT, 0) + MAX_SLOTS * COST.decode(MAX_OUTPUT)
    refunds = MAX_SLOTS * COST.prefill(MAX_INPUT, 0)
    u = growth + refunds
    return u / min(table[tenant] for tenant in TENANTS)


@dataclass
class Model:
    """What the clients of a pool know: every request's fate, and what it should cost."""

    pool: Pool
    queue_limits: dict[str, int | None]
    requests: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)
    streamed: dict[str, int] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    finished_service: dict[str, float] = field(default_factory=dict)

    async def client(self, request_id: str) -> None:
        tenant, input_tokens, max_tokens = self.requests[request_id]
        limit = self.queue_limits.get(tenant)
        queue = self.pool.queue
        try:
            await queue.enter(request_id, tenant, input_tokens, max_tokens, limit, math.inf)
        except Rejection as refused:
            assert refused.reason == "queued"
            self.record(request_id, "refused")
            return
        self.record(request_id, "admitted")
        self.in_flight.add(request_id)
        self.streamed[request_id] = 0

    def record(self, request_id: str, outcome: str) -> None:
        assert request_id not in self.outcome, f"{request_id} ended twice"
        self.outcome[request_id] = outcome

    def pending(self) -> list[str]:
        return sorted(rid for rid, task in self.tasks.items() if not task.done())

    def apply(self, step: tuple) -> None:  # type: ignore[type-arg]
        kind, queue = step[0], self.pool.queue
        if kind == "enter":
            _, tenant, input_tokens, max_tokens = step
            request_id = f"r{len(self.requests)}"
            self.requests[request_id] = (tenant, input_tokens, max_tokens)
            self.tasks[request_id] = asyncio.create_task(self.client(request_id))
        elif kind == "burst":
            for _ in range(step[1]):
                self.apply(step[2])
        elif kind == "slots":
            self.pool.slots = step[1]
            queue.wake()
        elif kind == "stream":
            for request_id in sorted(self.in_flight):
                room = self.requests[request_id][2] - self.streamed[request_id]
                tokens = min(step[1], room)
                queue.record_output(request_id, tokens)
                self.streamed[request_id] += tokens
        elif kind == "serve":  # every request in flight runs to its max_tokens
            for request_id in sorted(self.in_flight):
                self.finish(request_id, step[1], self.requests[request_id][2])
        elif kind == "finish" and self.in_flight:
            request_id = sorted(self.in_flight)[step[1] % len(self.in_flight)]
            self.finish(request_id, step[2], step[3])
        elif kind in ("cancel", "release_and_cancel") and self.pending():
            if kind == "release_and_cancel":  # a release the client leaves before seeing
                self.pool.slots = min(MAX_SLOTS, self.pool.slots + 1)
                queue.wake()
            pending = self.pending()
            self.tasks[pending[step[1] % len(pending)]].cancel()
        elif kind == "wake":
            queue.wake()

    def finish(self, request_id: str, cached: int, unstreamed: int) -> None:
        """Finish with usage: the prompt as estimated, some of it cached, and the tokens
        streamed plus `unstreamed` that the gateway did not count."""
        tenant, prompt, max_tokens = self.requests[request_id]
        cached = min(cached, prompt)
        completion = min(self.streamed[request_id] + unstreamed, max_tokens)
        self.pool.queue.finish(request_id, prompt, cached, completion)
        self.in_flight.discard(request_id)
        service = COST.service(prompt - cached, completion)
        self.finished_service[tenant] = self.finished_service.get(tenant, 0.0) + service

    def settle_cancellations(self) -> None:
        for request_id, task in self.tasks.items():
            if task.cancelled() and request_id not in self.outcome:
                self.record(request_id, "cancelled")

    def check(self, bound: float) -> None:
        queue = self.pool.queue
        self.settle_cancellations()
        # Every request is exactly one of queued, in flight, finished, refused or cancelled.
        assert queue.queued() == len(self.pending())
        assert queue.in_flight() == len(self.in_flight) <= MAX_SLOTS
        assert len(self.outcome) + len(self.pending()) == len(self.requests)
        # Work conservation: nobody waits while there is room.
        assert not (queue.queued() and self.pool.has_capacity())
        state = queue.state()
        for tenant in TENANTS:
            assert state.get(tenant, {}).get("served", 0.0) == pytest.approx(
                self.expected_service(tenant)
            )
        waiting = [state[t]["counter"] for t in TENANTS if queue.queued(t)]
        if waiting:
            assert max(waiting) - min(waiting) <= bound + 1e-6

    def expected_service(self, tenant: str) -> float:
        charged = sum(
            COST.service(self.requests[rid][1], self.streamed[rid])
            for rid in self.in_flight
            if self.requests[rid][0] == tenant
        )
        return self.finished_service.get(tenant, 0.0) + charged

    async def drain(self) -> None:
        self.pool.slots = 10_000
        self.pool.queue.wake()
        await let_tasks_run()
        assert not self.pending()
        for request_id in sorted(self.in_flight):
            self.pool.queue.finish(request_id)
        self.in_flight.clear()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.settle_cancellations()


# A tenant that has been served much floods the queue, then another joins: the newcomer must
# be lifted to the flood's counter (or it starts far below), and then served in turn (FIFO
# would serve the whole flood first and the flood's counter would run away).
LATE_JOINER_AFTER_A_FLOOD = [
    ("slots", 3),
    ("burst", 3, ("enter", "a", 40, 40)),
    ("serve", 0),
    ("burst", 3, ("enter", "a", 40, 40)),
    ("serve", 0),
    ("slots", 0),
    ("burst", 10, ("enter", "a", 40, 40)),
    ("enter", "b", 40, 40),
    ("slots", 1),
    *[("serve", 0)] * 8,
]


@settings(max_examples=150)
@example(LATE_JOINER_AFTER_A_FLOOD, {}, {})
@given(st.lists(event, min_size=10, max_size=120), weights, queue_limits)
def test_vtc_bound_holds_and_no_request_is_lost_or_duplicated(events, tenant_weights, limits):
    table = TenantWeights(tenant_weights)
    bound = vtc_bound(table)

    async def scenario() -> Model:
        model = Model(Pool(slots=0, weights=table), limits)
        for step in events:
            model.apply(step)
            await let_tasks_run()
            model.check(bound)
        await model.drain()
        return model

    model = asyncio.run(scenario())
    assert set(model.outcome) == set(model.requests)
    assert model.pool.queue.queued() == model.pool.queue.in_flight() == 0
    admitted = [rid for rid, outcome in model.outcome.items() if outcome == "admitted"]
    assert len(admitted) == len(set(admitted))
