"""Load generator of `bench_gateway.py`: streamed OpenAI requests, open or closed loop.

Two HTTP clients with one interface, `post(path, body, headers) -> Sample`:

- `RawClient` (the default): HTTP/1.1 on an `asyncio.Protocol` that parses bytes as they
  arrive (no coroutine switch per chunk), a keep-alive connection pool, chunked and
  length-delimited bodies. It does only what the benchmark needs: write one request in
  one write, read the status, headers and body chunks, note when the first body byte and
  the end of the stream arrive, and parse the one SSE event that carries `usage`.
- `HttpxClient`: the same with `httpx.AsyncClient.stream`, for comparison: about three
  times the raw client's CPU per streamed request (`bench_gateway.py --calibrate` prints
  both). The load generator shares its core with the engines: the cheaper the client,
  the less its queueing shows in the latencies.

Arrivals: `open_loop` draws Poisson arrivals at a target rate (each request in its own
task, whatever the previous ones are doing, so a slow proxy meets the same offered load as
a fast one); `closed_loop` keeps N requests in flight, each client sending its next
request when the last one ends (the most a proxy serves at that concurrency).

Latency of a request is measured from just before its bytes are written: time to first
token (TTFT, the first body byte of a stream: vLLM's first chunk goes out with the first
token) and total (the stream's `data: [DONE]`). `lag` is how late the client sent it
after its scheduled arrival: a few hundred microseconds when the client keeps up.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from fairpool.sim.metrics import percentile

DONE = b"data: [DONE]"


@dataclass
class Sample:
    """One request as the client saw it (times from `time.perf_counter`)."""

    tenant: str
    scheduled: float
    started: float
    first: float | None = None
    ended: float | None = None
    status: int = 0
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and self.ended is not None

    @property
    def ttft(self) -> float:
        return (self.first or self.started) - self.started

    @property
    def total(self) -> float:
        return (self.ended or self.started) - self.started

    @property
    def lag(self) -> float:
        return self.started - self.scheduled


class Client(Protocol):
    """What the load generator needs of an HTTP client."""

    async def post(
        self, path: str, body: bytes, headers: dict[str, str], sample: Sample
    ) -> Sample: ...

    async def close(self) -> None: ...


def read_usage(body: bytes, sample: Sample) -> None:
    """Copy the token counts of the last SSE event (or JSON body) that has `usage`."""
    at = body.rfind(b'"completion_tokens"')
    if at < 0:
        return
    start = body.rfind(b"data: ", 0, at)
    start = 0 if start < 0 else start + len(b"data: ")
    end = body.find(b"\n", at)
    try:
        event = json.loads(body[start : end if end >= 0 else len(body)])
    except ValueError:
        return
    usage = event.get("usage") if isinstance(event, dict) else None
    if not isinstance(usage, dict):
        return
    sample.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    sample.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    sample.cached_tokens = int(details.get("cached_tokens") or 0)


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: parses the response as bytes arrive (no
    coroutine switch per chunk), one request at a time."""

    HEAD, SIZE, DATA, TRAILER, BODY = range(5)

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.state = self.HEAD
        self.need = 0
        self.keep_alive = True
        self.sample: Sample | None = None
        self.parts: list[bytes] = []
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.done is not None and not self.done.done():
            if self.state == self.BODY and self.need < 0:  # delimited by the close
                self._chunk(bytes(self.buffer))
                self.buffer.clear()
                self._finish()
            else:
                self.done.set_exception(exc or ConnectionResetError("connection closed"))

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def request(self, data: bytes, sample: Sample) -> asyncio.Future[None]:
        assert self.transport is not None
        self.sample, self.parts, self.state = sample, [], self.HEAD
        self.done = asyncio.get_running_loop().create_future()
        sample.started = time.perf_counter()
        self.transport.write(data)
        return self.done

    def data_received(self, data: bytes) -> None:
        if self.sample is None:
            return
        self.buffer += data
        try:
            self._parse()
        except ValueError as error:
            if self.done is not None and not self.done.done():
                self.done.set_exception(error)
            if self.transport is not None:
                self.transport.close()

    def _parse(self) -> None:
        buffer = self.buffer
        while self.sample is not None:
            if self.state == self.HEAD:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                self._head(bytes(buffer[:end]))
                del buffer[: end + 4]
            elif self.state == self.SIZE:
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buffer[:end]).split(b";", 1)[0], 16)
                del buffer[: end + 2]
                self.state, self.need = (self.TRAILER, 0) if size == 0 else (self.DATA, size)
            elif self.state == self.DATA:
                if len(buffer) < self.need + 2:
                    return
                self._chunk(bytes(buffer[: self.need]))
                del buffer[: self.need + 2]
                self.state = self.SIZE
            elif self.state == self.TRAILER:
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                del buffer[: end + 2]
                if end == 0:
                    self._finish()
            else:  # BODY
                if self.need < 0 or len(buffer) < self.need:
                    return
                self._chunk(bytes(buffer[: self.need]))
                del buffer[: self.need]
                self._finish()

    def _head(self, head: bytes) -> None:
        assert self.sample is not None
        lines = head.split(b"\r\n")
        self.sample.status = int(lines[0].split(b" ", 2)[1])
        chunked, length, self.keep_alive = False, -1, True
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"content-length":
                length = int(value)
            elif name == b"connection":
                self.keep_alive = b"close" not in value.lower()
        if chunked:
            self.state = self.SIZE
        else:
            self.state, self.need = self.BODY, length
            self.keep_alive = self.keep_alive and length >= 0

    def _chunk(self, data: bytes) -> None:
        assert self.sample is not None
        if self.sample.first is None:
            self.sample.first = time.perf_counter()
        self.parts.append(data)
        if DONE in data:
            self.sample.ended = time.perf_counter()

    def _finish(self) -> None:
        assert self.sample is not None and self.done is not None
        if self.sample.ended is None and not (self.parts and self.parts[0].startswith(b"data:")):
            self.sample.ended = time.perf_counter()  # a whole (not streamed) body
        if self.sample.first is None:
            self.sample.first = self.sample.ended
        if self.buffer or not self.keep_alive:  # bytes after the response: do not reuse
            self.keep_alive = False
            if self.transport is not None:
                self.transport.close()
        self.sample = None
        if not self.done.done():
            self.done.set_result(None)


