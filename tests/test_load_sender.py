"""The load generator's HTTP client (`fairpool_cli.load.send`): its parser fed answers
cut at every byte, its failure categories, and HTTPS, against servers on loopback."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from fairpool_cli.load import OutgoingRequest, RequestResult, Sender
from fairpool_cli.load.answers import EventStream, QuickStream, Reader, WholeBody
from fairpool_cli.load.connection import Connection

pytestmark = pytest.mark.subprocess  # openssl makes a certificate


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def sse(*events: dict[str, Any] | str, named: bool = False) -> list[bytes]:
    out = []
    for event in events:
        data = event if isinstance(event, str) else json.dumps(event)
        kind = f"event: {event['type']}\n" if named and isinstance(event, dict) else ""
        out.append(f"{kind}data: {data}\n\n".encode())
    return out


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
USAGE = {"prompt_tokens": 12, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}}
CHAT = STREAM_HEAD + chunked(
    *sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": "Hello"}}]},
        {"choices": [{"index": 0, "delta": {"content": " world"}}]},
        {"choices": [], "usage": USAGE},
        "[DONE]",
    )
)
RESPONSE_USAGE = {
    "input_tokens": 12,
    "output_tokens": 2,
    "input_tokens_details": {"cached_tokens": 8},
}
RESPONSES = STREAM_HEAD + chunked(
    *sse(
        {"type": "response.created", "response": {"usage": None}},
        {"type": "response.output_text.delta", "delta": "Hello"},
        {"type": "response.output_text.delta", "delta": " world"},
        {
            "type": "response.completed",
            "response": {"status": "completed", "usage": RESPONSE_USAGE},
        },
        named=True,
    )
)
EMBEDDING = json.dumps(
    {"data": [{"embedding": [0.5, 0.5]}], "usage": {"prompt_tokens": 12, "total_tokens": 12}}
).encode()
EMBEDDINGS = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(EMBEDDING), EMBEDDING)


class Transport(asyncio.Transport):
    """What a connection writes to, and whether it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def fed(
    answer: bytes, cuts: list[int], make: Callable[[RequestResult], Reader], close: bool = False
) -> tuple[RequestResult, Connection]:
    """A connection given `answer` in pieces cut at `cuts` (then closed, if `close`)."""

    async def feed() -> tuple[RequestResult, Connection]:
        connection = Connection()
        connection.connection_made(Transport())
        result = RequestResult()
        done = connection.request(b"", result, make(result), timeout=60)
        for start, end in zip([0, *cuts], [*cuts, len(answer)], strict=True):
            connection.data_received(answer[start:end])
        if close:
            connection.connection_lost(None)
        if done.done():
            done.result()
        return result, connection

    return asyncio.run(feed())


READERS: dict[str, Callable[[RequestResult], Reader]] = {
    "chat": lambda result: EventStream(result, "chat"),
    "chat-quick": lambda result: QuickStream(result, "chat"),
    "responses": lambda result: EventStream(result, "responses"),
    "responses-quick": lambda result: QuickStream(result, "responses"),
    "embeddings": WholeBody,
}
ANSWERS = {"chat": CHAT, "responses": RESPONSES, "embeddings": EMBEDDINGS}


@pytest.mark.parametrize("reader", READERS)
def test_an_answer_cut_anywhere_reads_the_same(reader):
    """Every cut in two, and every byte on its own: the same status, usage and text, and
    the connection stays open for the next request."""
    answer = ANSWERS[reader.removesuffix("-quick")]
    whole, _ = fed(answer, [], READERS[reader])
    assert whole.ok and whole.status == 200 and whole.usage_reported
    tokens = (whole.prompt_tokens, whole.cached_tokens, whole.completion_tokens)
    assert tokens == ((12, 0, 0) if reader == "embeddings" else (12, 8, 2))
    assert whole.text == ("Hello world" if reader in ("chat", "responses") else "")
    cuts = [[cut] for cut in range(1, len(answer))] + [list(range(1, len(answer)))]
    for at in cuts:
        result, connection = fed(answer, at, READERS[reader])
        assert result.ok and connection.reusable, at[:2]
        assert result.text == whole.text and result.usage_reported
        assert (result.prompt_tokens, result.cached_tokens, result.completion_tokens) == tokens


