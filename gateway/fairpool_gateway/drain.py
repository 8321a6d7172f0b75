"""Shutting down without cutting answers short: the gateway's drain.

On SIGTERM (a rollout, a scale-down) the server does not stop at once:

1. **Draining** (`Drain.draining`): `/readyz` answers 503 at once, so Kubernetes stops
   routing to the pod, and every new tenant request gets 503 (`code: shutting_down`,
   `Retry-After: 1`, `Connection: close`) while the sockets stay open; `/healthz` stays 200.
   Requests already in flight — queued, waiting for an engine, streaming — go on.
2. **Waiting**, up to `drainSeconds` (configuration, or `--drain-seconds`), for them to
   finish: the server exits as soon as none is left.
3. **Cutting** (`Drain.cutting`): whatever is still in flight then is ended by the server: a
   stream gets an SSE error event (`code: shutting_down`) and `data: [DONE]`, a request whose
   answer has not started gets a 503 with the same error; the request's task is cancelled,
   so the engine's connection is closed and the engine aborts it.

Only tenant requests are tracked; the admin API answers until the sockets close.

**The hook for the request path.** A request ended at step 3 sees a cancellation, exactly
like a client that disconnected, and would settle as 499. The request path passes the
outcome it settles a cancelled request with through `Drain.outcome`, which turns it into
503 `shutdown` when (and only when) the gateway is cutting — the status the client was
actually given — and returns any other outcome unchanged:

    exchange.settle(exchange.gateway.drain.outcome(relay.outcome()))
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fairpool.front import CLIENT_CLOSED, Outcome
from fairpool.runtime import wait_at_most

log = logging.getLogger("fairpool.gateway")

SHUTDOWN_STATUS = 503
SHUTDOWN_REASON = "shutdown"
SHUTDOWN_CODE = "shutting_down"
#: Paths that keep answering while draining (the kubelet's probes).
PROBES = frozenset({"/healthz", "/readyz"})
#: Seconds the requests cut at the end of the drain get to write their ending and unwind.
CUT_GRACE = 5.0
#: How often the wait looks whether the server was told to quit at once (a second Ctrl-C).
LOOK_INTERVAL = 0.1


@dataclass(eq=False)
class InFlight:
    """One tenant request the server is answering, as far as its ASGI messages tell."""

    task: asyncio.Task[object]
    started: bool = False  # http.response.start sent
    stream: bool = False  # an SSE answer (text/event-stream)
    complete: bool = False  # the last body message sent
    at_boundary: bool = True  # the bytes sent so far end between two SSE events
    cut: bool = False  # the server ends it (the drain period is over)
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class Drain:
    """The gateway's shutdown, shared by the server (which runs it) and the request path
    (which reads `draining`/`cutting` and settles through `outcome`)."""

    def __init__(self) -> None:
        self._draining = False
        self._cutting = False
        self._in_flight: set[InFlight] = set()
        self._idle = asyncio.Event()  # no tenant request in flight (bound to a loop lazily)
        self._idle.set()
        self.refused = 0  # requests answered 503 because the gateway was draining
        self.cut = 0  # requests the server ended at the end of the drain period

    @property
    def draining(self) -> bool:
        """True from the start of the shutdown on: refuse new work, report not ready."""
        return self._draining

    @property
    def cutting(self) -> bool:
        """True once the drain period is over: the requests still in flight are being ended
        by the server."""
        return self._cutting

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def outcome(self, outcome: Outcome) -> Outcome:
        """The outcome to settle a cancelled request with: while cutting, a cancellation is
        the server's, and the client got a 503; otherwise `outcome` as it is."""
        if self._cutting and outcome.status == CLIENT_CLOSED:
            return replace(outcome, status=SHUTDOWN_STATUS, reason=SHUTDOWN_REASON)
        return outcome

    # ------------------------------------------------------------------ the server's side

    async def run(self, seconds: float, forced: Callable[[], bool] = lambda: False) -> None:
        """Drain: refuse new requests, wait up to `seconds` for those in flight, end the
        rest. Returns early when `forced()` turns true (the server is told to quit now)."""
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        if self._in_flight:
            log.info(
                "draining: waiting up to %g s for %d requests in flight",
                seconds,
                len(self._in_flight),
            )
        while self._in_flight and not forced():
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await wait_at_most(self._idle, min(remaining, LOOK_INTERVAL))
        if not self._in_flight:
            return
        self._cutting = True
        log.warning("drain period over: ending %d requests still in flight", len(self._in_flight))
        for flight in list(self._in_flight):
            flight.cut = True
            self.cut += 1
            flight.task.cancel()
        await wait_at_most(self._idle, CUT_GRACE)
        if self._in_flight:
            log.error("%d requests did not end after being cut", len(self._in_flight))

    async def serve(
        self,
        app: ASGIApp,
        scope: Scope,
        receive: Receive,
        send: Send,
        on_refused: Callable[[Scope], None] | None = None,
    ) -> None:
        """Serve one tenant-API HTTP request through `app`, as the drain allows
        (`on_refused` hears of each request refused because the gateway is draining)."""
        path = scope.get("path", "")
        if path in PROBES:
            if path == "/readyz" and self._draining:
                await _answer(send, 503, {"status": "draining: the gateway is shutting down"})
                return
            await app(scope, receive, send)
            return
        if self._draining:
            self.refused += 1
            if on_refused is not None:
                on_refused(scope)
            await _answer(send, SHUTDOWN_STATUS, _error("The gateway is shutting down."))
            return
        task = asyncio.current_task()
        assert task is not None
        flight = InFlight(task)
        self._in_flight.add(flight)
        self._idle.clear()

        async def tracked(message: Message) -> None:
            if flight.cut:  # the server ends this answer itself
                return
            _observe(flight, message)
            await send(message)

        try:
            try:
                await app(scope, receive, tracked)
            except asyncio.CancelledError:
                if not flight.cut:
                    raise
                task.uncancel()  # the drain's own cancellation: the request unwound
            if flight.cut and not flight.complete:
                await _end(flight, send)
        finally:
            self._in_flight.discard(flight)
            if not self._in_flight:
                self._idle.set()


