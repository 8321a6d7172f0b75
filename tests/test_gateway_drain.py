"""The gateway's drain on shutdown (SIGTERM in a pod: `GatewayThread.begin_shutdown` here):
readiness fails at once and new requests get 503 while the requests in flight go on; they
finish within the drain period, or are ended by the server at its end — a stream with an
SSE error event and `[DONE]`, a request not yet answered with a 503 — and the engine hears
the abort. Engines are held (`sim_http.held`) so that nothing here depends on timing."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from gateway_helpers import (
    KEYS,
    all_in_rotation,
    completion,
    engines,
    gateway_config,
    logging_kept,
    settlements,
    tenant_entry,
)
from polling import wait_until
from sim_http import held, sse_events

from fairpool.front import CLIENT_CLOSED, Outcome
from fairpool_gateway.drain import Drain
from fairpool_gateway.server import GatewayThread

pytestmark = pytest.mark.loopback

HEADERS = {"Authorization": f"Bearer {KEYS['light']}"}


class Call:
    """One request in a thread of its own: its status, headers and body once it ends, and
    whether its answer has started (headers received)."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.started = threading.Event()
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(url, body))
        self._thread.start()

    def _run(self, url: str, body: dict[str, Any]) -> None:
        try:
            with (
                httpx.Client(timeout=120) as client,
                client.stream("POST", f"{url}/v1/completions", json=body, headers=HEADERS) as r,
            ):
                self.started.set()
                r.read()
                self.response = r
        except BaseException as error:
            self.error = error
            self.started.set()

    def result(self) -> httpx.Response:
        self._thread.join(timeout=120)
        assert self.error is None, self.error
        assert self.response is not None
        return self.response


def start_gateway(config: Any) -> GatewayThread:
    running = GatewayThread(config).__enter__()
    wait_until(lambda: all_in_rotation(running, config), what="every worker in rotation")
    return running


def test_a_rollout_lets_streams_finish_and_refuses_new_requests():
    with engines(1) as (worker,):
        config = gateway_config([worker.url], [tenant_entry("light")])
        config = config.model_copy(update={"drain_seconds": 3600.0})  # never waited out here
        running = start_gateway(config)
        try:
            with settlements(running) as settled:
                with held(worker):
                    stream = Call(running.url, completion("a long story", 6, stream=True))
                    assert stream.started.wait(120)  # the engine answered: the stream is open
                    running.begin_shutdown()
                    wait_until(lambda: running.gateway.drain.draining, what="the drain started")
                    ready = httpx.get(f"{running.url}/readyz")
                    assert ready.status_code == 503 and "draining" in ready.json()["status"]
                    assert httpx.get(f"{running.url}/healthz").status_code == 200
                    refused = httpx.post(
                        f"{running.url}/v1/completions", json=completion("late"), headers=HEADERS
                    )
                    assert refused.status_code == 503
                    assert refused.json()["error"]["code"] == "shutting_down"
                    assert refused.headers["retry-after"] == "1"
                    assert refused.headers["connection"] == "close"
                    assert running.gateway.drain.in_flight == 1  # still streaming, not cut
                answer = stream.result()  # the engine goes on once released
                running.__exit__(None, None, None)  # returns once nothing is in flight
        finally:
            running.__exit__(None, None, None)
        events = sse_events(answer)
        assert answer.status_code == 200 and events[-1] == "[DONE]"
        assert not any(isinstance(e, dict) and "error" in e for e in events)
        assert sum(1 for e in events if isinstance(e, dict) and e.get("choices")) == 6
        assert running.gateway.drain.cut == 0 and running.gateway.drain.refused == 1
        assert [(r.status, r.completion_tokens) for r in settled.records] == [(200, 6)]


def test_at_the_end_of_the_drain_streams_get_an_error_event_and_done():
    with engines(1) as (worker,):
        config = gateway_config(
            [worker.url],
            [tenant_entry("light")],
            routing={"saturation": {"maxOutstanding": 1}, "queueTimeoutSeconds": 3600},
        )
        config = config.model_copy(update={"drain_seconds": 0.0})  # cut at once
        running = start_gateway(config)
        try:
            with settlements(running) as settled, held(worker):
                stream = Call(running.url, completion("cut short", 50, stream=True))
                assert stream.started.wait(120)
                queued = Call(running.url, completion("still queued", 4))
                front = running.gateway.pools["main"].front
                wait_until(front.queue.queued, lambda n: n == 1, what="the second request queued")
                running.begin_shutdown()
                answer, waiting = stream.result(), queued.result()
        finally:
            running.__exit__(None, None, None)
        events = sse_events(answer)
        assert answer.status_code == 200  # its headers were sent before the cut
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["code"] == "shutting_down"
        assert waiting.status_code == 503 and waiting.json()["error"]["code"] == "shutting_down"
        assert running.gateway.drain.cut == 2
        wait_until(lambda: worker.sim.runner.in_flight, lambda n: n == 0, what="engine aborted")
        assert len(settled.records) == 2


def test_requests_cut_by_the_drain_are_logged_with_the_503_the_client_got():
    with engines(1) as (worker,):
        config = gateway_config([worker.url], [tenant_entry("light")])
        config = config.model_copy(update={"drain_seconds": 0.0})
        running = start_gateway(config)
        try:
            with settlements(running) as settled, held(worker):
                stream = Call(running.url, completion("cut short", 50, stream=True))
                assert stream.started.wait(120)
                running.begin_shutdown()
                stream.result()
        finally:
            running.__exit__(None, None, None)
        assert [r.status for r in settled.records] == [503]


# ------------------------------------------------------------------ the drain on its own


def test_outcome_turns_a_cancellation_into_the_shutdown_only_while_cutting():
    drain = Drain()
    gone = Outcome(status=CLIENT_CLOSED, reason="client_closed")
    assert drain.outcome(gone) == gone
    drain._cutting = True
    assert drain.outcome(gone) == Outcome(status=503, reason="shutdown")
    for kept in (Outcome(status=200), Outcome(status=502, reason="upstream_failed")):
        assert drain.outcome(kept) == kept


def test_an_idle_drain_ends_at_once_and_a_forced_one_stops_waiting():
    async def run() -> None:
        drain = Drain()
        await asyncio.wait_for(drain.run(3600.0), 60)  # nothing in flight: nothing to wait for
        assert drain.draining and not drain.cutting

        busy = Drain()
        started = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            started.set()
            await asyncio.Event().wait()  # a request that never ends by itself

        sent: list[dict[str, Any]] = []

        async def send(message: Any) -> None:
            sent.append(message)

        async def receive() -> Any:
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {"type": "http", "path": "/v1/completions"}
        request = asyncio.ensure_future(busy.serve(app, scope, receive, send))
        await started.wait()
        await asyncio.wait_for(busy.run(3600.0, forced=lambda: True), 60)
        await asyncio.wait_for(request, 60)
        assert busy.cut == 1 and sent[0]["status"] == 503

    asyncio.run(run())


def test_the_drain_period_on_the_command_line_is_checked(tmp_path, capsys):
    from fairpool_cli.main import main

    path = tmp_path / "gateway.yaml"
    path.write_text("pools: []\n")
    with logging_kept():
        assert main(["gateway", "--config", str(path), "--drain-seconds", "-1"]) == 2
    assert "--drain-seconds: must be within 0 and 3600" in capsys.readouterr().err
