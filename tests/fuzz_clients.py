"""Hostile clients for the fuzz tier: requests written byte by byte on raw sockets, the
answers read back as they come, and the gateway's ledgers read from its admin API.

A raw client sees what a real one sees and nothing more: the status lines, headers and
bodies the gateway wrote, and whether the gateway closed the connection. `judge` sorts
each exchange into what the gateway may do (answer below 500; close a connection whose
headers never finished, for its header deadline) and fails on anything else.

Waits are bounded by `SOCKET_DEADLINE` or tests/polling.py's deadline: they bound a hang,
they are never the assertion.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from gateway_helpers import KEYS
from polling import wait_until

from fairpool.api.gateway_config import GatewayConfig
from fairpool_gateway.server import GatewayThread

#: `FAIRPOOL_FUZZ_SCALE=N` multiplies every example count of the fuzz tier, for a deeper
#: run than CI's (still derandomized: the same N, the same cases).
SCALE = int(os.environ.get("FAIRPOOL_FUZZ_SCALE", "1"))
SOCKET_DEADLINE = 60.0  # seconds a raw socket waits for the gateway: bounds a hang only
STREAM_CUT = "answer cut: the client stopped reading"


def with_settings(config: GatewayConfig, **fields: Any) -> GatewayConfig:
    document = config.model_dump(by_alias=True)
    document.update(fields)
    return GatewayConfig.model_validate(document)


# ---------------------------------------------------------------------- ledgers


class Admin:
    """The gateway's admin API through one client (a client per call would build a TLS
    context each time: most of a case's cost)."""

    def __init__(self, running: GatewayThread) -> None:
        # A new connection per call: the gateway closes idle ones (its header deadline).
        self.http = httpx.Client(
            base_url=running.admin_url,
            timeout=SOCKET_DEADLINE,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def close(self) -> None:
        self.http.close()

    def ledgers(self) -> dict[str, float]:
        """What the gateway's ledgers hold, leaving out what is zero: per pool the fair
        queue's length and each worker's outstanding requests; the bytes of bodies and
        answers it holds; per tenant its concurrency slots (the limiter) and, per pool, its
        queued and in-flight requests (the fair queue). Empty when every ledger is back to
        zero."""
        held: dict[str, float] = {}
        for name, pool in self.http.get("/admin/pools").json().items():
            held[f"{name}: queued"] = pool["queued"]
            for url, worker in pool["workers"].items():
                held[f"{name}: {url} outstanding"] = worker["outstanding"]
        status = self.http.get("/admin/status").json()
        held["bytes in flight"] = status["clients"]["bytesInFlight"]
        for tenant in self.http.get("/admin/tenants").json()["tenants"]:
            name = tenant["tenant"]
            held[f"{name}: concurrent"] = tenant["usage"]["concurrent"]
            for pool_name, state in tenant["state"].items():
                held[f"{name}: {pool_name} queued"] = state.get("queued", 0)
                held[f"{name}: {pool_name} in flight"] = state.get("in_flight", 0)
        return {key: value for key, value in held.items() if value}

    def wait_for_zero_ledgers(self, case: object = None) -> None:
        """Wait until every ledger is back to zero (a stream may still be settling)."""
        wait_until(
            self.ledgers,
            lambda held: not held,
            what=f"every ledger back to zero after {case!r:.300}",
        )

    def unhealthy_workers(self) -> list[str]:
        """Workers the gateway holds out of rotation: a tenant's request must never put
        one there (the engines here are healthy)."""
        return [
            url
            for pool in self.http.get("/admin/pools").json().values()
            for url, worker in pool["workers"].items()
            if not worker["healthy"]
        ]


@contextmanager
def admin(running: GatewayThread) -> Iterator[Admin]:
    api = Admin(running)
    try:
        yield api
    finally:
        api.close()


class EngineProcesses:
    """`fairpool engine-sim` workers, each in a process of its own (so that the test
    process holds the gateway alone, and what it allocates is the gateway's), and whether
    they are idle, from their /metrics: nothing running, nothing waiting (a request whose
    client left was aborted)."""

    def __init__(self, count: int, model: str, *options: str) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        self.http = httpx.Client(timeout=SOCKET_DEADLINE)
        try:
            for _ in range(count):
                port = free_port()
                command = [sys.executable, "-m", "fairpool_cli", "engine-sim", "--port"]
                command += [str(port), "--model", model, "--disable-uvicorn-access-log"]
                self.processes.append(
                    subprocess.Popen(
                        [*command, *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
                )
                self.urls.append(f"http://127.0.0.1:{port}")
            for url, process in zip(self.urls, self.processes, strict=True):
                wait_until(
                    lambda url=url, process=process: self._answers(url, process),
                    what=f"engine-sim {url} answering /health",
                )
        except BaseException:
            self.stop()
            raise

    def _answers(self, url: str, process: subprocess.Popen[bytes]) -> bool:
        assert process.poll() is None, f"engine-sim {url} exited"
        try:
            return self.http.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def busy(self) -> dict[str, float]:
        """Each engine's running and waiting requests, where not zero."""
        busy = {}
        for url in self.urls:
            for line in self.http.get(f"{url}/metrics").text.splitlines():
                if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                    value = float(line.rsplit(" ", 1)[1])
                    if value:
                        busy[f"{url} {line.split('{')[0]}"] = value
        return busy

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.http.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class StreamCuts(logging.Handler):
    """The request ids (the clients' `x-request-id`) of answers the gateway cut for a
    client that stopped reading."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.request_ids: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == STREAM_CUT:
            self.request_ids.append(str(getattr(record, "client_request_id", "")))


@contextmanager
def stream_cuts() -> Iterator[StreamCuts]:
    logger = logging.getLogger("fairpool.gateway")
    handler = StreamCuts()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


# ---------------------------------------------------------------------- requests


def request_bytes(
    path: str,
    body: bytes,
    *,
    key: str | None = KEYS["light"],
    request_id: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    content_length: bytes | None = None,
) -> bytes:
    """An HTTP/1.1 POST of `body`: its Content-Length is the body's unless given (a lie,
    or garbage), left out when `content_length` is b"" (for a chunked body)."""
    lines = [b"POST " + path.encode() + b" HTTP/1.1", b"Host: gateway"]
    if key is not None:
        lines.append(b"Authorization: Bearer " + key.encode())
    lines.append(b"Content-Type: application/json")
    if request_id is not None:
        lines.append(b"x-request-id: " + request_id.encode())
    length = str(len(body)).encode() if content_length is None else content_length
    if length:
        lines.append(b"Content-Length: " + length)
    lines += [name + b": " + value for name, value in headers or []]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@dataclass
class Answer:
    """One HTTP answer as the client read it."""

    status: int
    headers: dict[bytes, bytes]
    body: bytes
    complete: bool  # the whole body arrived (its length, or a chunked body's last chunk)


def parse_answers(data: bytes) -> list[Answer]:
    """The answers in what a connection received, in order; the last may be incomplete.
    Interim answers (100 Continue) are left out."""
    answers: list[Answer] = []
    rest = data
    while rest.startswith(b"HTTP/"):
        head, found, after = rest.partition(b"\r\n\r\n")
        status_line, *lines = head.split(b"\r\n")
        parts = status_line.split(b" ", 2)
        complete_code = len(parts) > 2 or (len(parts) == 2 and found)
        status = int(parts[1]) if complete_code and parts[1].isdigit() else 0
        if not found:  # the head is still coming: an answer once its status is there
            if status:
                answers.append(Answer(status, {}, b"", False))
            break
        headers = {}
        for line in lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            rest = after
            continue
        if b"content-length" in headers:
            length = int(headers[b"content-length"])
            body, complete, rest = after[:length], len(after) >= length, after[length:]
        elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body, complete, rest = dechunk(after)
        else:  # the body runs to the end of the connection
            body, complete, rest = after, True, b""
        answers.append(Answer(status, headers, body, complete))
        if not complete:
            break
    return answers


def dechunk(data: bytes) -> tuple[bytes, bool, bytes]:
    """A chunked body: (its bytes, whether its last chunk came, what follows it)."""
    body = bytearray()
    position = 0
    while True:
        end = data.find(b"\r\n", position)
        if end < 0:
            return bytes(body), False, b""
        size = int(data[position:end].split(b";")[0], 16)
        start = end + 2
        if size == 0:
            trailer_end = data.find(b"\r\n", start)
            if trailer_end < 0:
                return bytes(body), False, b""
            return bytes(body), True, data[trailer_end + 2 :]
        if len(data) < start + size + 2:
            body += data[start:]
            return bytes(body), False, b""
        body += data[start : start + size]
        position = start + size + 2


def stream_complete(body: bytes) -> bool:
    """A streamed answer that ended as its API ends one: `data: [DONE]` (chat,
    completions) or a Responses stream's `response.completed` event."""
    return b"data: [DONE]" in body or b"response.completed" in body


# ---------------------------------------------------------------------- raw connections


class RawClient:
    """One connection to the gateway, written and read by hand.

    It reads whatever arrives while it writes (an early answer, a 408 before the body
    ended), notes whether the gateway closed the connection, and can stop reading for a
    while (a small receive buffer makes the stall reach the gateway soon)."""

    def __init__(self, url: str, receive_buffer: int | None = None) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.socket.settimeout(SOCKET_DEADLINE)
        self.socket.connect((host, int(port)))
        self.received = bytearray()
        self.gateway_closed = False  # the gateway closed (or reset) the connection
        self.client_closed = False
        self.half_closed = False
        self.sent = 0  # bytes written

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send(self, data: bytes, pause: float = 0.0) -> bool:
        """Write `data` (False if the gateway has closed the connection), then read what
        arrives for `pause` seconds."""
        if self.gateway_closed:
            return False
        try:
            self.socket.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.gateway_closed = True
            self.drain()
            return False
        self.sent += len(data)
        self.drain(pause)
        return not self.gateway_closed

    def drain(self, seconds: float = 0.0) -> None:
        """Read whatever arrives within `seconds` (0: what is there already)."""
        deadline = time.monotonic() + seconds
        while not self.gateway_closed:
            left = max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self.socket], [], [], left)
            if not readable:
                if time.monotonic() >= deadline:
                    return
                continue
            self._receive()

    def _receive(self, size: int = 65536) -> None:
        try:
            chunk = self.socket.recv(size)
        except ConnectionResetError:
            chunk = b""
        except TimeoutError:
            raise AssertionError(
                f"the gateway sent nothing for {SOCKET_DEADLINE:g} s; "
                f"received so far: {bytes(self.received[:300])!r}"
            ) from None
        if chunk:
            self.received += chunk
        else:
            self.gateway_closed = True

    def read_bytes(self, count: int) -> None:
        """Read until `count` bytes in all have arrived, or the gateway closed."""
        while len(self.received) < count and not self.gateway_closed:
            self._receive(min(65536, count - len(self.received)))

    def read_until(self, marker: bytes) -> None:
        """Read until `marker` has arrived, or the gateway closed."""
        while marker not in self.received and not self.gateway_closed:
            self._receive()

    def read_answer(self) -> None:
        """Read until the first answer is whole, or the gateway closed."""
        while not self.gateway_closed:
            answers = parse_answers(bytes(self.received))
            if answers and answers[0].complete:
                return
            self._receive()

    def read_to_close(self) -> None:
        """Read until the gateway closes the connection (after our half-close, say)."""
        while not self.gateway_closed:
            self._receive()

    def half_close(self) -> None:
        """No more bytes from us (a FIN); the gateway may still answer."""
        self.half_closed = True
        try:
            self.socket.shutdown(socket.SHUT_WR)
        except OSError:
            self.gateway_closed = True

    def close(self, abrupt: bool = False) -> None:
        """Close the connection: abrupt sends a reset instead of a FIN."""
        if self.client_closed:
            return
        self.client_closed = True
        if abrupt:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.socket.close()

    @property
    def answers(self) -> list[Answer]:
        return parse_answers(bytes(self.received))


