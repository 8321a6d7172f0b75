"""The gateway's stream relay on its own, with a scripted engine and client: the engine is
read at its pace into a bounded buffer, the request settles when the engine is done, and a
client that stops reading is cut after the write timeout."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from fairpool.front import Outcome
from fairpool_gateway.app import RelayResponse
from fairpool_gateway.drain import Drain
from fairpool_gateway.protocol import CHUNKS
from fairpool_gateway.proxy import StreamRelay

pytestmark = pytest.mark.unit

USAGE_CHUNK = (
    b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":7,'
    b'"prompt_tokens_details":{"cached_tokens":3},"completion_tokens":4}}\n\n'
)


def token(index: int) -> bytes:
    return b'data: {"choices":[{"text":"t%d"}]}\n\n' % index


class Engine:
    """An engine's streamed answer: `chunks`, then the end (or, with `endless`, more
    chunks for ever). Counts the chunks read."""

    status = 200

    def __init__(self, chunks: list[bytes], endless: bool = False) -> None:
        self.chunks = list(chunks)
        self.endless = endless
        self.read = 0
        self.closed = self.released = False
        self.content = self

    async def readany(self) -> bytes:
        await asyncio.sleep(0)
        self.read += 1
        if self.chunks:
            return self.chunks.pop(0)
        return token(self.read) if self.endless else b""

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        self.released = True


class Client:
    """An ASGI client whose reads of the body the test lets through one by one."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.allowed = asyncio.Semaphore(0)

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            await self.allowed.acquire()
        self.messages.append(message)

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never leaves on its own
        return {"type": "http.disconnect"}


class Exchange:
    request_id = "r1"
    client_request_id = None

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.gateway = SimpleNamespace(drain=Drain())  # not shutting down

    def settle(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)

    def release(self) -> None:
        pass


def relay(engine: Engine, exchange: Exchange, buffer_bytes: int = 1 << 20) -> StreamRelay:
    return StreamRelay(
        engine,  # type: ignore[arg-type]
        CHUNKS,
        client_wants_usage=False,
        idle_timeout=60,
        on_end=exchange.settle,
        buffer_bytes=buffer_bytes,
    )


def test_the_request_settles_when_the_engine_is_done_before_the_client_reads():
    async def scenario() -> None:
        engine = Engine([token(i) for i in range(50)] + [USAGE_CHUNK, b"data: [DONE]\n\n"])
        exchange, client = Exchange(), Client()
        response = RelayResponse(exchange, relay(engine, exchange), 60, headers={})  # type: ignore[arg-type]
        serving = asyncio.create_task(response({"type": "http"}, client.receive, client.send))
        while not exchange.outcomes:
            await asyncio.sleep(0)
        (settled,) = exchange.outcomes
        assert settled.status == 200 and settled.usage is not None
        assert (settled.usage.prompt_tokens, settled.usage.completion_tokens) == (7, 4)
        assert engine.released and not client.messages[1:]  # the client has read nothing
        for _ in range(60):
            client.allowed.release()
        await asyncio.wait_for(serving, 10)
        body = b"".join(m.get("body", b"") for m in client.messages)
        assert body.count(b"data: ") == 51 and b'"choices":[]' not in body  # usage dropped

    asyncio.run(scenario())


def test_a_slow_client_holds_only_the_buffer():
    async def scenario() -> None:
        engine = Engine([], endless=True)
        exchange, client = Exchange(), Client()
        stream = relay(engine, exchange, buffer_bytes=10 * len(token(0)))
        response = RelayResponse(exchange, stream, 60, headers={})  # type: ignore[arg-type]
        serving = asyncio.create_task(response({"type": "http"}, client.receive, client.send))
        for _ in range(200):
            await asyncio.sleep(0)
        assert engine.read <= 12  # the buffer is full: the engine is read no further
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        assert engine.closed and exchange.outcomes[-1].status == 499

    asyncio.run(scenario())


def test_a_client_that_stops_reading_is_cut_after_the_write_timeout():
    async def scenario() -> None:
        engine = Engine([], endless=True)
        exchange, client = Exchange(), Client()
        response = RelayResponse(exchange, relay(engine, exchange), 0.01, headers={})  # type: ignore[arg-type]
        await asyncio.wait_for(response({"type": "http"}, client.receive, client.send), 10)
        assert response.stalled and engine.closed
        assert exchange.outcomes[-1].status == 499  # the engine had not finished

    asyncio.run(scenario())
