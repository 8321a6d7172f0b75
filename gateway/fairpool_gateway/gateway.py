"""The gateway's state: configuration, tenant table, pools, limits and metrics, and the
re-reading of the configuration file while it runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx

from fairpool.api.gateway_config import GatewayConfig, load_gateway_config
from fairpool.api.tenant_quota import ServiceLevel
from fairpool.files import FileWatch
from fairpool.front import FrontListener, Limiter, TenantLimiter
from fairpool.runtime import LoopLag, cancel_and_wait
from fairpool.sched.errors import ConfigError
from fairpool_gateway.budget import ByteLimits, BytesInFlight
from fairpool_gateway.connections import ConnectionBudget, ConnectionLimits, Ports
from fairpool_gateway.drain import Drain
from fairpool_gateway.fleet_shares import FleetShares, ServiceRecorder
from fairpool_gateway.heard import Ignored, Kind
from fairpool_gateway.metrics import GatewayMetrics, RequestLedger
from fairpool_gateway.pool import Pool
from fairpool_gateway.processes import config_for_worker
from fairpool_gateway.proxy import upstream_session
from fairpool_gateway.refusals import Refusals, Storms
from fairpool_gateway.shared_fronts import SharedFronts
from fairpool_gateway.shared_limits import SharedLimiter, read_password
from fairpool_gateway.tenants import TenantTable

log = logging.getLogger("fairpool.gateway")
RELOAD_INTERVAL = 1.0


class Gateway:
    def __init__(
        self, config: GatewayConfig, config_path: str | Path | None = None, workers: int = 1
    ) -> None:
        #: Processes of this gateway behind one port (`--workers`): a reloaded
        #: configuration is divided among them as the first was.
        self.workers = workers
        self.config = config
        self.config_path = Path(config_path) if config_path else None
        self.tenants = TenantTable(config)
        #: What clients may hold of the gateway (each reads the configuration in force).
        self.connections = Ports(
            ConnectionBudget("tenant", self._tenant_connection_limits),
            ConnectionBudget("admin", self._admin_connection_limits),
        )
        self.bytes_in_flight = BytesInFlight(self._byte_limits)
        self.refusals = Refusals(self._storms)
        self.lag = LoopLag()
        self.metrics = GatewayMetrics()
        self.metrics.add_state(self._deficits, self._queues, self._workers, self._quanta)
        self.metrics.add_guards(self.connections, self.bytes_in_flight, self.refusals, self.lag)
        # One limiter for all pools: a tenant's limits span them. Shared by the replicas
        # in Redis when `sharedState` says where (fixed at start, not reloaded).
        self.shared: SharedLimiter | None = None
        self.limiter: Limiter = TenantLimiter()
        self.ledger = RequestLedger(self.metrics, self._slo)
        #: What every pool's front tells (one list, shared by all pools): the metrics and
        #: log first; more may be added while the gateway runs.
        self.listeners: list[FrontListener] = [self.ledger]
        #: The fleet-wide shares, read from the shared state (None without one).
        self.fleet: FleetShares | None = None
        #: The fronts' charges and holdings, told to and heard from the other replicas
        #: (None without shared state).
        self.peers: SharedFronts | None = None
        if config.shared_state is not None:
            shared = SharedLimiter(
                config.shared_state,
                password=read_password(config.shared_state.password_file),
                ignored=Ignored(self._count_ignored),
            )
            self.metrics.add_shared_state(lambda: shared.up)
            self.shared = self.limiter = shared
            self.listeners.append(ServiceRecorder(shared))
            self.fleet = FleetShares(
                shared,
                lambda: self.tenants.tenants_of_pools(self.pools),
                lambda: self.tenants.weights(),  # the table in force: a reload replaces it
            )
            self.metrics.registry.register(self.fleet)
            self.peers = SharedFronts(
                shared,
                lambda: {name: pool.front for name, pool in self.pools.items()},
                lambda: self.tenants.tenants,  # the table in force: a reload replaces it
            )
            self.listeners.append(self.peers)
        self._session: aiohttp.ClientSession | None = None  # to the workers; made in start()
        # Health checks get their own connections: queued behind busy streams, a check
        # would time out and take a healthy worker out of rotation.
        self.health_client = httpx.AsyncClient(timeout=None)
        self.pools: dict[str, Pool] = {}
        self._by_model: dict[str, Pool] = {}
        self._reloader: asyncio.Task[None] | None = None
        self._lag_task: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self._config_file = FileWatch(self.config_path) if self.config_path else None
        self.drain = Drain()  # the shutdown, as the server runs it (fairpool_gateway.drain)

    # ------------------------------------------------------------------ lifecycle

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the gateway has not started"
        return self._session

    async def start(self) -> None:
        self._lag_task = asyncio.create_task(self.lag.run())
        self._session = upstream_session()
        if self.shared is not None:
            await self.shared.start()
        if self.peers is not None:
            await self.peers.start()
        self._apply_pools(self.config)
        self._reloader = asyncio.create_task(self._watch_config())

    async def stop(self) -> None:
        await cancel_and_wait(task for task in (self._reloader, self._lag_task) if task)
        for pool in self.pools.values():
            await pool.stop()
        if self._session is not None:
            await self._session.close()
        if self.peers is not None:
            await self.peers.close()
        if self.shared is not None:
            await self.shared.close()
        await self.health_client.aclose()

    @property
    def ready(self) -> bool:
        """Serving: started with its configuration, and not shutting down. Whether a pool
        has workers is that pool's business (its requests get 503), never the gateway's."""
        return self._session is not None and not self.drain.draining

    def pool_for_model(self, model: str) -> Pool | None:
        return self._by_model.get(model)

    # ------------------------------------------------------------------ reload

    def reload(self, config: GatewayConfig) -> None:
        """Apply a new configuration: tenants, keys, weights and limits at once; pools
        added, removed, or rebuilt where their spec changed (their routing state restarts)."""
        self.tenants = TenantTable(config)
        self._apply_pools(config)
        self.config = config
        log.info(
            "configuration reloaded: %d pools, %d tenants", len(self.pools), len(config.tenants)
        )

    def _apply_pools(self, config: GatewayConfig) -> None:
        wanted = {spec.name: spec for spec in config.pools}
        for name in list(self.pools):
            pool = self.pools[name]
            if name not in wanted or pool.spec != wanted[name]:
                stopping = asyncio.get_running_loop().create_task(pool.stop())
                self._stopping.add(stopping)  # the loop keeps only weak references
                stopping.add_done_callback(self._stopping.discard)
                del self.pools[name]
        for name, spec in wanted.items():
            shares = config.shares(name)  # the pool's tenants, groups and bands
            if name not in self.pools:
                pool = Pool(
                    spec,
                    config,
                    shares,
                    self.limiter,
                    self.listeners,
                    self.health_client,
                    self.lag,
                )
                pool.start()
                self.pools[name] = pool
            self.pools[name].set_weights(shares)
        self._by_model = {pool.spec.model: pool for pool in self.pools.values()}

    async def _watch_config(self) -> None:
        while True:
            await asyncio.sleep(RELOAD_INTERVAL)
            self.tenants.refresh()  # the tenants' apiKeyFiles, re-read when they change
            if self.config_path is None or self._config_file is None:
                continue
            if not self._config_file.changed():
                continue
            try:
                config = load_gateway_config(self.config_path)
            except ConfigError as error:
                log.error("configuration change refused, keeping the last good one: %s", error)
                continue
            self.reload(config_for_worker(config, self.workers))

    # ------------------------------------------------------------------ client bounds

    def _tenant_connection_limits(self) -> ConnectionLimits:
        clients = self.config.clients
        return ConnectionLimits(clients.max_connections, clients.max_connections_per_client)

    def _admin_connection_limits(self) -> ConnectionLimits:
        admin = self.config.admin
        return ConnectionLimits(admin.max_connections, admin.max_connections_per_client)

    def _slo(self, tenant: str) -> ServiceLevel | None:
        spec = self.tenants.tenants.get(tenant)
        return None if spec is None else spec.slo

    def _storms(self) -> Storms:
        clients = self.config.clients
        return Storms(clients.refusal_burst, clients.refusal_rate)

    def _byte_limits(self) -> ByteLimits:
        clients = self.config.clients
        return ByteLimits(
            clients.max_bytes_in_flight,
            clients.max_tenant_bytes_in_flight,
            clients.max_tenant_requests,
        )

    def _count_ignored(self, kind: Kind, times: int) -> None:
        self.metrics.shared_state_ignored.labels(kind).inc(times)

    # ------------------------------------------------------------------ state

    async def tenant_state(self, tenant: str) -> dict[str, object]:
        """What the admin API shows of one tenant. With shared state up, `usage` is what
        every replica counts together and `localUsage` this replica's fallback counts;
        while it is down, `usage` is the fallback's."""
        spec = self.tenants.tenants.get(tenant)
        pools: dict[str, object] = {}
        for name, pool in self.pools.items():
            state = pool.front.tenant_state().get(tenant, {})
            pools[name] = {**state, "deficits": state.get("deficits", {})}
        document: dict[str, object] = {
            "tenant": tenant,
            "weight": spec.weight if spec else None,
            "pools": spec.pools if spec else None,
            "limits": spec.limits.model_dump(by_alias=True) if spec else None,
            "usage": self.limiter.state(tenant),
            "state": pools,
        }
        if self.shared is not None:
            shared = await self.shared.shared_state(tenant)
            document["sharedState"] = "up" if shared is not None else "down"
            if shared is not None:  # down: `usage` stays this replica's fallback counts
                document["localUsage"] = document["usage"]
                document["usage"] = shared
        return document

    def _deficits(self) -> Iterator[tuple[str, str, str, float]]:
        for name, pool in self.pools.items():
            for tenant, per_worker in pool.front.router.tenant_state().items():
                for worker, value in per_worker.items():
                    yield name, tenant, worker, value

    def _queues(self) -> Iterator[tuple[str, str, int, int, float]]:
        for name, pool in self.pools.items():
            for tenant, state in pool.front.queue.state().items():
                yield (
                    name,
                    tenant,
                    int(state.get("queued", 0)),
                    int(state.get("in_flight", 0)),
                    float(state.get("counter", 0.0)),
                )

    def _quanta(self) -> Iterator[tuple[str, float]]:
        for name, pool in self.pools.items():
            quantum = pool.front.router.worker_quantum
            if quantum is not None:
                yield name, quantum

    def _workers(self) -> Iterator[tuple[str, str, bool, int]]:
        for name, pool in self.pools.items():
            for worker, healthy, outstanding in pool.worker_states():
                yield name, worker, healthy, outstanding