# ---------------------------------------------------------------------- judging


@dataclass
class Tally:
    """How the cases of a test ended, by category (for the test's own message)."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, category: str) -> None:
        self.counts[category] = self.counts.get(category, 0) + 1


def judge(
    client: RawClient,
    *,
    headers_complete: bool,
    cut: bool = False,
    case: object = None,
) -> str:
    """Sort one exchange into what the gateway may do, or fail:

    - an answer below 500 (every answer on the connection), possibly a 408 (the body's
      deadline) or a stream ended early when the gateway logged cutting it (`cut`: the
      client stopped reading past the write timeout);
    - no answer, and the connection closed by the gateway, only while our headers were
      incomplete (the header deadline) or after we closed or half-closed it first.
    """
    answers = client.answers
    where = f"case {case!r:.400}; received {bytes(client.received[:400])!r}"
    for answer in answers:
        assert 0 < answer.status < 500, f"the gateway answered {answer.status}: {where}"
    if answers:
        first = answers[0]
        streamed = first.headers.get(b"content-type", b"").startswith(b"text/event-stream")
        if streamed and first.complete and not stream_complete(first.body):
            raise AssertionError(f"a stream ended without its API's end: {where}")
        if streamed and not first.complete and not client.client_closed:
            assert cut, f"the gateway broke off a stream it did not log cutting: {where}"
            return "stream cut: write timeout"
        if first.status == 408:
            return "408: body timeout"
        return f"{first.status}"
    if client.client_closed or client.half_closed:
        return "client left first"
    assert client.gateway_closed, f"no answer and the connection still open: {where}"
    assert not headers_complete, (
        f"the gateway closed the connection without an answer after complete headers: {where}"
    )
    return "closed: header timeout"
