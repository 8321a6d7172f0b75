"""Running the gateway: one uvicorn server, two sockets (tenant API and admin API), one
event loop, structured logs, a graceful drain on shutdown (`fairpool_gateway.drain`); and
`GatewayThread`, the same server in a thread for tests and benchmarks."""

from __future__ import annotations

import json
import logging
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

import uvicorn
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from fairpool.api.gateway_config import GatewayConfig, load_gateway_config
from fairpool.runtime import ServerInThread, tune_collector_for_serving
from fairpool.sched.errors import ConfigError
from fairpool_gateway.app import admin_app, tenant_app
from fairpool_gateway.connections import GuardedProtocol
from fairpool_gateway.gateway import Gateway
from fairpool_gateway.processes import config_for_worker, run_workers
from fairpool_gateway.protocol import GatewayError

log = logging.getLogger("fairpool.gateway")
_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, message and the record's extra fields
    (request id, tenant, pool, worker, status, ...)."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "message": record.getMessage(),
        }
        document.update(
            (key, value) for key, value in vars(record).items() if key not in _RECORD_FIELDS
        )
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("fairpool")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


class GatewayASGI:
    """Both APIs behind one ASGI callable: the admin API answers on the admin socket only."""

    def __init__(self, gateway: Gateway, admin_port: int, freeze: bool = False) -> None:
        self.gateway = gateway
        self.freeze = freeze  # the process's own server: tune_collector_for_serving once up
        self.admin_port = admin_port
        self.tenant = tenant_app(gateway)
        self.admin = admin_app(gateway)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        server = scope.get("server")
        if server is not None and server[1] == self.admin_port:
            await self.admin(scope, receive, send)
        elif scope["type"] == "http":
            await self.gateway.drain.serve(self.tenant, scope, receive, send, self._refused)
        else:
            await self.tenant(scope, receive, send)

    def _refused(self, scope: Scope) -> None:
        """A tenant request refused because the gateway is draining: counted and logged."""
        headers = Headers(scope=scope)
        try:
            tenant = self.gateway.tenants.authenticate(headers.get("authorization")).tenant
        except GatewayError:
            tenant = "unknown"
        self.gateway.ledger.refused(uuid.uuid4().hex, tenant, "none", 503, "shutting_down")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.gateway.start()
                if self.freeze:
                    tune_collector_for_serving()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.gateway.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def bind(host: str, port: int, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A listening TCP socket. `reuse_port`: other sockets of this user may bind the port
    too, and the kernel spreads connections over those that listen (`--workers`: the
    parent binds one without listening, to hold the port and learn it for port 0)."""
    # IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
    sock.set_inheritable(True)
    return sock


#: Seconds uvicorn gives connections to close after the drain, before it cancels what is
#: left (the drain has ended every tenant request by then).
CLOSE_SECONDS = 5


class GatewayServer(uvicorn.Server):
    """uvicorn's server with the gateway's drain before its own shutdown: on SIGTERM the
    sockets stay open while tenant requests in flight finish (new ones get 503), for up to
    `drain_seconds` (the configuration's `drainSeconds` when None); then the rest are ended
    and the sockets closed. A second Ctrl-C stops waiting."""

    def __init__(
        self, config: uvicorn.Config, gateway: Gateway, drain_seconds: float | None = None
    ) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.drain_seconds = drain_seconds

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        seconds = self.drain_seconds
        if seconds is None:
            seconds = self.gateway.config.drain_seconds
        await self.gateway.drain.run(seconds, lambda: self.force_exit)
        await super().shutdown(sockets)


def make_server(
    gateway: Gateway,
    tenant_socket: socket.socket,
    admin_socket: socket.socket,
    freeze: bool = False,
    drain_seconds: float | None = None,
) -> GatewayServer:
    admin_port = admin_socket.getsockname()[1]
    app = GatewayASGI(gateway, admin_port, freeze)
    clients = gateway.config.clients
    gateway.connections.admin_port = admin_port
    protocol = GuardedProtocol.configured(
        gateway.connections,
        clients.idle_timeout,
        clients.keep_alive_timeout,
        clients.header_timeout,
        clients.send_buffer_bytes,
    )
    config = uvicorn.Config(
        app,
        http=protocol,
        # The protocol resets an idle kept-alive connection (keepAliveTimeout); uvicorn's own
        # timer, which closes gracefully (waiting to flush to a client that may never read),
        # comes after it.
        timeout_keep_alive=int(clients.keep_alive_timeout) + 2,
        lifespan="on",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=CLOSE_SECONDS,
        backlog=2048,
    )
    return GatewayServer(config, gateway, drain_seconds)


def serve(
    config_path: str | Path,
    host: str | None,
    port: int | None,
    admin_port: int | None,
    drain_seconds: float | None = None,
    workers: int = 1,
) -> int:
    """`fairpool gateway`: run until SIGINT or SIGTERM, then drain; with `workers` > 1, as
    that many processes behind the one port (`fairpool_gateway.processes`).
    Returns the exit status."""
    config = load_gateway_config(config_path)
    tenant_port = config.listen.port if port is None else port
    admin_port = config.admin.port if admin_port is None else admin_port
    check_startup(config, tenant_port, admin_port, port is not None)
    tenant_host = host or config.listen.host
    if workers == 1:
        tenant_socket = bind(tenant_host, tenant_port)
        admin_socket = bind(config.admin.host, admin_port)
        announce(tenant_socket, [admin_socket])
        gateway = Gateway(config, config_path)
        make_server(gateway, tenant_socket, admin_socket, True, drain_seconds).run(
            sockets=[tenant_socket, admin_socket]
        )
        return 0
    held = bind(tenant_host, tenant_port, reuse_port=True, listen=False)  # the port, for all
    tenant_port = held.getsockname()[1]
    admin_sockets = [
        bind(config.admin.host, admin_port + index if admin_port else 0) for index in range(workers)
    ]
    announce(held, admin_sockets)
    worker_config = config_for_worker(config, workers)

    def run_one(index: int) -> None:
        tenant_socket = bind(tenant_host, tenant_port, reuse_port=True)
        admin_socket = admin_sockets[index]
        for other in admin_sockets:
            if other is not admin_socket:
                other.close()
        gateway = Gateway(worker_config, config_path, workers=workers)
        make_server(gateway, tenant_socket, admin_socket, True, drain_seconds).run(
            sockets=[tenant_socket, admin_socket]
        )

    status = run_workers(workers, run_one)
    held.close()
    return status


def announce(tenant_socket: socket.socket, admin_sockets: list[socket.socket]) -> None:
    host, port = tenant_socket.getsockname()[:2]
    print(f"fairpool gateway: tenant API on http://{host}:{port}/v1", flush=True)
    for index, admin_socket in enumerate(admin_sockets):
        admin_host, admin_port = admin_socket.getsockname()[:2]
        which = f" (worker {index})" if len(admin_sockets) > 1 else ""
        print(
            f"fairpool gateway: admin API and /metrics on http://{admin_host}:{admin_port}{which}",
            flush=True,
        )


def check_startup(
    config: GatewayConfig, tenant_port: int, admin_port: int, port_given: bool
) -> None:
    """What the configuration file cannot say alone: the ports after `--port` and
    `--admin-port` (the two APIs are told apart by port), and that the admin token's file
    can be read now (later changes to it are followed, and a bad one refuses admin requests)."""
    if tenant_port == admin_port != 0:
        option = "--port" if port_given else "--admin-port"
        raise ConfigError(option, f"the tenant and admin APIs would share port {tenant_port}")
    token_file = config.admin.token_file
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as error:
            raise ConfigError("admin.tokenFile", f"cannot read {token_file}: {error}") from None
        if not token:
            raise ConfigError("admin.tokenFile", f"{token_file} is empty")


class GatewayThread:
    """A gateway on free loopback ports, in a thread:
    `with GatewayThread(config) as gateway: gateway.url, gateway.admin_url`."""

    def __init__(self, config: GatewayConfig, config_path: str | Path | None = None) -> None:
        self.gateway = Gateway(config, config_path)
        self._tenant_socket = bind("127.0.0.1", 0)
        self._admin_socket = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._tenant_socket.getsockname()[1]}"
        self.admin_url = f"http://127.0.0.1:{self._admin_socket.getsockname()[1]}"
        server = make_server(self.gateway, self._tenant_socket, self._admin_socket)
        sockets = [self._tenant_socket, self._admin_socket]
        self._running = ServerInThread(server, sockets, "fairpool-gateway")

    def __enter__(self) -> GatewayThread:
        self._running.start()
        return self

    def begin_shutdown(self) -> None:
        """What SIGTERM does to `fairpool gateway`: the drain starts, the thread ends when it
        is over (join it with `__exit__`)."""
        self._running.begin_stop()

    def __exit__(self, *exc_info: object) -> None:
        self._running.stop()
