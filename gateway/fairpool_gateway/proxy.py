"""Forwarding a request to an engine, and reading what the engine served.

Upstream HTTP is aiohttp's client: its C parser and connection pool cost a fraction of
httpx's per streamed request, and the gateway spends most of its time here.

**Failures.** Only a worker that cannot be reached — no connection, or the connection
dropped before any answer — is a failing worker (`WorkerUnreachable`: out of rotation,
and the request is tried once elsewhere). Everything else is the request's own end: a
5xx the engine answered (`EngineError`), no answer within a timeout (`UpstreamTimeout`),
a stream cut mid-way. A worker that serves other requests stays in rotation; its health
checks decide whether it is dead.

**Answers** are relayed as they arrive, never read whole: a pump reads the engine as fast
as it sends into a bounded buffer that the client drains at its own pace (`Relay`), and
whatever the buffer holds counts in the request's bytes in flight
(`fairpool_gateway.budget`). So the request stops holding its worker when the engine has
finished — its usage is known then, and the request is settled — however slowly the client
reads; a client that does not read at all is cut when its write stalls (the response's
job); and an answer of any size costs the gateway its buffer, not its size. An answer
that is not streamed may be at most `clients.maxAnswerBytes` (`AnswerTooLarge`): a 17 KB
embeddings request can ask for a 180 MB answer.

**Usage** is read from the bytes as they pass (`UsageScanner`): the last `"usage":{...}`
object of the answer, wherever it is (vLLM writes `prompt_logprobs` after it). The
gateway needs the engine's usage (prompt, cached and completion tokens) to charge the
tenant exactly: chat and completions streams carry it only when asked, so the gateway
always asks for the final usage chunk (`stream_options.include_usage`) and, when the
client did not ask for it, drops that chunk on the way back; a Responses API stream ends
with its usage in `response.completed`. Everything else is the engine's bytes.
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
from fairpool_gateway.budget import Holding
from fairpool_gateway.protocol import StreamFormat

SSE_DONE = b"data: [DONE]\n\n"
_USAGE_ONLY = b'"choices":[]'
_USAGE_KEY = b'"usage":{'
_DECODER = json.JSONDecoder()
#: Bytes of a stream the gateway holds for a client that reads slower than the engine
#: writes; beyond, it stops reading the engine until the client catches up.
STREAM_BUFFER = 4 << 20


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


class AnswerTooLarge(Exception):
    """An answer over `clients.maxAnswerBytes`."""

    def __init__(self, size: int | None, cap: int) -> None:
        said = f"{size} bytes" if size is not None else f"more than {cap} bytes"
        super().__init__(f"the answer is {said}, over clients.maxAnswerBytes ({cap})")


#: The most bytes of one usage object the scanner waits for before giving up on it.
_USAGE_MAX = 4096


class UsageScanner:
    """The last `"usage":{...}` object in a byte stream, found as the bytes pass, whatever
    their size. The marker cannot occur inside a JSON string (its quotes would be escaped),
    so every one found starts a usage object."""

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self._pending: bytes | None = None  # from the last marker, until its object ends
        self._carry = b""  # the end of the bytes so far: a marker split between chunks

    def feed(self, chunk: bytes) -> None:
        data = (self._carry if self._pending is None else self._pending) + chunk
        at = data.rfind(_USAGE_KEY)
        if at >= 0:
            self._pending = data[at : at + _USAGE_MAX]
        elif self._pending is not None:
            self._pending = data[:_USAGE_MAX]
        if self._pending is not None:
            self._decode()
        self._carry = data[-(len(_USAGE_KEY) - 1) :]

    def _decode(self) -> None:
        assert self._pending is not None
        text = self._pending[len(_USAGE_KEY) - 1 :].decode(errors="replace")
        try:
            usage, _ = _DECODER.raw_decode(text)
        except ValueError:  # not whole yet, or not an object after all
            if len(self._pending) >= _USAGE_MAX:
                self._pending = None
            return
        self._pending = None
        found = usage_of(usage)
        if found is not None:
            self.usage = found


class Relay:
    """Relays an engine's answer (module docstring): a pump task reads the engine into a
    bounded buffer as fast as it comes and tells `on_end` how it ended (the engine's usage,
    or its failure) as soon as it has; `chunks()` gives the client what is buffered, at the
    client's pace. The buffer's bytes are held in `holding` (the request's bytes in flight)
    while buffered. Subclasses say what a chunk carries (`_inspect`) and what a failure
    leaves the client (`_failed`)."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        idle_timeout: float,
        on_end: Callable[[Outcome], None] | None = None,
        buffer_bytes: int = STREAM_BUFFER,
        holding: Holding | None = None,
    ) -> None:
        self.response = response
        self.idle_timeout = idle_timeout
        self.on_end = on_end
        self.buffer_bytes = buffer_bytes
        self.holding = holding
        self.usage_scanner = UsageScanner()
        self.error: str | None = None
        self.complete = False  # the engine's answer ended and was read whole
        self.first_byte_at: float | None = None
        self._buffer: deque[bytes] = deque()
        self._buffered = 0
        self._arrived = asyncio.Event()  # a chunk was buffered, or the pump ended
        self._drained = asyncio.Event()  # the client took chunks: room in the buffer
        self._pump: asyncio.Task[None] | None = None
        self._ended = False

    @property
    def usage(self) -> Usage | None:
        return self.usage_scanner.usage

    def outcome(self) -> Outcome:
        """How the relayed request ended: a failed engine (502), an answer that ended before
        the engine's did (499: the client left or was cut), or answered (the engine's
        status); with the engine's usage when it sent it."""
        if self.error is not None:
            return Outcome(502, self.usage, self.first_byte_at, "upstream_failed")
        if not self.complete:
            return self._unfinished()
        return Outcome(self.response.status, self.usage, self.first_byte_at, None)

    def _unfinished(self) -> Outcome:
        return Outcome(CLIENT_CLOSED, self.usage, self.first_byte_at, "client_closed")

    def close(self) -> None:
        """Stop reading the engine: if its answer is not over, closing it makes the engine
        abort the request (also when `chunks` never started); and give back what the
        buffer held."""
        if self._pump is not None:
            self._pump.cancel()
        if not self.complete:
            self.response.close()
        if self.holding is not None:
            self.holding.give_back(self._buffered)
        self._buffer.clear()
        self._buffered = 0

    async def chunks(self, clock: Callable[[], float]) -> AsyncIterator[bytes]:
        """The answer for the client. The engine is read by a task of its own, so a slow
        client holds only this buffer, never the engine."""
        self._pump = asyncio.ensure_future(self._read_engine(clock))
        while True:
            while self._buffer:
                chunk = self._buffer.popleft()
                self._buffered -= len(chunk)
                if self.holding is not None:
                    self.holding.give_back(len(chunk))
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
                self.usage_scanner.feed(chunk)
                chunk = self._inspect(chunk)
                if chunk:
                    await self._hold(chunk)
            self.complete = True
        except (aiohttp.ClientError, UpstreamTimeout, AnswerTooLarge) as error:
            self.error = str(error) if isinstance(error, AnswerTooLarge) else describe(error)
            for chunk in self._failed(error):
                self._put(chunk)
        finally:
            if self.complete:
                self.response.release()  # back to the pool
            else:
                self.response.close()
            self._ended = True
            self._arrived.set()
            if self.on_end is not None and (self.complete or self.error is not None):
                with contextlib.suppress(Exception):
                    self.on_end(self.outcome())

    def _inspect(self, chunk: bytes) -> bytes:
        """Override: what of `chunk` goes to the client (it has been scanned for usage)."""
        return chunk

    def _failed(self, error: Exception) -> list[bytes]:
        """Override: what the client is sent when the engine's answer fails midway."""
        return []

    async def _hold(self, chunk: bytes) -> None:
        """Buffer a chunk, waiting while the buffer is full (the client reads slowly) or the
        bytes in flight have no room for it."""
        while self._buffered >= self.buffer_bytes:
            self._drained.clear()
            await self._drained.wait()
        if self.holding is not None:
            await self.holding.take_when_room(len(chunk))
        self._put(chunk)

    def _put(self, chunk: bytes) -> None:
        self._buffer.append(chunk)
        self._buffered += len(chunk)
        self._arrived.set()