def _observe(flight: InFlight, message: Message) -> None:
    if message["type"] == "http.response.start":
        flight.started = True
        flight.headers = list(message.get("headers", []))
        content_type = dict(flight.headers).get(b"content-type", b"")
        flight.stream = content_type.startswith(b"text/event-stream")
    elif message["type"] == "http.response.body":
        body = message.get("body", b"")
        if body:
            flight.at_boundary = body.endswith((b"\n\n", b"\r\n\r\n"))
        if not message.get("more_body", False):
            flight.complete = True


async def _end(flight: InFlight, send: Send) -> None:
    """End a request the drain cut: a 503 if its answer had not started, an SSE error event
    and [DONE] if it is a stream; another answer cut half-way is left to the connection's
    close."""
    try:
        if not flight.started:
            await _answer(send, SHUTDOWN_STATUS, _error("The gateway shut down first."))
        elif flight.stream:
            error = _error("The gateway shut down before the answer ended.")
            ending = b"" if flight.at_boundary else b"\n\n"  # close a partial event first
            ending += b"data: " + json.dumps(error).encode() + b"\n\n" + b"data: [DONE]\n\n"
            await send({"type": "http.response.body", "body": ending, "more_body": False})
    except Exception as error:  # the client may be gone as well
        log.debug("could not end a request cut by the drain: %s", error)


def _error(message: str) -> dict[str, object]:
    return {
        "error": {"message": message, "type": "server_error", "param": None, "code": SHUTDOWN_CODE}
    }


async def _answer(send: Send, status: int, document: dict[str, object]) -> None:
    body = json.dumps(document).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the client's next request goes to another replica
    ]
    if status == SHUTDOWN_STATUS:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
