"""One client must not take the gateway from everyone: the second security review's
findings, each against a real gateway and `fairpool engine-sim` on loopback. Every test
here fails on the gateway as it was before the fixes (`docs/gateway.md`, "What one client
may cost").

Clients come from several loopback addresses (127.0.0.2, 127.0.0.3, ...: the whole of
127/8 reaches the gateway on Linux), so that "one address" and "everyone else" are
different clients, as they are in production. Waits are bounded by tests/polling.py's
deadline or by socket timeouts far above the settings under test: they bound a hang, they
are never the assertion.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fuzz_clients import stream_cuts, with_settings
from gateway_helpers import (
    KEYS,
    MODEL,
    client,
    completion,
    engines,
    gateway,
    gateway_config,
    tenant_entry,
)
from polling import DEADLINE, wait_until

from fairpool_gateway.server import GatewayThread

pytestmark = pytest.mark.loopback

SOCKET_DEADLINE = 30.0


def connect_from(address: str, url: str, receive_buffer: int | None = None) -> socket.socket:
    """A connection to the gateway from `address` (a loopback address of its own); one the
    gateway resets on arrival may be reset before `connect` returns."""
    host, port = url.removeprefix("http://").split(":")
    connection = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    connection.bind((address, 0))
    connection.settimeout(SOCKET_DEADLINE)
    with contextlib.suppress(ConnectionResetError):
        connection.connect((host, int(port)))
    return connection


def read_until_closed(connection: socket.socket) -> tuple[bytes, str]:
    """What arrives until the gateway ends the connection, and how: "reset" or "closed"."""
    received = b""
    while True:
        try:
            chunk = connection.recv(65536)
        except ConnectionResetError:
            return received, "reset"
        if not chunk:
            return received, "closed"
        received += chunk


def post(
    path: str, body: dict[str, Any], tenant: str = "light", length: int | None = None
) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {KEYS[tenant]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length or len(data)}\r\n\r\n"
    ).encode()
    return head + data


@contextlib.contextmanager
def pool(**clients: Any) -> Iterator[GatewayThread]:
    tenants = [tenant_entry("light"), tenant_entry("flood"), tenant_entry("other")]
    with engines(1, speedup=1000.0) as workers:
        config = with_settings(gateway_config([w.url for w in workers], tenants), clients=clients)
        with gateway(config) as running:
            yield running


# ---------------------------------------------------------------------- connections


def test_one_address_holds_its_share_and_the_probes_answer_whatever_tenants_hold():
    with pool(
        maxConnections=40, maxConnectionsPerClient=10, idleTimeout=120, headerTimeout=120
    ) as running:
        budget = running.gateway.connections.tenant
        idle = [connect_from("127.0.0.2", running.url) for _ in range(60)]
        wait_until(lambda: budget.refused["per_client"], lambda n: n == 50, what="50 reset")
        assert budget.by_client["127.0.0.2"] == 10
        with client(running, "other") as api:  # from 127.0.0.1: another client
            assert api.post("/v1/completions", json=completion("hello")).status_code == 200
        wait_until(lambda: budget.open, lambda n: n == 10, what="the client's connection closed")

        # Every tenant connection taken, from many addresses: the admin port still answers.
        idle += [connect_from(f"127.0.0.{n}", running.url) for n in (3, 4, 5) for _ in range(10)]
        wait_until(lambda: budget.open, lambda n: n == 40, what="the tenant port full")
        for path in ("/healthz", "/readyz", "/metrics"):
            assert httpx.get(f"{running.admin_url}{path}").status_code == 200
        answer, _ = read_until_closed(connect_from("127.0.0.6", running.url))
        assert answer == b"" and budget.refused["total"] == 1  # reset on arrival
        for connection in idle:
            connection.close()
        wait_until(lambda: budget.open, lambda n: n == 0, what="every connection given back")


def test_a_connection_that_sends_nothing_is_reset_after_the_idle_timeout():
    with pool(idleTimeout=0.2, headerTimeout=30) as running:
        silent = connect_from("127.0.0.2", running.url)
        assert read_until_closed(silent) == (b"", "reset")
        wait_until(lambda: running.gateway.connections.tenant.open, lambda n: n == 0)


def test_a_reader_that_stops_is_reset_and_its_connection_given_back():
    # A small send buffer, as in the fuzz tier: the stall reaches the gateway soon.
    with pool(writeTimeout=0.5, sendBufferBytes=16384) as running, stream_cuts() as cuts:
        stalled = connect_from("127.0.0.2", running.url, receive_buffer=4096)
        body = completion("tell me a long story", 3000, stream=True)
        stalled.sendall(post("/v1/completions", body))
        wait_until(lambda: cuts.request_ids, lambda ids: len(ids) == 1, what="the cut")
        wait_until(
            lambda: running.gateway.connections.tenant.by_client["127.0.0.2"],
            lambda n: n == 0,
            what="the stalled socket given back",
        )
        _, how = read_until_closed(stalled)
        assert how == "reset"  # closing would have waited to flush to a reader that reads not
        wait_until(lambda: running.gateway.bytes_in_flight.total, lambda n: n == 0)


# ---------------------------------------------------------------------- bytes in flight


def test_half_sent_bodies_of_one_tenant_hold_at_most_its_budget():
    with pool(maxTenantBytesInFlight=1 << 20) as running:
        held = running.gateway.bytes_in_flight
        length = 400_000  # declared; each sends a kilobyte and stops
        senders = []
        answers = []
        for _ in range(10):
            connection = connect_from("127.0.0.2", running.url)
            start = post("/v1/completions", completion("x"), "flood", length)[:-20]
            connection.sendall(start + b" " * 1000)
            senders.append(connection)
        wait_until(lambda: held.refused["tenant"], lambda n: n == 8, what="8 refused")
        assert held.held_by("flood") == 2 * length
        for connection in senders[2:]:
            answer, _ = read_until_closed(connection)
            answers.append(answer)
        assert all(answer.startswith(b"HTTP/1.1 429") for answer in answers)
        assert all(b'"code":"bytes_in_flight"' in answer for answer in answers)
        with client(running, "other") as api:  # another tenant is served meanwhile
            assert api.post("/v1/completions", json=completion("hi")).status_code == 200
        for connection in senders:
            connection.close()
        wait_until(lambda: held.total, lambda n: n == 0, what="every byte given back")


def test_one_key_holds_at_most_its_open_requests_whatever_its_addresses():
    with pool(maxTenantRequests=2) as running:
        head = post("/v1/completions", completion("x"), "flood", 1000)
        holding = [connect_from(f"127.0.0.{n}", running.url) for n in (2, 3)]
        for connection in holding:
            connection.sendall(head[:-10])  # the body never ends
        wait_until(lambda: running.gateway.bytes_in_flight.requests.get("flood", 0) == 2)
        third = connect_from("127.0.0.4", running.url)
        third.sendall(head)
        answer, _ = read_until_closed(third)
        assert answer.startswith(b"HTTP/1.1 429") and b"too_many_open_requests" in answer
        with client(running, "other") as api:
            assert api.post("/v1/completions", json=completion("hi")).status_code == 200
        for connection in holding:
            connection.close()
        wait_until(lambda: running.gateway.bytes_in_flight.requests, lambda open_: not open_)


def test_a_chunked_body_counts_from_its_first_byte():
    with pool(maxTenantBytesInFlight=1 << 16) as running:
        connection = connect_from("127.0.0.2", running.url)
        connection.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer "
            + KEYS["flood"].encode()
            + b"\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
        )
        piece = b"a" * 8192
        answer = b""
        for _ in range(20):  # 160 KB, over the 64 KB budget
            try:
                connection.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            except (BrokenPipeError, ConnectionResetError):
                break
        answer, _ = read_until_closed(connection)
        assert answer.startswith(b"HTTP/1.1 429") and b"bytes_in_flight" in answer
        wait_until(lambda: running.gateway.bytes_in_flight.total, lambda n: n == 0)


# ---------------------------------------------------------------------- answers


def test_an_embeddings_answer_over_the_cap_is_a_502_naming_it():
    tenants = [tenant_entry("light")]
    with engines(1, speedup=1000.0, embedding_dim=4096) as workers:
        config = with_settings(
            gateway_config([w.url for w in workers], tenants), clients={"maxAnswerBytes": 1 << 20}
        )
        with gateway(config) as running, client(running, "light") as api:
            small = api.post("/v1/embeddings", json={"model": MODEL, "input": "one"})
            assert small.status_code == 200 and len(small.json()["data"][0]["embedding"]) == 4096
            large = api.post("/v1/embeddings", json={"model": MODEL, "input": ["x"] * 64})
            assert large.status_code == 502
            error = large.json()["error"]
            assert (
                error["code"] == "answer_too_large" and error["param"] == "clients.maxAnswerBytes"
            )
            assert "1048576" in error["message"]


# ---------------------------------------------------------------------- request ids


def test_request_ids_are_the_gateways_own_and_the_clients_only_echoed():
    with pool() as running:
        answers = []
        with client(running, "light") as light, client(running, "other") as other:
            for api in (light, other, light, other):
                answers.append(
                    api.post(
                        "/v1/completions",
                        json=completion("same id"),
                        headers={"x-request-id": "shared-id"},
                    )
                )
        assert [answer.status_code for answer in answers] == [200] * 4
        assert all(answer.headers["x-request-id"] == "shared-id" for answer in answers)
        ours = [answer.headers["x-fairpool-request-id"] for answer in answers]
        assert len(set(ours)) == 4 and "shared-id" not in ours
        # The engine knew each request by the gateway's id (vLLM's id is cmpl-<request id>).
        assert [answer.json()["id"] for answer in answers] == [f"cmpl-{rid}" for rid in ours]


# ---------------------------------------------------------------------- caps and estimates


def test_caps_hold_for_values_the_engine_coerces():
    with pool() as running, client(running, "light") as api:
        for value in (9.0, "100", " 9 "):
            refused = api.post("/v1/completions", json=completion("x", n=value))
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
        refused = api.post("/v1/completions", json=completion("x", prompt_logprobs=-1))
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "prompt_logprobs"
        assert api.post("/v1/completions", json=completion("x", n="1")).status_code == 200


def test_text_in_tools_counts_against_tokens_per_minute():
    limits = {"tokensPerMinute": 20_000}
    with engines(1, speedup=1000.0) as workers:
        config = gateway_config([w.url for w in workers], [tenant_entry("light", limits=limits)])
        with gateway(config) as running, client(running, "light") as api:
            tools = [{"type": "function", "function": {"name": "f", "description": "d" * 400_000}}]
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "tools": tools,
            }
            refused = api.post("/v1/chat/completions", json=body)
            assert refused.status_code == 429
            error = refused.json()["error"]
            assert error["code"] == "tokens_per_minute" and "on their own" in error["message"]


# ---------------------------------------------------------------------- refusal storms


def test_a_refusal_storm_is_held_back_and_its_connections_closed():
    limits = {"requestsPerMinute": 1}
    with engines(1, speedup=1000.0) as workers:
        config = gateway_config([w.url for w in workers], [tenant_entry("light", limits=limits)])
        with gateway(config) as running, client(running, "light") as api:
            running.gateway.refusals.clock = lambda: 0.0  # no refill: the burst alone
            answers = [api.post("/v1/completions", json=completion("x")) for _ in range(25)]
        statuses = [answer.status_code for answer in answers]
        assert statuses[0] == 200 and set(statuses[1:]) == {429}
        closed = [answer.headers.get("connection") == "close" for answer in answers[1:]]
        assert closed == [False] * 20 + [True] * 4  # past the burst: held back, closed
        assert running.gateway.refusals.damped == 4


def test_refusals_are_logged_sampled(caplog: pytest.LogCaptureFixture):
    with caplog.at_level("INFO", logger="fairpool.gateway"), pool() as running:
        running.gateway.ledger.refusal_log.clock = lambda: 0.0  # one second never ends
        wrong = {"Authorization": "Bearer not-a-key"}
        with httpx.Client(base_url=running.url, headers=wrong, timeout=DEADLINE) as anonymous:
            for _ in range(15):
                assert anonymous.post("/v1/completions", json=completion("x")).status_code == 401
        assert (
            running.gateway.metrics.rejections.labels(
                "unknown", "none", "invalid_api_key"
            )._value.get()
            == 15
        )
        lines = [r for r in caplog.records if r.getMessage() == "request refused"]
        assert len(lines) == 1 and lines[0].suppressed == 0  # the other 14 counted, not logged
