"""One keep-alive HTTP/1.1 connection on an `asyncio.Protocol`.

The response is parsed as its bytes arrive, in the event loop's callback: the status
line and headers, then a chunked or length-delimited body (or one delimited by the
connection's close), each piece of body handed to the request's reader as it comes (a
chunk cut between two reads comes as two pieces). Nothing is copied but a line cut in
two, and no coroutine runs per piece: the request's coroutine wakes up once, when the
answer is complete. One request at a time; a connection that saw anything odd is not
reused.

The idle timeout costs one timer per request: when it fires it looks at when the last
byte came, and fails the request only if that was a whole timeout ago.
"""

from __future__ import annotations

import asyncio

from fairpool_cli.load.answers import Reader
from fairpool_cli.load.request import RequestResult, now


class Connection(asyncio.Protocol):
    HEAD, SIZE, DATA, DATA_END, TRAILER, BODY = range(6)

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.state = self.HEAD
        self.need = 0
        self.keep_alive = True
        self.result: RequestResult | None = None
        self.reader: Reader | None = None
        self.done: asyncio.Future[None] | None = None
        self.loop = asyncio.get_running_loop()
        self.closed = self.loop.create_future()
        self.timeout = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.last = 0.0  # the event loop's time of the last byte received

    # ------------------------------------------------------------------ the transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._stop_timer()
        if not self.closed.done():
            self.closed.set_result(None)
        if self.done is None or self.done.done():
            return
        if self.state == self.BODY and self.need < 0:  # a body delimited by the close
            self._finish(False)
        else:
            self._fail(exc or ConnectionResetError("the server closed the connection"))

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    @property
    def reusable(self) -> bool:
        return self.keep_alive and self.usable

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ one exchange

    def request(
        self, data: bytes, result: RequestResult, reader: Reader, timeout: float
    ) -> asyncio.Future[None]:
        """Write one request; the future is done when the answer is complete."""
        assert self.transport is not None
        self.result, self.reader, self.state = result, reader, self.HEAD
        self.done = self.loop.create_future()
        self.timeout, self.last = timeout, self.loop.time()
        self.timer = self.loop.call_at(self.last + timeout, self._check_idle)
        result.started = now()
        self.transport.write(data)
        return self.done

    def _check_idle(self) -> None:
        deadline = self.last + self.timeout
        if self.loop.time() < deadline:
            self.timer = self.loop.call_at(deadline, self._check_idle)
            return
        self.timer = None
        self._fail(TimeoutError(f"no byte for {self.timeout:g} s"))
        self.close()

    def _fail(self, error: BaseException) -> None:
        self._stop_timer()
        self.result = self.reader = None
        self.keep_alive = False
        if self.done is not None and not self.done.done():
            self.done.set_exception(error)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def data_received(self, data: bytes) -> None:
        if self.result is None:  # bytes while no request is out: do not reuse
            self.keep_alive = False
            self.close()
            return
        self.last = self.loop.time()
        if self.buffer:  # the end of a line that began in the last piece
            self.buffer += data
            data = bytes(self.buffer)
            self.buffer.clear()
        try:
            at = self._parse(data)
        except ValueError as error:
            self._fail(error)
            self.close()
            return
        if at < len(data):
            self.buffer += data[at:]

    def _parse(self, data: bytes) -> int:
        """Take what `data` holds of the answer; where the part that waits for more
        bytes begins (a line cut in two)."""
        at, size = 0, len(data)
        while self.result is not None and at < size:
            state = self.state
            if state == self.DATA:  # chunk data, handed on as it comes
                take = min(self.need, size - at)
                self._piece(data[at : at + take])
                at += take
                self.need -= take
                if not self.need:
                    self.state = self.DATA_END
            elif state == self.SIZE:
                end = data.find(b"\r\n", at)
                if end < 0:
                    return at
                chunk = int(data[at:end].partition(b";")[0], 16)
                at = end + 2
                self.state, self.need = (self.TRAILER, 0) if chunk == 0 else (self.DATA, chunk)
            elif state == self.DATA_END:
                if size - at < 2:
                    return at
                if data[at : at + 2] != b"\r\n":
                    raise ValueError("a chunk does not end with CRLF")
                at += 2
                self.state = self.SIZE
            elif state == self.HEAD:
                end = data.find(b"\r\n\r\n", at)
                if end < 0:
                    return at
                self._head(data[at:end])
                at = end + 4
                if self.state == self.BODY and self.need == 0:
                    self._finish(at < size)
            elif state == self.TRAILER:
                end = data.find(b"\r\n", at)
                if end < 0:
                    return at
                last = end == at
                at = end + 2
                if last:
                    self._finish(at < size)
            else:  # BODY: up to its length, or all until the connection closes
                take = size - at if self.need < 0 else min(self.need, size - at)
                self._piece(data[at : at + take])
                at += take
                if self.need > 0:
                    self.need -= take
                    if not self.need:
                        self._finish(at < size)
        if self.result is None and at < size:  # bytes after the answer: do not reuse
            self.keep_alive = False
            self.close()
            return size
        return at

    def _head(self, head: bytes) -> None:
        assert self.result is not None
        lines = head.split(b"\r\n")
        self.result.status = int(lines[0].split(b" ", 2)[1])
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

    def _piece(self, data: bytes) -> None:
        if data:
            assert self.reader is not None
            self.reader.feed(data)

    def _finish(self, more: bool) -> None:
        """The answer is complete; `more`: bytes came after it."""
        assert self.reader is not None and self.done is not None
        self._stop_timer()
        self.reader.finish()
        if more or not self.keep_alive:
            self.keep_alive = False
            self.close()
        self.result = self.reader = None
        if not self.done.done():
            self.done.set_result(None)