class RawClient:
    """HTTP/1.1 over asyncio protocols, with a keep-alive pool to one host."""

    def __init__(self, host: str, port: int, timeout: float = 300.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._idle: list[_Connection] = []
        self._prefix = f"Host: {host}:{port}\r\nContent-Type: application/json\r\n"

    async def _connect(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable:
                return connection
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(_Connection, self.host, self.port)
        return connection

    async def post(self, path: str, body: bytes, headers: dict[str, str], sample: Sample) -> Sample:
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        head = f"POST {path} HTTP/1.1\r\n{self._prefix}{extra}Content-Length: {len(body)}\r\n\r\n"
        connection: _Connection | None = None
        reusable = False
        closing = headers.get("Connection", "").lower() == "close"
        try:
            connection = await self._connect()
            await asyncio.wait_for(connection.request(head.encode() + body, sample), self.timeout)
            reusable = connection.keep_alive and connection.usable and not closing
        except TimeoutError:
            sample.error = "timeout"
        except (OSError, ValueError) as error:
            sample.error = f"{type(error).__name__}: {error}"
        finally:  # also when cancelled: a connection mid-response is never reused
            if connection is not None:
                if reusable:
                    self._idle.append(connection)
                elif connection.transport is not None:
                    connection.transport.close()
        if sample.error is None and connection is not None:
            content = b"".join(connection.parts)
            if sample.status != 200:
                sample.error = f"HTTP {sample.status}: {content[:200]!r}"
            elif sample.ended is None:
                sample.error = "stream ended without [DONE]"
            else:
                read_usage(content, sample)
        return sample

    async def close(self) -> None:
        for connection in self._idle:
            if connection.transport is not None:
                connection.transport.close()
        self._idle.clear()


class HttpxClient:
    """The same with httpx (one shared AsyncClient, as an application would use it)."""

    def __init__(self, host: str, port: int, timeout: float = 300.0) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self._http = httpx.AsyncClient(
            base_url=f"http://{host}:{port}", timeout=timeout, limits=limits
        )

    async def post(self, path: str, body: bytes, headers: dict[str, str], sample: Sample) -> Sample:
        parts: list[bytes] = []
        sample.started = time.perf_counter()
        try:
            request_headers = {"content-type": "application/json", **headers}
            async with self._http.stream(
                "POST", path, content=body, headers=request_headers
            ) as response:
                sample.status = response.status_code
                async for data in response.aiter_raw():
                    if sample.first is None:
                        sample.first = time.perf_counter()
                    parts.append(data)
                    if DONE in data:
                        sample.ended = time.perf_counter()
        except httpx.HTTPError as error:
            sample.error = f"{type(error).__name__}: {error}"
            return sample
        content = b"".join(parts)
        if sample.status != 200:
            sample.error = f"HTTP {sample.status}: {content[:200]!r}"
        elif sample.ended is None and content.startswith(b"data:"):
            sample.error = "stream ended without [DONE]"
        else:
            sample.ended = sample.ended or time.perf_counter()
            read_usage(content, sample)
        return sample

    async def close(self) -> None:
        await self._http.aclose()


CLIENTS: dict[str, Callable[[str, int], Client]] = {"raw": RawClient, "httpx": HttpxClient}


@dataclass(frozen=True)
class OutgoingRequest:
    """What to send: path, body, headers, and the tenant it is counted for."""

    tenant: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


MakeRequest = Callable[[int], OutgoingRequest]


async def send(client: Client, request: OutgoingRequest, scheduled: float) -> Sample:
    sample = Sample(tenant=request.tenant, scheduled=scheduled, started=scheduled)
    return await client.post(request.path, request.body, request.headers, sample)


async def open_loop(
    client: Client, make: MakeRequest, rate: float, duration: float, seed: int = 1
) -> list[Sample]:
    """Poisson arrivals at `rate` per second for `duration` seconds; every sample, in
    arrival order, once the last request has ended."""
    draw = random.Random(seed)
    tasks: list[asyncio.Task[Sample]] = []
    now = time.perf_counter()
    next_at, end = now, now + duration
    number = 0
    while True:
        next_at += draw.expovariate(rate)
        if next_at >= end:
            break
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(client, make(number), next_at)))
        number += 1
    return list(await asyncio.gather(*tasks))


