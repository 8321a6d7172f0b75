"""The load generator's HTTP client: requests to one server over a keep-alive pool of
HTTP/1.1 connections (`http://`, or `https://` with the system's certificates).

It is built for the load generator's one job, on asyncio's protocols rather than a
general HTTP library: one write per request, the answer parsed as it arrives (see
`connection.py` and `answers.py`), and a keep-alive pool with no limit (a connection
per request in flight). That costs about a third of httpx's CPU per streamed request,
which matters where the load generator shares a small machine with what it loads: the
less CPU it takes, the less of its own queueing shows in the latencies it measures.

Nothing here raises for a failed request: the result names what went wrong
(`request.py` lists the categories). Proxy settings from the environment are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from typing import Any
from urllib.parse import urlsplit

from fairpool.sched.errors import ConfigError
from fairpool_cli.load.answers import EventStream, QuickStream, Reader, WholeBody
from fairpool_cli.load.connection import Connection
from fairpool_cli.load.request import (
    API_PATHS,
    CONNECTION,
    STREAM,
    STREAMED,
    TIMEOUT,
    OutgoingRequest,
    RequestResult,
    now,
)

LIST_TIMEOUT = 10.0  # seconds for GET /models: an endpoint that hangs is an error soon
CONNECT_TIMEOUT = 10.0
CLOSE_WAIT = 1.0  # seconds `close` waits for the connections to close


class Sender:
    """Requests to the server of `url` (its path, e.g. `/v1`, prefixes every request's).

    `timeout`: seconds without a byte of the answer before a request fails (and to open
    a connection, at most `CONNECT_TIMEOUT`). `parse_events`: read every event of a
    stream (its text and the first token's time); without it, only the first byte, the
    end and the usage (see `answers.py`). `ssl_context`: for `https://`, instead of the
    system's certificates."""

    def __init__(
        self,
        url: str,
        timeout: float = 300.0,
        *,
        parse_events: bool = True,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.ssl = ssl_context or ssl.create_default_context()
        self.url = url.rstrip("/")
        self.base = parts.path.rstrip("/")
        self.timeout = timeout
        self.parse_events = parse_events
        self._paths = {api: f"{self.base}{path}" for api, path in API_PATHS.items()}
        self._host = f"Host: {parts.netloc.rpartition('@')[2]}\r\n"
        self._json = f"{self._host}Content-Type: application/json\r\n"
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()

    async def __aenter__(self) -> Sender:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def send(self, request: OutgoingRequest, scheduled: float | None = None) -> RequestResult:
        """Send `request` (due at `scheduled`, by default now) and read its answer."""
        started = now()
        result = RequestResult(request.tenant, started if scheduled is None else scheduled, started)
        body = request.body
        extra = "".join(f"{name}: {value}\r\n" for name, value in request.headers.items())
        head = (
            f"POST {self._paths[request.api]} HTTP/1.1\r\n{self._json}{extra}"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        closing = request.headers.get("Connection", "").lower() == "close"
        reader = self._reader(request.api, result)
        await self._exchange(head.encode() + body, result, reader, closing)
        return result

    def _reader(self, api: str, result: RequestResult) -> Reader:
        if api not in STREAMED:
            return WholeBody(result)
        return EventStream(result, api) if self.parse_events else QuickStream(result, api)

    async def get(
        self, path: str, headers: dict[str, str] | None = None, timeout: float | None = None
    ) -> tuple[RequestResult, bytes]:
        """`GET` `path` below the base URL: how it went, and the body."""
        result = RequestResult(started=now())
        reader = WholeBody(result)
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        head = f"GET {self.base}{path} HTTP/1.1\r\n{self._host}{extra}\r\n"
        await self._exchange(head.encode(), result, reader, False, timeout)
        return result, reader.body

    async def _exchange(
        self,
        data: bytes,
        result: RequestResult,
        reader: Reader,
        closing: bool,
        timeout: float | None = None,
    ) -> None:
        connection: Connection | None = None
        reusable = False
        try:
            connection = await self._connect()
            await connection.request(data, result, reader, timeout or self.timeout)
            reusable = connection.reusable and not closing
        except TimeoutError as error:
            result.fail(TIMEOUT, str(error) or "the connection took too long to open")
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            answered = result.status != 0
            result.fail(STREAM if answered else CONNECTION, f"{type(error).__name__}: {error}")
        finally:  # also when cancelled: a connection in the middle of an answer is closed
            if connection is not None:
                if reusable:
                    self._idle.append(connection)
                else:
                    connection.close()
                    self._open.discard(connection)

    async def _connect(self) -> Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable:
                return connection
            self._open.discard(connection)
        loop = asyncio.get_running_loop()
        opening = loop.create_connection(
            Connection,
            self.host,
            self.port,
            ssl=self.ssl,
            server_hostname=self.host if self.ssl else None,
        )
        _, connection = await asyncio.wait_for(opening, min(self.timeout, CONNECT_TIMEOUT))
        self._open.add(connection)
        return connection

    async def close(self) -> None:
        """Close every connection, and wait (a little) until they are closed."""
        for connection in self._open:
            connection.close()
        closing = [connection.closed for connection in self._open]
        self._idle.clear()
        self._open.clear()
        if closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*closing), CLOSE_WAIT)


def auth(key: str | None) -> dict[str, str]:
    """The headers that carry a tenant's API key (none without one)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


async def first_model(sender: Sender, key: str | None) -> str:
    """The first model `GET /models` lists (with a tenant's key: the gateway lists the
    pools that tenant may use)."""
    where = f"{sender.url}/models"
    result, body = await sender.get("/models", auth(key), LIST_TIMEOUT)
    try:
        if result.error is not None:
            raise ValueError(f"{result.error}: {result.detail}" if result.detail else result.error)
        return str(json.loads(body)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as error:
        reason = str(error) or type(error).__name__
        raise ConfigError(
            "--model", f"could not list the models at {where} ({reason}); name one"
        ) from None


def body_bytes(document: dict[str, Any]) -> bytes:
    """A request's JSON body, compact."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
