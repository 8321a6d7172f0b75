"""Client connections, accounted and bounded before they cost anything: uvicorn's HTTP
protocol with a budget of connections per port and per client address, deadlines for
each request's first line and headers, and a reset (RST) for a connection the gateway
gives up on.

**Budgets.** The tenant port and the admin port (metrics, the kubelet's probes) count
their connections apart (`ConnectionBudget`): tenant traffic can never take the admin
port's connections, so probes and scrapes answer whatever tenants do. Each port bounds its
open connections in all and from one client address; a connection over either bound is
reset the moment it is accepted, before a byte of it is read, and counted
(`fairpool_gateway_connections_refused`). One address opening thousands of idle
connections so holds at most its own share, and every other client is served.

**Deadlines.** A new connection must start its request within `idleTimeout` seconds, a
kept-alive one its next request within `keepAliveTimeout` of its previous answer (longer:
clients keep pooled connections for seconds, and one closed under a request about to be
sent fails it), and a request its whole headers within `headerTimeout` of its first byte;
the connection is reset otherwise. A client that connects and sends
nothing, or trickles its headers, holds its slot for seconds, not for as long as it likes.

**Send buffers.** Each tenant connection's kernel send buffer is fixed at
`clients.sendBufferBytes` (256 KiB), where Linux would grow it to 4 MB: that is what a
client that stops reading pins in the kernel (and in the pod's memory accounting) before
the gateway's writes stall and its write deadline starts.

**Resets.** A connection the gateway ends on its own — over budget, too slow, or a
stream cut because its client stopped reading — is aborted with SO_LINGER 0: the kernel
sends RST and drops what is unsent. Closing gracefully would wait to flush to a client
that advertises a zero window, and the socket would stay established for minutes.
Requests reach the connection's handle through their ASGI scope (`connection_of`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("fairpool.gateway")

#: The scope key under which a request finds its connection (`connection_of`).
SCOPE_KEY = "fairpool.connection"
_LINGER_ZERO = struct.pack("ii", 1, 0)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one port allows: open connections in all, and from one client address."""

    total: int
    per_client: int


@dataclass
class ConnectionBudget:
    """The open connections of one port, in all and by client address. `limits` is read
    at every connection, so a reloaded configuration applies to the next one."""

    port: str  # "tenant" or "admin", for metrics and logs
    limits: Callable[[], ConnectionLimits]
    open: int = 0
    by_client: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # reason → connections reset

    def take(self, client: str) -> str | None:
        """Count a new connection from `client`; the reason it is refused, or None."""
        limits = self.limits()
        if self.open >= limits.total:
            reason = "total"
        elif self.by_client[client] >= limits.per_client:
            reason = "per_client"
        else:
            self.open += 1
            self.by_client[client] += 1
            return None
        self.refused[reason] += 1
        return reason

    def give_back(self, client: str) -> None:
        self.open -= 1
        left = self.by_client[client] - 1
        if left > 0:
            self.by_client[client] = left
        else:
            del self.by_client[client]


@dataclass
class Ports:
    """The budgets of both ports, and which local port number is the admin one."""

    tenant: ConnectionBudget
    admin: ConnectionBudget
    admin_port: int | None = None  # set once the admin socket is bound

    def budget_for(self, local_port: int | None) -> ConnectionBudget:
        return self.admin if local_port == self.admin_port else self.tenant


def reset(transport: asyncio.Transport) -> None:
    """End a connection at once with RST, dropping whatever is unsent."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already gone: aborting is all that is left
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
    transport.abort()


class Connection:
    """What a request may do to its own connection (`connection_of`). It refers to the
    connection weakly: the request's scope holds it, and the connection the scope."""

    def __init__(self, protocol: GuardedProtocol) -> None:
        self._protocol = weakref.ref(protocol)

    def reset(self) -> None:
        """Abort the connection with RST (a stream cut for a client that stopped reading)."""
        protocol = self._protocol()
        transport = None if protocol is None else protocol.transport
        if transport is not None and not transport.is_closing():
            reset(transport)
        if protocol is not None and protocol.cycle is not None:
            protocol.cycle.disconnected = True  # as uvicorn's connection_lost will say


def connection_of(scope: Scope) -> Connection | None:
    """The connection a request came on (None outside the gateway's server)."""
    found = scope.get(SCOPE_KEY)
    return found if isinstance(found, Connection) else None


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol with the budgets, deadlines and resets of the module's
    docstring. `configured` makes the class a server uses."""

    ports: Ports  # set by `configured`
    idle_timeout = 3.0
    keep_alive_timeout = 30.0
    header_timeout = 10.0
    send_buffer: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._budget: ConnectionBudget | None = None  # set while counted
        self._address = ""
        self._handle = Connection(self)

    @classmethod
    def configured(
        cls,
        ports: Ports,
        idle_timeout: float,
        keep_alive_timeout: float,
        header_timeout: float,
        send_buffer: int | None = None,
    ) -> type[GuardedProtocol]:
        attributes = {
            "ports": ports,
            "idle_timeout": idle_timeout,
            "keep_alive_timeout": keep_alive_timeout,
            "header_timeout": header_timeout,
            "send_buffer": send_buffer,
        }
        return type(cls.__name__, (cls,), attributes)

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        local_port = self.server[1] if self.server else None
        budget = self.ports.budget_for(local_port)
        self._address = self.client[0] if self.client else ""
        refusal = budget.take(self._address)
        if refusal is not None:
            log.debug("connection reset: over the %s port's %s budget", budget.port, refusal)
            reset(transport)
            return
        self._budget = budget
        if self.send_buffer is not None and budget is self.ports.tenant:
            sock = transport.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        self._await_request(self.idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._budget is not None:
            self._budget.give_back(self._address)
            self._budget = None
        super().connection_lost(exc)
        # uvicorn's protocol and its request cycle refer to each other, so they go only with
        # a full collection of the cyclic garbage, which a serving process runs rarely
        # (`tune_collector_for_serving`). What a gone client sent and nobody read must not
        # wait that long: refused bodies, hundreds a second, would hold hundreds of MB.
        if self.cycle is not None:
            self.cycle.body = bytearray()
        self.cycle = None  # type: ignore[assignment]  # the cycle's task may outlive us
        self.pipeline.clear()

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[SCOPE_KEY] = self._handle  # type: ignore[literal-required]
        self._arm(self.header_timeout)  # the request has started: now its headers

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._await_request(self.keep_alive_timeout)  # the next one on this connection

    # ------------------------------------------------------------------ deadlines

    def _await_request(self, idle: float) -> None:
        self._arm(idle)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            reset(self.transport)