async def closed_loop(
    client: Client, make: MakeRequest, concurrency: int, duration: float, first: int = 0
) -> list[Sample]:
    """`concurrency` requests in flight for `duration` seconds (starts spread over the
    first tenth of a second); the samples of requests that started in that time."""
    end = time.perf_counter() + duration
    counter = itertools.count(first)
    samples: list[Sample] = []

    async def one(index: int) -> None:
        await asyncio.sleep(0.1 * index / concurrency)
        while time.perf_counter() < end:
            samples.append(await send(client, make(next(counter)), time.perf_counter()))

    await asyncio.gather(*(one(index) for index in range(concurrency)))
    return samples


@dataclass
class Flood:
    """Closed-loop streams of several tenants at once, each tenant with its concurrency;
    every request that ends lands in `samples` until the flood is cancelled."""

    streams: dict[str, tuple[int, MakeRequest]]
    samples: list[Sample] = field(default_factory=list)

    async def run(self, client_for: Callable[[str, int], Client]) -> None:
        """Run until cancelled; `client_for(tenant, index)` gives each stream its client."""

        async def one(tenant: str, make: MakeRequest, index: int, concurrency: int) -> None:
            await asyncio.sleep(2.0 * index / concurrency)
            client = client_for(tenant, index)
            number = index
            try:
                while True:
                    self.samples.append(await send(client, make(number), time.perf_counter()))
                    number += concurrency
            finally:
                await client.close()

        await asyncio.gather(
            *(
                one(tenant, make, index, concurrency)
                for tenant, (concurrency, make) in self.streams.items()
                for index in range(concurrency)
            )
        )


def summary_ms(values: list[float]) -> dict[str, float]:
    """p50/p90/p99/max of seconds (nearest rank), in milliseconds; 0 for none."""
    return {
        f"{name}_ms": round(1000 * (percentile(values, fraction) or 0.0), 3)
        for name, fraction in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
    }
