"""Client connections the gateway does not let linger: uvicorn's HTTP protocol with a
deadline for each request's headers.

uvicorn closes a keep-alive connection that stays idle after a response, but a client
that connects and then sends its headers a byte at a time (or never) holds the connection
for as long as it likes. Here every request's headers must be complete within
`header_timeout` seconds of the connection opening or of the previous response ending;
the connection is closed otherwise. With uvicorn's `limit_concurrency` (the gateway's
`clients.maxConnections`: beyond it new requests get 503), this bounds what silent or
slow connections can hold.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol whose requests must send their headers within a deadline."""

    header_timeout = 10.0  # set by `with_header_timeout`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    @classmethod
    def with_header_timeout(cls, seconds: float) -> type[HeaderDeadlineProtocol]:
        return type(cls.__name__, (cls,), {"header_timeout": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _too_slow(self) -> None:
        self._header_deadline = None
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            self.transport.close()