def test_what_makes_a_connection_unusable_and_bodies_delimited_by_the_close():
    body = EMBEDDING
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + body
    result, connection = fed(closing, [20, 60], WholeBody, close=True)
    assert result.ok and result.prompt_tokens == 12 and not connection.reusable
    result, connection = fed(EMBEDDINGS + b"HTTP/1.1 200", [], WholeBody)  # more than asked
    assert result.ok and not connection.reusable
    result, connection = fed(CHAT, [], READERS["chat"])
    assert connection.reusable


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\n\r\n{}", "limited"),
        (b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}", "503"),
        (STREAM_HEAD + chunked(*sse({"error": {"message": "engine died"}})), "stream"),
        (STREAM_HEAD + chunked(*sse({"choices": [{"delta": {"content": "a"}}]})), "stream"),
        (STREAM_HEAD + chunked(b"data: {not json\n\n"), "stream"),
    ],
)
def test_failed_answers_are_named(answer, error):
    """(A stream without its end fails either way; the quick reader looks for no more.)"""
    for reader in ("chat", "chat-quick"):
        result, _ = fed(answer, [], READERS[reader])
        assert result.error == error and not result.ok, reader


# ---------------------------------------------------------------------- real sockets


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def answering(answer: bytes) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return handle


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()  # until the client gives up and closes
    writer.close()


def send_to(
    handler: Handler | None,
    requests: int = 1,
    timeout: float = 60.0,
    server_ssl: ssl.SSLContext | None = None,
    client_ssl: ssl.SSLContext | None = None,
) -> tuple[list[RequestResult], int]:
    """`requests` chat requests, one after the other, to a server that answers with
    `handler` (None: no server); the results and how many connections were opened."""

    async def main() -> tuple[list[RequestResult], int]:
        opened = 0

        async def counting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal opened
            opened += 1
            assert handler is not None
            await handler(reader, writer)

        server = await asyncio.start_server(counting, "127.0.0.1", 0, ssl=server_ssl)
        port = server.sockets[0].getsockname()[1]
        if handler is None:
            server.close()
            await server.wait_closed()
        scheme = "https" if client_ssl else "http"
        url = f"{scheme}://{'localhost' if client_ssl else '127.0.0.1'}:{port}/v1"
        results = []
        async with Sender(url, timeout, ssl_context=client_ssl) as sender:
            for _ in range(requests):
                request = OutgoingRequest("a", "chat", b"{}", {"Authorization": "Bearer k"})
                results.append(await sender.send(request))
        server.close()
        return results, opened

    return asyncio.run(main())


def test_keep_alive_connections_are_reused():
    results, opened = send_to(answering(CHAT), requests=5)
    assert all(result.ok and result.text == "Hello world" for result in results)
    assert opened == 1


def test_no_server_is_a_connection_failure_and_silence_a_timeout():
    (refused,), _ = send_to(None)
    assert refused.error == "connection" and refused.status == 0
    (waited,), opened = send_to(silent, timeout=0.05)
    assert waited.error == "timeout" and opened == 1


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost (made with the openssl command)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_https_with_the_servers_certificate(certificate):
    cert, key = certificate
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    results, opened = send_to(answering(CHAT), requests=3, server_ssl=server, client_ssl=client)
    assert all(result.ok and result.prompt_tokens == 12 for result in results)
    assert opened == 1
    untrusted = ssl.create_default_context()  # the system's certificates: not this one
    (refused,), _ = send_to(answering(CHAT), server_ssl=server, client_ssl=untrusted)
    assert refused.error == "connection" and "CERTIFICATE" in refused.detail.upper()