class StreamRelay(Relay):
    """An SSE answer: output events (each about one token) go to `on_output` as they
    arrive; usage chunks the gateway asked for and the client did not are dropped; a
    failure midway ends the stream with an SSE error event and `[DONE]`."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        stream_format: StreamFormat,
        client_wants_usage: bool,
        idle_timeout: float,
        on_output: Callable[[int], None] | None = None,
        on_end: Callable[[Outcome], None] | None = None,
        buffer_bytes: int = STREAM_BUFFER,
        holding: Holding | None = None,
    ) -> None:
        super().__init__(response, idle_timeout, on_end, buffer_bytes, holding)
        self.format = stream_format
        self.drop_usage = stream_format.asks_for_usage and not client_wants_usage
        self.on_output = on_output
        self.output_events = 0  # data events with output, about one token each

    def _inspect(self, chunk: bytes) -> bytes:
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
        if self.drop_usage and _USAGE_ONLY in chunk:
            chunk = _without_usage_events(chunk)
        return chunk

    def _failed(self, error: Exception) -> list[bytes]:
        message = f"The model server failed mid-stream ({type(error).__name__})."
        return [_error_event(message), SSE_DONE]


class WholeRelay(Relay):
    """An answer that is not streamed, relayed as it arrives: at most `cap` bytes (an
    engine that sends more fails the answer), and, if the client leaves before it has it
    all, charged `reserved_output` tokens of output (what the engine may have produced:
    the gateway cannot see it, and charging less would let a tenant slip past its limits
    by hanging up)."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        idle_timeout: float,
        cap: int,
        reserved_output: int,
        on_end: Callable[[Outcome], None] | None = None,
        holding: Holding | None = None,
    ) -> None:
        super().__init__(response, idle_timeout, on_end, STREAM_BUFFER, holding)
        self.cap = cap
        self.reserved_output = reserved_output
        self.received = 0

    def _inspect(self, chunk: bytes) -> bytes:
        self.received += len(chunk)
        if self.received > self.cap:
            raise AnswerTooLarge(None, self.cap)
        return chunk

    def _unfinished(self) -> Outcome:
        if self.usage is not None:
            return super()._unfinished()
        return Outcome(
            CLIENT_CLOSED, None, self.first_byte_at, "client_closed", self.reserved_output
        )


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _without_usage_events(chunk: bytes) -> bytes:
    events = chunk.split(b"\n\n")
    kept = [event for event in events if _USAGE_ONLY not in event]
    return b"\n\n".join(kept)


def _error_event(message: str) -> bytes:
    error = {"error": {"message": message, "type": "server_error", "param": None, "code": 502}}
    return b"data: " + json.dumps(error).encode() + b"\n\n"
