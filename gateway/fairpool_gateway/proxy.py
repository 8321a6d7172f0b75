"""Forwarding a request to an engine, and reading what the engine served.

Upstream HTTP is aiohttp's client: its C parser and connection pool cost a fraction of
httpx's per streamed request, and the gateway spends most of its time here.

Streams pass through chunk by chunk as they arrive, never buffered. The gateway needs the
engine's usage (prompt, cached and completion tokens) to charge the tenant exactly: chat and
completions streams carry it only when asked, so the gateway always asks for the final usage
chunk (`stream_options.include_usage`) and, when the client did not ask for it, drops that
chunk on the way back; a Responses API stream ends with its usage in `response.completed`.
Everything else is the engine's bytes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from fairpool.api.scheduler_config import TENANT_XARG, XARG_PREFIX
from fairpool.front import CLIENT_CLOSED, Outcome, Usage
from fairpool_gateway.protocol import StreamFormat

SSE_DONE = b"data: [DONE]\n\n"
_USAGE_ONLY = b'"choices":[]'
_USAGE_KEY = b'"usage":{'
_DECODER = json.JSONDecoder()
_TAIL = 8192  # bytes of a stream kept to find its usage chunk at the end


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


class UpstreamFailed(Exception):
    """The worker failed before the first byte of its answer: safe to retry elsewhere."""


def upstream_body(document: dict[str, Any], tenant: str, ask_for_usage: bool) -> bytes:
    """The body for the engine: the client's, with the tenant tag (replacing any
    `fairpool_*` the client sent, so nobody can speak for another tenant) and, where the
    stream needs asking, the usage chunk requested. `vllm_xargs` and `stream_options` are
    objects (the request models checked)."""
    xargs = {
        key: value
        for key, value in (document.get("vllm_xargs") or {}).items()
        if not str(key).startswith(XARG_PREFIX)
    }
    xargs[TENANT_XARG] = tenant
    body = {**document, "vllm_xargs": xargs}
    if ask_for_usage:
        body["stream_options"] = {**(document.get("stream_options") or {}), "include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()


UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def upstream_session() -> aiohttp.ClientSession:
    """One pool of keep-alive connections to every worker (call inside the event loop)."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
    )


def upstream_timeout(connect: float, read: float) -> aiohttp.ClientTimeout:
    """`read` bounds every wait for bytes: the whole answer of a non-streamed request,
    the gap between two chunks of a stream."""
    return aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    timeout: aiohttp.ClientTimeout,
    request_id: str,
) -> aiohttp.ClientResponse:
    """Open the request to the worker; UpstreamFailed if it cannot answer (no connection,
    no headers in time, or a 5xx). 4xx answers are the client's to see."""
    headers = {"content-type": "application/json", "x-request-id": request_id}
    try:
        response = await session.post(url, data=body, headers=headers, timeout=timeout)
    except UPSTREAM_ERRORS as error:  # connect errors, timeouts, resets
        raise UpstreamFailed(f"{type(error).__name__}: {error}") from None
    if response.status >= 500:
        try:
            detail = (await response.read())[:200].decode(errors="replace")
        except UPSTREAM_ERRORS:
            detail = ""
        finally:
            response.close()
        raise UpstreamFailed(f"HTTP {response.status} {detail}".strip())
    return response


async def read_whole(response: aiohttp.ClientResponse) -> tuple[bytes, Usage | None]:
    """A non-streamed answer and its usage."""
    try:
        content = await response.read()
    except UPSTREAM_ERRORS as error:
        raise UpstreamFailed(f"{type(error).__name__}: {error}") from None
    finally:
        response.release()  # back to the pool if read whole; closed otherwise
    try:
        usage = parse_usage(json.loads(content))
    except ValueError:
        usage = None
    return content, usage


class StreamRelay:
    """Relays an SSE answer and keeps what it served: events seen (each about one token,
    told to `on_output` as they pass), the usage chunk, and how the stream ended."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        stream_format: StreamFormat,
        client_wants_usage: bool,
        on_output: Callable[[int], None] | None = None,
    ) -> None:
        self.response = response
        self.format = stream_format
        # Usage chunks the gateway asked for and the client did not are dropped.
        self.drop_usage = stream_format.asks_for_usage and not client_wants_usage
        self.on_output = on_output
        self.output_events = 0  # data events with output, about one token each
        self.usage: Usage | None = None
        self.error: str | None = None
        self.complete = False  # the engine's stream ended and was relayed whole
        self.first_byte_at: float | None = None
        self._tail = b""

    def outcome(self) -> Outcome:
        """How the relayed request ended: a failed engine (502), a client that left before
        the end (499), or answered (200); with the engine's usage when it sent it."""
        if self.error is not None:
            status, reason = 502, "upstream_failed"
        elif not self.complete:
            status, reason = CLIENT_CLOSED, "client_closed"
        else:
            status, reason = 200, None
        return Outcome(status, self.usage, self.first_byte_at, reason)

    def close(self) -> None:
        """Close the engine's stream if it was not relayed whole (also when `chunks` never
        started), so the engine aborts the request."""
        if not self.complete:
            self.response.close()

    async def chunks(self, clock: Callable[[], float]) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.content.iter_any():
                if self.first_byte_at is None:
                    self.first_byte_at = clock()
                events = self._output_events(chunk)
                if events > 0:
                    self.output_events += events
                    if self.on_output is not None:
                        self.on_output(events)
                self._tail = (self._tail + chunk)[-_TAIL:]
                if self.drop_usage and _USAGE_ONLY in chunk:
                    chunk = _without_usage_events(chunk)
                    if not chunk:
                        continue
                yield chunk
            self.complete = True
        except UPSTREAM_ERRORS as error:
            self.error = f"{type(error).__name__}: {error}"
            yield _error_event(f"The model server failed mid-stream ({type(error).__name__}).")
            yield SSE_DONE
        finally:
            # Whole: the connection goes back to the pool. Cut short (the client left):
            # closing it makes the engine abort the request.
            if self.complete:
                self.response.release()
            else:
                self.response.close()
            self.usage = _last_usage(self._tail)

    def _output_events(self, chunk: bytes) -> int:
        marker = self.format.output_event
        if marker is not None:
            return chunk.count(marker)
        return chunk.count(b"data: ") - chunk.count(b"data: [DONE]") - chunk.count(_USAGE_ONLY)


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
