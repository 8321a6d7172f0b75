"""One pool at the gateway: its workers, its router and its fair queue.

- Workers come from the pool's discovery (a list, a file, or Kubernetes) and are in
  rotation while their health polls succeed; the router only ever sees workers in
  rotation, with the load their `/metrics` report.
- The router (D2LPM by default, any core router by name) keeps the pool's prefix tree of
  prompt text, the requests outstanding per worker and the deficits q[tenant, worker].
- The fair queue holds requests while every worker in rotation is saturated and releases
  them in VTC order across tenants. In a placement pool the workers are chains with a
  capacity each and the router is JFFC: the fair queue is then JFFC's central queue, so a
  freed chain slot goes to the tenant VTC picks, and that request to the fastest free chain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from fairpool.api.gateway_config import GatewayConfig, GatewayPool
from fairpool.sched.cost import TenantWeights
from fairpool.sched.registry import make_router, router_parameters
from fairpool.sched.routers import D2LPM, ChainProfile, Router, RouteRequest
from fairpool_gateway.discovery import discovery_for
from fairpool_gateway.fair_queue import FairQueue
from fairpool_gateway.workers import WorkerHealth, WorkerMonitor

log = logging.getLogger("fairpool.gateway")


@dataclass(frozen=True)
class Dispatch:
    worker: str
    matched_chars: int  # of the prompt, in the tree for the chosen worker


class Pool:
    def __init__(
        self,
        spec: GatewayPool,
        config: GatewayConfig,
        weights: Mapping[str, float],
        health_client: httpx.AsyncClient,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.router = _make_router(spec, config, weights)
        self.monitor = WorkerMonitor(
            health_client,
            interval=config.health_interval,
            timeout=config.timeouts.health,
            on_change=self._worker_changed,
        )
        self.queue = FairQueue(
            self.has_capacity,
            spec.cost.model(),
            TenantWeights(weights),
            policy=spec.routing.queue_policy,
        )
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(discovery_for(self.spec.workers).run(self._members_changed)),
            asyncio.create_task(self.monitor.run()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def set_weights(self, weights: Mapping[str, float]) -> None:
        tenant_weights = TenantWeights(weights)
        if hasattr(self.router, "weights"):
            self.router.weights = tenant_weights
        self.queue.set_weights(tenant_weights)

    # ------------------------------------------------------------------ requests

    def has_capacity(self) -> bool:
        """A worker in rotation has room for one more request than those the fair queue
        released and that are not dispatched yet. A worker has room while the gateway has
        fewer than `maxOutstanding` requests on it and its metrics show fewer than
        `maxWaiting` waiting requests and less than `maxKvUsage` KV use, and, for a chain
        of a placement pool, fewer than its capacity."""
        limits = self.spec.routing.saturation
        room = 0
        dispatched = 0
        for worker in self.router.workers.values():
            dispatched += worker.outstanding
            health = self.monitor.workers.get(worker.worker_id)
            if worker.kv_usage >= limits.max_kv_usage or (
                health is not None and health.waiting >= limits.max_waiting
            ):
                continue
            worker_room = max(limits.max_outstanding - worker.outstanding, 0)
            chain_room = self.router.room(worker.worker_id)  # JFFC: capacity c_k left
            room += worker_room if chain_room is None else min(worker_room, chain_room)
        released_not_dispatched = max(self.queue.in_flight() - dispatched, 0)
        return room > released_not_dispatched

    def dispatch(self, request_id: str, tenant: str, prompt: str, input_tokens: int) -> Dispatch:
        """Pick the worker for a request and count it there (ConfigError if none is up)."""
        request = RouteRequest(request_id, tenant, prompt, input_tokens)
        worker = self.router.route(request)
        matched = 0
        tree = getattr(self.router, "tree", None)
        if tree is not None:
            matched = tree.match_length(prompt, worker)
        return Dispatch(worker, matched)

    def complete(
        self, request_id: str, output_tokens: int = 0, uncached_input: int | None = None
    ) -> None:
        if self.router.in_flight(request_id) is not None:
            self.router.complete(request_id, output_tokens, uncached_input)
        self.queue.wake()

    def worker_failed(self, worker: str, error: str) -> None:
        """A dispatch to `worker` failed before its first byte: out of rotation until its
        next good health poll."""
        self.monitor.report_failure(worker, error)
        self._sync_rotation()

    # ------------------------------------------------------------------ state

    def deficits(self) -> Iterator[tuple[str, str, float]]:
        """(tenant, worker, q) for D2LPM pools."""
        router = self.router
        if isinstance(router, D2LPM):
            for tenant, deficits in router.deficits.items():
                for worker in router.workers:
                    yield tenant, worker, deficits[worker]

    def worker_states(self) -> Iterator[tuple[str, bool, int]]:
        for url, health in self.monitor.workers.items():
            state = self.router.workers.get(url)
            yield url, health.healthy, state.outstanding if state else 0

    def snapshot(self) -> dict[str, object]:
        tree = getattr(self.router, "tree", None)
        return {
            "model": self.spec.model,
            "router": self.router.name,
            "workers": {
                url: {
                    "healthy": health.healthy,
                    "outstanding": (
                        self.router.workers[url].outstanding if url in self.router.workers else 0
                    ),
                    "chainRoom": (self.router.room(url) if url in self.router.workers else None),
                    "waiting": health.waiting,
                    "running": health.running,
                    "kvUsage": health.kv_usage,
                    "lastError": health.last_error,
                }
                for url, health in self.monitor.workers.items()
            },
            "prefixTreeChars": len(tree) if tree is not None else None,
            "queued": self.queue.queued(),
        }

    # ------------------------------------------------------------------ internals

    def _members_changed(self, urls: list[str]) -> None:
        self.monitor.set_workers(urls)
        self._sync_rotation()

    def _worker_changed(self, health: WorkerHealth) -> None:
        self._sync_rotation()
        if health.url in self.router.workers:
            self.router.update_load(health.url, kv_usage=health.kv_usage, waiting=health.waiting)

    def _sync_rotation(self) -> None:
        """The router's workers are exactly the healthy ones."""
        healthy = set(self.monitor.healthy())
        for worker in list(self.router.workers):
            if worker not in healthy:
                log.warning("pool %s: worker %s out of rotation", self.name, worker)
                self.router.remove_worker(worker)
        for worker in sorted(healthy - set(self.router.workers)):
            log.info("pool %s: worker %s in rotation", self.name, worker)
            self.router.add_worker(worker)
        self.queue.wake()


def _make_router(spec: GatewayPool, config: GatewayConfig, weights: Mapping[str, float]) -> Router:
    options: dict[str, Any] = {
        "worker_quantum": spec.routing.worker_quantum,
        "max_tree_tokens": config.max_tree_chars,
        "min_match": spec.routing.min_match_chars,
        "chains": {
            chain.url: ChainProfile(chain.capacity, chain.service_rate) for chain in spec.chains
        },
    }
    accepted = router_parameters(spec.routing.policy)
    return make_router(
        spec.routing.policy,
        cost=spec.cost.model(),
        weights=weights,
        **{name: value for name, value in options.items() if name in accepted},
    )
