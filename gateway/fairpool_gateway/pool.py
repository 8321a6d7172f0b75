"""One pool at the gateway: the network around its front.

The decisions — hard limits, the fair queue, routing, settlement — are the pool's
`PoolFront` (`fairpool.front`), the same object the simulator runs. Around it this module
keeps what needs the network:

- workers come from the pool's discovery (a list, a file, or Kubernetes) and are in
  rotation while their health polls succeed; the front's router sees exactly the workers
  in rotation, with the load their `/metrics` report;
- a request the front queues waits here on the event loop (`hold`), until the front
  releases it, its queue timeout passes, or its client leaves.

In a placement pool the workers are chains with a capacity each and the router is JFFC:
the fair queue is then JFFC's central queue, so a freed chain slot goes to the tenant VTC
picks, and that request to the fastest free chain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import httpx

from fairpool.api.gateway_config import GatewayConfig, GatewayPool
from fairpool.front import CLIENT_CLOSED, Flight, FrontListener, Limiter, Outcome, PoolFront
from fairpool.runtime import LoopLag
from fairpool.sched.routers import ChainProfile
from fairpool_gateway.discovery import discovery_for
from fairpool_gateway.workers import Load, WorkerHealth, WorkerMonitor

log = logging.getLogger("fairpool.gateway")


class Pool:
    def __init__(
        self,
        spec: GatewayPool,
        config: GatewayConfig,
        weights: Mapping[str, float],
        limiter: Limiter,
        listeners: list[FrontListener],
        health_client: httpx.AsyncClient,
        lag: LoopLag | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.front = PoolFront.for_routing(
            spec.name,
            spec.routing,
            spec.cost.model(),
            weights,
            limiter,
            max_tree_bytes=config.max_tree_bytes,
            chains={
                chain.url: ChainProfile(chain.capacity, chain.service_rate) for chain in spec.chains
            },
            saturated_when=spec.routing.saturation,
            on_release=_wake,
            fair_engines=spec.fair_engines,
        )
        self.front.listeners = listeners  # the gateway's, shared by its pools
        self.monitor = WorkerMonitor(
            health_client,
            interval=config.health_interval,
            timeout=config.timeouts.health,
            on_change=self._worker_changed,
            lag=lag,
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
        self.front.set_weights(weights)

    # ------------------------------------------------------------------ requests

    def worker_failed(self, worker: str, error: str) -> None:
        """A dispatch to `worker` failed before its first byte: out of rotation until its
        next good health poll."""
        self.monitor.report_failure(worker, error)
        self._sync_rotation()

    # ------------------------------------------------------------------ state

    def worker_states(self) -> list[tuple[str, bool, int]]:
        """(worker, in rotation, requests in flight there) for every member."""
        routed = self.front.router.workers
        return [
            (url, health.healthy, routed[url].outstanding if url in routed else 0)
            for url, health in self.monitor.workers.items()
        ]

    def snapshot(self) -> dict[str, object]:
        router, peers = self.front.router, self.front.peers
        workers: dict[str, object] = {}
        for url, health in self.monitor.workers.items():
            state = router.workers.get(url)
            workers[url] = {
                "healthy": health.healthy,
                "outstanding": state.outstanding if state else 0,
                "outstandingElsewhere": peers.in_flight(url) if peers is not None else 0,
                "chainRoom": router.room(url) if state else None,
                "waiting": state.waiting if state else None,
                "kvUsage": state.kv_usage if state else None,
                "lastError": health.last_error,
            }
        return {
            "model": self.spec.model,
            "router": router.name,
            "workerQuantum": router.worker_quantum,  # D2LPM's Q^w in force; None without
            "workers": workers,
            "prefixTreeChars": router.cache_size(),
            "queued": self.front.queue.queued(),
            # the other replicas heard through the shared state; None without one
            "otherReplicas": len(peers) if peers is not None else None,
        }

    # ------------------------------------------------------------------ internals

    def _members_changed(self, urls: list[str]) -> None:
        self.monitor.set_workers(urls)
        self._sync_rotation()

    def _worker_changed(self, health: WorkerHealth, load: Load | None) -> None:
        self._sync_rotation()
        if load is not None and health.url in self.front.router.workers:
            self.front.update_load(health.url, kv_usage=load.kv_usage, waiting=load.waiting)

    def _sync_rotation(self) -> None:
        """The router's workers are exactly the healthy ones."""
        added, removed = self.front.set_rotation(self.monitor.healthy())
        for worker in removed:
            log.warning("pool %s: worker %s out of rotation", self.name, worker)
        for worker in added:
            log.info("pool %s: worker %s in rotation", self.name, worker)


async def hold(flight: Flight) -> None:
    """Wait while its front keeps `flight` queued: returns once it is released (and
    routed, unless routing failed and settled it); raises the front's `Rejection` when the
    queue timeout passes. If the waiting task is cancelled (the client left), the flight
    is settled with nothing served, whether or not it was released meanwhile."""
    if not flight.queued:  # released before its holder got here
        return
    loop = asyncio.get_running_loop()
    released: asyncio.Future[None] = loop.create_future()
    flight.context = released
    timer = loop.call_later(flight.front.queue_timeout, _expire, flight)
    try:
        await released
    except asyncio.CancelledError:
        if flight.decision is not None and not flight.settled:
            flight.undispatch()  # released, never sent
        flight.settle(Outcome(status=CLIENT_CLOSED, reason="client_closed"))
        raise
    finally:
        timer.cancel()


def _wake(flight: Flight) -> None:
    """The front released `flight`: its waiting task may go on. A task that was cancelled
    before the release and has not run yet settles it itself (`hold`)."""
    released = flight.context
    if isinstance(released, asyncio.Future) and not released.done():
        released.set_result(None)


def _expire(flight: Flight) -> None:
    rejection = flight.expire()
    released = flight.context
    if rejection is not None and isinstance(released, asyncio.Future) and not released.done():
        released.set_exception(rejection)
