"""Forwarding a request to an engine, and reading what the engine served.

Upstream HTTP is aiohttp's client: its C parser and connection pool cost a fraction of
httpx's per streamed request, and the gateway spends most of its time here.

**Failures.** Only a worker that cannot be reached — no connection, or the connection
dropped before any answer — is a failing worker (`WorkerUnreachable`: out of rotation,
and the request is tried once elsewhere). Everything else is the request's own end: a
5xx the engine answered (`EngineError`), no answer within a timeout (`UpstreamTimeout`),
a stream cut mid-way. A worker that serves other requests stays in rotation; its health
checks decide whether it is dead.

**Streams** are read from the engine as fast as it sends (`StreamRelay`), into a bounded
buffer the client drains at its own pace. So the request stops holding its worker when
the engine has finished — its usage is known then, and the request is settled — however
slowly the client reads; a client that does not read at all is cut when its write stalls
(the response's job). The gateway needs the engine's usage (prompt, cached and completion
tokens) to charge the tenant exactly: chat and completions streams carry it only when
asked, so the gateway always asks for the final usage chunk
(`stream_options.include_usage`) and, when the client did not ask for it, drops that chunk
on the way back; a Responses API stream ends with its usage in `response.completed`.
Everything else is the engine's bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from fairpool.front import CLIENT_CLOSED, Outcome, Usage
from fairpool_gateway.protocol import StreamFormat

SSE_DONE = b"data: [DONE]\n\n"
_USAGE_ONLY = b'"choices":[]'
_USAGE_KEY = b'"usage":{'
_DECODER = json.JSONDecoder()
_TAIL = 8192  # bytes of a stream kept to find its usage chunk at the end
#: Bytes of a stream the gateway holds for a client that reads slower than the engine
#: writes; beyond, it stops reading the engine until the client catches up.
STREAM_BUFFER = 4 << 20


def parse_usage(document: Any) -> Usage | None:
    """The `usage` of an engine's answer, or None if it has none."""
    if not isinstance(document, dict):
        return None
    return usage_of(document.get("usage"))


def usage_of(usage: Any) -> Usage | None:
    """A usage object in either of OpenAI's shapes: chat, completions and embeddings
    (`prompt_tokens`, `prompt_tokens_details.cached_tokens`, `completion_tokens`), or the
    Responses API (`input_tokens`, `input_tokens_details.cached_tokens`, `output_tokens`)."""
    if not isinstance(usage, dict):
        return None
    responses = "input_tokens" in usage
    details = usage.get("input_tokens_details" if responses else "prompt_tokens_details") or {}
    try:
        return Usage(
            int(usage.get("input_tokens" if responses else "prompt_tokens") or 0),
            int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
            int(usage.get("output_tokens" if responses else "completion_tokens") or 0),
        )
    except (TypeError, ValueError):
        return None


class WorkerUnreachable(Exception):
    """The worker could not be reached, or dropped the connection before answering:
    nothing was served, so the request may go to another worker."""


class EngineError(Exception):
    """The engine answered this request with a 5xx (`status`, `detail`)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status} {detail}".strip())
        self.status = status
        self.detail = detail


class UpstreamTimeout(Exception):
    """No answer (or no next chunk) within the timeout."""


def upstream_session() -> aiohttp.ClientSession:
    """One pool of keep-alive connections to every worker (call inside the event loop)."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
    )


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    connect_timeout: float,
    answer_timeout: float,
    request_id: str,
) -> aiohttp.ClientResponse:
    """Open the request to the worker and wait for its answer's headers (at most
    `answer_timeout`). 4xx answers are the client's to see."""
    headers = {"content-type": "application/json", "x-request-id": request_id}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
    try:
        async with asyncio.timeout(answer_timeout):
            try:
                response = await session.post(url, data=body, headers=headers, timeout=timeout)
            except aiohttp.ServerDisconnectedError:
                # A kept-alive connection the engine had closed (as uvicorn does after a
                # 500) fails the first request sent on it; a new connection is the retry.
                response = await session.post(url, data=body, headers=headers, timeout=timeout)
    except TimeoutError:
        raise UpstreamTimeout(f"no answer within {answer_timeout:g} s") from None
    except aiohttp.ClientError as error:  # refused, reset, dropped before the headers
        raise WorkerUnreachable(f"{type(error).__name__}: {error}") from None
    if response.status >= 500:
        try:
            detail = (await response.read())[:300].decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError):
            detail = ""
        finally:
            response.close()
        raise EngineError(response.status, detail)
    return response


async def read_whole(
    response: aiohttp.ClientResponse, timeout: float
) -> tuple[bytes, Usage | None]:
    """A non-streamed answer and its usage; UpstreamTimeout or EngineError("cut") if it
    does not arrive whole."""
    try:
        async with asyncio.timeout(timeout):
            content = await response.read()
    except TimeoutError:
        raise UpstreamTimeout(f"the answer did not arrive within {timeout:g} s") from None
    except aiohttp.ClientError as error:
        raise EngineError(502, f"the answer was cut: {type(error).__name__}") from None
    finally:
        response.release()  # back to the pool if read whole; closed otherwise
    try:
        usage = parse_usage(json.loads(content))
    except ValueError:
        usage = None
    return content, usage


