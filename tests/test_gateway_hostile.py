"""A gateway no tenant can break: each finding of the security review, reproduced against
the real gateway and engine-sim on loopback. Every test here fails on the gateway as it
was before the fixes.

Waits are bounded by tests/polling.py's deadline or by socket timeouts far above the
settings under test: they bound a hang, they are never the assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import tracemalloc
from typing import Any

import httpx
import pytest
from gateway_helpers import (
    KEYS,
    MODEL,
    UNDAMPED,
    client,
    completion,
    engines,
    gateway,
    gateway_config,
    gateway_metric,
    tenant_entry,
)
from polling import eventually, wait_until
from sim_http import held

from fairpool.api.gateway_config import GatewayConfig
from fairpool_gateway.server import GatewayThread

pytestmark = pytest.mark.loopback

SOCKET_DEADLINE = 30.0  # seconds a raw socket waits for the gateway: bounds a hang only


def with_settings(config: GatewayConfig, **fields: Any) -> GatewayConfig:
    document = config.model_dump(by_alias=True)
    document.update(fields)
    return GatewayConfig.model_validate(document)


def pool_state(running: GatewayThread) -> dict[str, Any]:
    return httpx.get(f"{running.admin_url}/admin/pools").json()["main"]


def nothing_in_flight(running: GatewayThread) -> bool:
    """Every ledger is back to zero: no request queued or on a worker, no tenant holding
    a concurrency slot."""
    state = pool_state(running)
    tenants = httpx.get(f"{running.admin_url}/admin/tenants").json()["tenants"]
    return (
        state["queued"] == 0
        and all(worker["outstanding"] == 0 for worker in state["workers"].values())
        and all(tenant["usage"]["concurrent"] == 0 for tenant in tenants)
    )


def raw_exchange(url: str, request: bytes) -> bytes:
    """Send `request` bytes on a fresh connection and read until the gateway closes it or
    has answered (the headers and a Content-Length body); b"" if it reset the connection
    before we were done sending."""
    host, port = url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=SOCKET_DEADLINE) as connection:
            connection.sendall(request)
            return _read_answer(connection)
    except (ConnectionResetError, BrokenPipeError):  # reset before we were done sending
        return b""


def _read_answer(connection: socket.socket) -> bytes:
    """What the gateway sent until it closed or reset the connection (the gateway resets a
    connection it gives up on: `fairpool_gateway.connections`)."""
    received = b""
    while True:
        try:
            chunk = connection.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            length = line.lower().startswith(b"content-length:") and int(line.split(b":")[1])
            if length is not False and len(body) >= length:
                return received


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer else 0


# ---------------------------------------------------------------------- high


@pytest.fixture(scope="module")
def served():
    """(the gateway, its engine)"""
    with engines(1, speedup=500.0) as workers:
        config = gateway_config(
            [w.url for w in workers],
            [tenant_entry("light", limits={"concurrent": 4}), tenant_entry("other")],
            routing={"saturation": {"maxOutstanding": 2}},
        )
        config = with_settings(config, clients={"refusalBurst": UNDAMPED})
        with gateway(config) as running:
            yield running, workers[0]


@pytest.fixture
def pool(served):
    return served[0]


@pytest.mark.parametrize(
    ("field", "value"),
    [("vllm_xargs", [1]), ("vllm_xargs", "x"), ("vllm_xargs", 5), ("stream_options", 5)],
)
def test_a_malformed_field_is_a_400_naming_it_and_holds_nothing(pool, field, value):
    with client(pool, "light") as api:
        for _ in range(8):  # more than the tenant's concurrency and the pool's slots
            refused = api.post("/v1/completions", json=completion("hi", **{field: value}))
            assert refused.status_code == 400
            assert refused.json()["error"]["param"].startswith(field)
        assert api.post("/v1/completions", json=completion("hi")).status_code == 200
    wait_until(lambda: nothing_in_flight(pool), what="every ledger back to zero")


def test_without_a_key_the_body_is_never_read(pool):
    """Headers announcing 4 MB and no key: the 401 comes without a byte of the body."""
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4000000\r\n\r\n"
    )
    assert status_of(raw_exchange(pool.url, head)) == 401


def test_a_body_that_never_completes_is_a_408_and_a_slow_header_is_cut():
    with engines(1, speedup=500.0) as workers:
        config = with_settings(
            gateway_config([w.url for w in workers], [tenant_entry("light")]),
            clients={"bodyTimeout": 0.3, "headerTimeout": 0.3},
        )
        with gateway(config) as running:
            head = (
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + KEYS["light"].encode() + b"\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model":'
            )
            assert status_of(raw_exchange(running.url, head)) == 408
            # Headers that never end: the gateway closes the connection, answering nothing.
            assert raw_exchange(running.url, b"POST /v1/completions HTTP/1.1\r\nHost: x") == b""


def test_connections_beyond_the_cap_are_reset_on_arrival():
    with engines(1, speedup=500.0) as workers:
        config = with_settings(
            gateway_config([w.url for w in workers], [tenant_entry("light")]),
            clients={"maxConnections": 3},
        )
        with gateway(config) as running:
            host, port = running.url.removeprefix("http://").split(":")
            held = [socket.create_connection((host, int(port))) for _ in range(3)]
            try:
                wait_until(lambda: running.gateway.connections.tenant.open == 3)
                request = (
                    b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                    b"Authorization: Bearer " + KEYS["light"].encode() + b"\r\n\r\n"
                )
                assert raw_exchange(running.url, request) == b""  # reset, nothing read
                assert running.gateway.connections.tenant.refused["total"] == 1
            finally:
                for connection in held:
                    connection.close()
            with client(running, "light") as api:
                wait_until(lambda: api.get("/v1/models").status_code == 200)


def test_parse_amplification_is_refused_early_and_costs_little(pool):
    """A 4 MB body of tiny messages: refused before the request model sees it, having
    allocated a small part of what parsing it whole would."""
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": ""}] * 110_000}
    ).encode()
    tracemalloc.start()
    try:
        with client(pool, "light") as api:
            refused = api.post(
                "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.status_code == 400
    assert "The body has more than 200000 strings" in refused.json()["error"]["message"]
    assert peak < 40 * 2**20  # the body, and 20,000 small dicts at most


def test_too_many_messages_and_too_much_asked_are_400s_naming_the_field(pool):
    with client(pool, "light") as api:
        many = [{"role": "user", "content": "x"}] * 4097
        cases = [
            ("/v1/chat/completions", {"model": MODEL, "messages": many}, "messages"),
            ("/v1/completions", completion("x", n=1000), "n"),
            ("/v1/completions", completion("x", best_of=9), "best_of"),
            ("/v1/completions", completion("x", logprobs=100), "logprobs"),
        ]
        for path, body, field in cases:
            refused = api.post(path, json=body)
            assert refused.status_code == 400, (field, refused.text)
            assert refused.json()["error"]["param"] == field


def test_deep_nesting_huge_numbers_and_lone_surrogates_are_400s(pool):
    with client(pool, "light") as api:
        deep = b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "x": ' + b"[" * 5000
        deep += b"]" * 5000 + b"}"
        huge = b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "n": 1' + b"0" * 5000 + b"}"
        surrogate = b'{"model": "' + MODEL.encode() + b'", "prompt": "x\\ud800y"}'
        for body in (deep, huge, surrogate):
            answer = api.post(
                "/v1/completions", content=body, headers={"content-type": "application/json"}
            )
            assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "prompt"
    workers = pool_state(pool)["workers"]
    assert all(worker["healthy"] for worker in workers.values())  # nobody blamed a worker


def test_unread_streams_release_their_workers_when_the_engine_is_done():
    """A tenant that opens streams and never reads them: the engine finishes them, the
    requests settle (charged the engine's whole answers) and the slots free for everyone
    else, while the answers wait in the gateway for clients that may never read them
    (until `clients.writeTimeout`: tests/test_gateway_relay.py)."""
    with engines(1, speedup=1000.0) as workers:
        config = with_settings(
            gateway_config(
                [w.url for w in workers],
                [tenant_entry("flood"), tenant_entry("light")],
                routing={"saturation": {"maxOutstanding": 2}},
            ),
            clients={"writeTimeout": 600},  # longer than the test: nothing is cut
        )
        with gateway(config) as running:
            host, port = running.url.removeprefix("http://").split(":")
            body = json.dumps(completion("tell me everything", max_tokens=3000, stream=True))
            request = (
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                f"{KEYS['flood']}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
            stalled = []
            for _ in range(2):  # both slots, never read
                connection = socket.create_connection((host, int(port)))
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                connection.sendall(request)
                stalled.append(connection)
            try:
                wait_until(lambda: nothing_in_flight(running), what="the engine done, slots free")
                with client(running, "light") as api:
                    assert api.post("/v1/completions", json=completion("hi")).status_code == 200
                completion_tokens = gateway_metric(
                    running, "fairpool_gateway_tokens_total", tenant="flood", kind="completion"
                )
                assert completion_tokens == 2 * 3000  # charged the engine's whole answers
            finally:
                for connection in stalled:
                    connection.close()


def test_a_pool_without_workers_fails_alone():
    with engines(1, speedup=500.0) as workers:
        document = gateway_config([w.url for w in workers], [tenant_entry("light")]).model_dump(
            by_alias=True
        )
        empty = {**document["pools"][0], "name": "empty", "model": "nowhere"}
        empty["workers"] = {"urls": ["http://127.0.0.1:9"]}  # nothing listens there
        document["pools"].append(empty)
        config = GatewayConfig.model_validate(document)
        with GatewayThread(config) as running:
            wait_until(lambda: httpx.get(f"{running.url}/readyz").status_code == 200)
            with client(running, "light") as api:
                wait_until(lambda: api.post("/v1/completions", json=completion("x")).is_success)
                refused = api.post("/v1/completions", json={**completion("x"), "model": "nowhere"})
            assert refused.status_code == 503
            assert "no model server in rotation" in refused.json()["error"]["message"]


# ---------------------------------------------------------------------- medium


def test_a_long_non_streamed_answer_is_not_a_worker_failure():
    """firstByte bounds the start of a stream only; a non-streamed answer has `total`."""
    with engines(1, speedup=20.0) as workers:
        config = with_settings(
            gateway_config([w.url for w in workers], [tenant_entry("light")]),
            timeouts={"firstByte": 0.05, "total": 120},
        )
        with gateway(config) as running, client(running, "light") as api:
            answer = api.post("/v1/completions", json=completion("slowly", max_tokens=200))
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 200
            assert gateway_metric(running, "fairpool_gateway_retries_total") == 0


def test_tokens_per_minute_reserve_the_output_a_request_may_produce():
    """Requests without max_tokens, in a pool whose model has a 2,048-token context, each
    reserve what the context leaves: of a burst from a 3,000-TPM tenant, one is admitted
    and the rest refused while it runs (the engine is held, so none ends meanwhile)."""
    with engines(1, speedup=500.0, max_model_len=2048) as workers:
        config = gateway_config(
            [w.url for w in workers],
            [tenant_entry("light", limits={"tokensPerMinute": 3000})],
            maxModelLen=2048,
        )
        with gateway(config) as running, client(running, "light") as api:
            statuses: list[int] = []

            def send() -> None:
                body = {"model": MODEL, "prompt": "count to a thousand"}
                statuses.append(api.post("/v1/completions", json=body).status_code)

            threads = [threading.Thread(target=send) for _ in range(8)]
            with held(*workers):
                for thread in threads:
                    thread.start()
                wait_until(lambda: statuses.count(429) == 7, what="7 of 8 refused")
            for thread in threads:
                thread.join()
            assert statuses.count(200) == 1
            tokens = httpx.get(f"{running.admin_url}/admin/tenants/light").json()["usage"]
            assert tokens["tokens"] <= 3000  # the window holds what was served, then


@pytest.mark.parametrize(("stream", "charged"), [(False, 1500), (True, 0)])
def test_a_client_that_leaves_before_any_answer_is_charged_what_it_could_have_cost(
    served, stream, charged
):
    """Non-streamed, the gateway cannot see what the engine produced before it aborted:
    the request is charged its whole output reservation. A stream that had not started
    produced nothing the gateway relayed, and is charged no output."""
    pool, engine = served

    def completion_tokens() -> float:
        return gateway_metric(
            pool, "fairpool_gateway_tokens_total", tenant="other", kind="completion"
        )

    before = completion_tokens()

    async def leave_once_the_engine_has_it() -> None:
        async with httpx.AsyncClient(
            base_url=pool.url, headers={"Authorization": f"Bearer {KEYS['other']}"}
        ) as api:
            body = completion("a long story", max_tokens=1500, stream=stream)
            asking = asyncio.create_task(api.post("/v1/completions", json=body))
            await eventually(lambda: engine.sim.runner.in_flight == 1, what="the engine has it")
            asking.cancel()  # the client leaves before any answer
            with contextlib.suppress(asyncio.CancelledError):
                await asking

    # Held until the gateway has withdrawn the request from the engine: the engine has
    # not answered when the client leaves, and cannot start before the abort reaches it.
    with held(engine):
        asyncio.run(leave_once_the_engine_has_it())
        wait_until(lambda: engine.sim.runner.in_flight == 0)
    wait_until(lambda: nothing_in_flight(pool))
    assert completion_tokens() - before == charged


def test_tenants_do_not_share_cached_prefixes_unless_the_pool_says_so():
    document = "Confidential board minutes of the harbour authority. " * 40
    for share, expected_hit in ((False, False), (True, True)):
        with engines(1, speedup=500.0) as workers:
            config = gateway_config(
                [w.url for w in workers],
                [tenant_entry("light"), tenant_entry("other")],
                routing={"shareCacheAcrossTenants": share},
            )
            with gateway(config) as running:
                with client(running, "light") as api:
                    api.post("/v1/completions", json=completion(document, max_tokens=1))
                with client(running, "other") as api:
                    guess = api.post("/v1/completions", json=completion(document, max_tokens=1))
                cached = guess.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                assert (cached > 0) is expected_hit


# ---------------------------------------------------------------------- lower


def test_a_request_id_in_flight_twice_is_served_twice(pool):
    answers: list[int] = []

    def send() -> None:
        with client(pool, "other") as api:
            body = completion("same id", max_tokens=50)
            answers.append(
                api.post("/v1/completions", json=body, headers={"x-request-id": "same"}).status_code
            )

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [200] * 4