class StreamRelay:
    """Relays an SSE answer. A pump task reads the engine's stream into a bounded buffer
    as fast as it comes, and tells `on_end` how it ended (the engine's usage, or its
    failure) as soon as it has; `chunks()` gives the client what is buffered, at the
    client's pace. Output events (each about one token) go to `on_output` as they arrive."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        stream_format: StreamFormat,
        client_wants_usage: bool,
        idle_timeout: float,
        on_output: Callable[[int], None] | None = None,
        on_end: Callable[[Outcome], None] | None = None,
        buffer_bytes: int = STREAM_BUFFER,
    ) -> None:
        self.response = response
        self.format = stream_format
        # Usage chunks the gateway asked for and the client did not are dropped.
        self.drop_usage = stream_format.asks_for_usage and not client_wants_usage
        self.idle_timeout = idle_timeout
        self.on_output = on_output
        self.on_end = on_end
        self.buffer_bytes = buffer_bytes
        self.output_events = 0  # data events with output, about one token each
        self.usage: Usage | None = None
        self.error: str | None = None
        self.complete = False  # the engine's stream ended and was read whole
        self.first_byte_at: float | None = None
        self._tail = b""
        self._buffer: deque[bytes] = deque()
        self._buffered = 0
        self._arrived = asyncio.Event()  # a chunk was buffered, or the pump ended
        self._drained = asyncio.Event()  # the client took chunks: room in the buffer
        self._pump: asyncio.Task[None] | None = None
        self._ended = False

    def outcome(self) -> Outcome:
        """How the relayed request ended: a failed engine (502), a stream that ended before
        the engine's did (499: the client left or was cut), or answered (200); with the
        engine's usage when it sent it."""
        if self.error is not None:
            status, reason = 502, "upstream_failed"
        elif not self.complete:
            status, reason = CLIENT_CLOSED, "client_closed"
        else:
            status, reason = 200, None
        return Outcome(status, self.usage, self.first_byte_at, reason)

    def close(self) -> None:
        """Stop reading the engine: if its stream is not over, closing it makes the engine
        abort the request (also when `chunks` never started)."""
        if self._pump is not None:
            self._pump.cancel()
        if not self.complete:
            self.response.close()

    async def chunks(self, clock: Callable[[], float]) -> AsyncIterator[bytes]:
        """The stream for the client. The engine is read by a task of its own, so a slow
        client holds only this buffer, never the engine."""
        self._pump = asyncio.ensure_future(self._read_engine(clock))
        while True:
            while self._buffer:
                chunk = self._buffer.popleft()
                self._buffered -= len(chunk)
                self._drained.set()
                yield chunk
            if self._ended:
                return
            self._arrived.clear()
            await self._arrived.wait()

    async def _read_engine(self, clock: Callable[[], float]) -> None:
        content = self.response.content
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout):
                        chunk = await content.readany()
                except TimeoutError:
                    raise UpstreamTimeout(
                        f"no chunk within {self.idle_timeout:g} s of the last"
                    ) from None
                if not chunk:
                    break
                if self.first_byte_at is None:
                    self.first_byte_at = clock()
                self._count(chunk)
                if self.drop_usage and _USAGE_ONLY in chunk:
                    chunk = _without_usage_events(chunk)
                if chunk:
                    await self._hold(chunk)
            self.complete = True
        except (aiohttp.ClientError, UpstreamTimeout) as error:
            self.error = f"{type(error).__name__}: {error}"
            message = f"The model server failed mid-stream ({type(error).__name__})."
            self._put(_error_event(message))
            self._put(SSE_DONE)
        finally:
            if self.complete:
                self.response.release()  # back to the pool
            else:
                self.response.close()
            self.usage = _last_usage(self._tail)
            self._ended = True
            self._arrived.set()
            if self.on_end is not None and (self.complete or self.error is not None):
                with contextlib.suppress(Exception):
                    self.on_end(self.outcome())

    def _count(self, chunk: bytes) -> None:
        marker = self.format.output_event
        if marker is not None:
            events = chunk.count(marker)
        else:
            events = (
                chunk.count(b"data: ") - chunk.count(b"data: [DONE]") - chunk.count(_USAGE_ONLY)
            )
        if events > 0:
            self.output_events += events
            if self.on_output is not None:
                self.on_output(events)
        self._tail = (self._tail + chunk)[-_TAIL:]

    async def _hold(self, chunk: bytes) -> None:
        """Buffer a chunk, waiting while the buffer is full (the client reads slowly)."""
        while self._buffered >= self.buffer_bytes:
            self._drained.clear()
            await self._drained.wait()
        self._put(chunk)

    def _put(self, chunk: bytes) -> None:
        self._buffer.append(chunk)
        self._buffered += len(chunk)
        self._arrived.set()


def _without_usage_events(chunk: bytes) -> bytes:
    events = chunk.split(b"\n\n")
    kept = [event for event in events if _USAGE_ONLY not in event]
    return b"\n\n".join(kept)


def _last_usage(tail: bytes) -> Usage | None:
    """The last usage object in the end of a stream: a chat or completions usage chunk, or
    the usage inside a Responses API `response.completed` event (near its end)."""
    start = tail.rfind(_USAGE_KEY)
    if start < 0:
        return None
    text = tail[start + len(_USAGE_KEY) - 1 :].decode(errors="replace")
    try:
        usage, _ = _DECODER.raw_decode(text)
    except ValueError:
        return None
    return usage_of(usage)


def _error_event(message: str) -> bytes:
    error = {"error": {"message": message, "type": "server_error", "param": None, "code": 502}}
    return b"data: " + json.dumps(error).encode() + b"\n\n"
