"""The capacity gate of a pool's front: when a request may go to a worker, and to which.

The fair queue (`fairpool.front.queue`) decides the order among the requests that wait; the
router decides which worker gets one. This decides when one may go at all: while a worker
is below the pool's saturation thresholds, and — with the gateway's other replicas
(`fairpool.front.peers`) — with one cap for the fleet and one fair order across their
queues. With fair engines it also decides when a tenant may keep requests waiting *in* an
engine rather than here: only while that engine holds requests it does not start (its
KV cache full, or a request sent there `ENGINE_HOLDS_AFTER` seconds ago not started), for
only there does the engine's scheduler choose (docs/scheduling.md, "Which scheduler
decides what").

Tenants here are the fair order's flows (`fairpool.sched.tree.flow`): a tenant in its band.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fairpool.api.inference_pool import Saturation
from fairpool.front.peers import Peers
from fairpool.front.queue import FairQueue
from fairpool.sched.routers import Router, WorkerState

#: Seconds a request sent to an engine may go unstarted before the engine counts as one that
#: holds requests (runs all it can): far more than a scheduling step, or a prompt's prefill.
ENGINE_HOLDS_AFTER = 1.0


class CapacityGate:
    """The thresholds, the fair engines' rule and the replicas' shared cap, over a pool's
    router and fair queue (module docstring)."""

    def __init__(
        self,
        router: Router,
        queue: FairQueue,
        saturation: Saturation | None = None,
        fair_engines: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = router
        self.queue = queue
        #: When a worker counts as full; None: never (only a router's own room limits).
        self.saturation = saturation
        #: The engines keep the tenants' weights among the requests in their queues.
        self.fair_engines = fair_engines
        self.clock = clock
        #: The gateway's other replicas, when they share their queues.
        self.peers: Peers | None = None
        #: (worker, flow) → its requests sent there that have not started.
        self._engine_queued: dict[tuple[str, str], int] = {}
        #: worker → {request: when it was sent there}, for those its engine has not started
        self._sent_not_started: dict[str, dict[str, float]] = {}

    def has_capacity(self, tenant: str | None = None) -> bool:
        """Whether a request (of `tenant`) may be dispatched now."""
        if self.saturation is None:
            return self.router.has_room()
        return bool(self.workers_with_room(tenant))

    def workers_with_room(self, tenant: str | None = None) -> list[str]:
        """The workers in rotation that may take one more request: the router allows it (a
        chain below its capacity) and the worker is below the saturation thresholds —
        fewer than `maxOutstanding` requests from this front, fewer than `maxWaiting` in
        its engine's queue (as last reported, plus those sent since), less than
        `maxKvUsage` of its KV cache in use. Routing chooses among these, so a request
        is never sent to a saturated worker.

        A request of a `tenant` below its weighted share of the requests in flight
        (`FairQueue.below_share`) while other tenants' requests are held in the queue is
        held by `maxOutstanding` alone, on the workers
        where it stays within its share of what they serve: the fair engines make room
        for it there (`fairpool.sched.kv_share`), and holding it back behind a flood's
        queue would cost it the latency the flood caused.

        With `fair_engines`, a tenant goes to the workers where fewest of its requests wait
        in the engine's queue (not started) — an engine keeps the weights only between the
        tenants it holds, and a tenant whose requests all went to the worker caching its
        prefix would get that worker's share alone; routing (D2LPM's locality) chooses
        among the workers tied for fewest. While an engine holds requests it does not
        start (it runs all it can), every tenant may keep up to `tenantWaiting` waiting
        there whatever the thresholds: every tenant with work then has requests in that
        engine's queue, and its fair scheduler decides between them, whichever replica
        sent them. (Keeping a tenant at or above its share of the requests in flight here to
        the thresholds left it out of engines' queues within a step: a DLPM engine that
        admits the last waiting request of a tenant with credit refills the others
        without it, and weights 4 : 1 came out 6.4–7.4 : 1.) While an
        engine runs all it is sent, its scheduler decides nothing — a batch serves every
        running request alike, so the mix sent decides the shares — and the thresholds
        hold: requests wait here, where the fair queue decides (with the other replicas'
        queues). One order, decided where the requests wait."""
        limits, router = self.saturation, self.router
        if limits is None:
            return [worker for worker in router.workers if router.room(worker) != 0]
        by_thresholds = self.open_by_thresholds(limits, tenant)
        if tenant is None or not self.fair_engines:
            return by_thresholds
        open_to_tenant = {}
        for worker in router.workers:
            if router.room(worker) == 0:
                continue
            count = self.not_started(worker, tenant)
            if worker in by_thresholds or (
                count < limits.tenant_waiting and self.engine_holds(worker)
            ):
                open_to_tenant[worker] = count
        fewest = min(open_to_tenant.values(), default=0)
        return [worker for worker, count in open_to_tenant.items() if count == fewest]

    def engine_holds(self, worker: str) -> bool:
        """Whether `worker`'s engine runs all it can, so that its scheduler chooses among
        what waits there: its KV cache is full (as it last reported, at `maxKvUsage` or
        more), or a request sent there `ENGINE_HOLDS_AFTER` seconds ago or more has not
        started. (Its reported queue says less: requests sent a moment ago wait a step in
        an engine that runs everything.)"""
        limits = self.saturation
        if limits is not None and self.router.workers[worker].kv_usage >= limits.max_kv_usage:
            return True
        held = self._sent_not_started.get(worker)
        if not held:
            return False
        return self.clock() - min(held.values()) >= ENGINE_HOLDS_AFTER

    def open_by_thresholds(self, limits: Saturation, tenant: str | None) -> list[str]:
        router = self.router
        open_to_all = [
            worker
            for worker in router.workers.values()
            if self.outstanding(worker) < limits.max_outstanding
            and router.room(worker.worker_id) != 0
        ]
        below = [
            worker.worker_id
            for worker in open_to_all
            if tenant is not None
            and self.held_back_below_share(tenant)
            and self.within_share_at(worker, tenant)
        ]
        return below or [
            worker.worker_id
            for worker in open_to_all
            if worker.expected_waiting < limits.max_waiting
            and worker.kv_usage < limits.max_kv_usage
        ]

    def outstanding(self, worker: WorkerState) -> int:
        """Requests in flight on `worker` that count in `maxOutstanding`: this front's and
        its peers' (the other replicas'): one cap for the fleet, whoever sent them."""
        mine = worker.outstanding
        if self.peers is None:
            return mine
        return mine + self.peers.in_flight(worker.worker_id, mine)

    def peers_let_go(self, tenant: str) -> bool:
        """May `tenant` take an open slot, with the other replicas' queues in view? Only
        while more slots are open than they hold requests of tenants ahead of it in the
        fair order (`Peers.queued_before`); they take those slots when they hear of them.
        Without peers, and with a queue that keeps no order between tenants (fcfs), always."""
        peers, limits = self.peers, self.saturation
        if peers is None or limits is None or not self.queue.weighs_tenants:
            return True
        counter = self.queue.counter(tenant)
        if not self.queue.queued(tenant) and not peers.queued(tenant):  # joining: lifted
            counter = max(counter, min(peers.waiting_counters(), default=counter))
        ahead = peers.queued_before(tenant, counter)
        return ahead == 0 or self.open_slots(limits) > ahead

    def open_slots(self, limits: Saturation) -> int:
        """Requests the workers open to all could take before the thresholds close them:
        what their cap leaves, no more than their engine's queue has room for, at least
        one each."""
        router = self.router
        slots = 0
        for worker_id in self.open_by_thresholds(limits, None):
            worker = router.workers[worker_id]
            room = min(
                limits.max_outstanding - self.outstanding(worker),
                int(limits.max_waiting - worker.expected_waiting),
            )
            slots += max(room, 1)
        return slots

    def held_back_below_share(self, tenant: str) -> bool:
        """Is `tenant` below its share while another tenant's requests are held in the
        queue? Only then does holding `tenant` back too cost it what the others caused."""
        others_queued = any(other != tenant for other in self.queue.queued_tenants())
        return others_queued and self.queue.below_share(tenant) is not None

    def within_share_at(self, worker: WorkerState, tenant: str) -> bool:
        """Would `tenant` be within its weighted share of `worker`'s requests of its band
        from this front with one more? Only there can the engine's fair memory sharing
        protect it (it shares memory within a band; between bands, the lower's is taken
        first)."""
        weights = self.queue.weights
        band = weights.band_of(tenant)
        in_band = {f: n for f, n in worker.tenants.items() if weights.band_of(f) == band}
        part = weights.parts({*in_band, tenant})[tenant]
        share = (sum(in_band.values()) + 1) * part
        return worker.tenants.get(tenant, 0) + 1 <= share

    def may_dispatch_now(self, tenant: str) -> bool:
        """A new request of `tenant` skips the queue: nobody waits and there is room, or
        (the pool is saturated) nothing of its tenant waits and a worker is open to it
        alone: it is below its share, or (`fair_engines`) an engine that holds requests
        has fewer than `tenantWaiting` of its requests waiting."""
        if not self.queue.queued():
            return self.has_capacity(tenant) and self.peers_let_go(tenant)
        return (
            not self.queue.queued(tenant)
            and self.open_to_alone(tenant)
            and self.has_capacity(tenant)
            and self.peers_let_go(tenant)
        )

    def open_to_alone(self, tenant: str) -> bool:
        """Whether a worker is open to `tenant` beyond the fair queue's order: it is below
        its share, or its requests may wait in an engine that holds requests (there the
        engine's scheduler orders them)."""
        if self.queue.below_share(tenant) is not None:
            return True
        if not self.fair_engines or self.saturation is None:
            return False
        beyond = self.saturation.tenant_waiting
        return any(
            self.router.room(worker) != 0
            and self.not_started(worker, tenant) < beyond
            and self.engine_holds(worker)
            for worker in self.router.workers
        )

    def tenant_with_room(self) -> str | None:
        """While the pool is saturated: the queued tenant that goes next among those with
        a worker open to them alone — the one furthest below its share first, then the
        least served (the queue's counter)."""

        def rank(tenant: str) -> tuple[float, float]:
            below = self.queue.below_share(tenant)
            return (-below if below is not None else 1.0, self.queue.counter(tenant))

        for tenant in sorted(self.queue.queued_tenants(), key=rank):
            if (
                self.open_to_alone(tenant)
                and self.has_capacity(tenant)
                and self.peers_let_go(tenant)
            ):
                return tenant
        return None

    def not_started(self, worker: str, tenant: str) -> int:
        """`tenant`'s requests dispatched to `worker` that its engine has not started."""
        return self._engine_queued.get((worker, tenant), 0)

    def sent(self, worker: str, flow: str, request_id: str) -> None:
        """A request of `flow` was sent to `worker`: it waits in its engine until started."""
        key = (worker, flow)
        self._engine_queued[key] = self._engine_queued.get(key, 0) + 1
        self._sent_not_started.setdefault(worker, {})[request_id] = self.clock()

    def started(self, worker: str, flow: str, request_id: str) -> None:
        """A request `sent` to `worker` started there, or left it before it did."""
        key = (worker, flow)
        held = self._sent_not_started.get(worker)
        if held is not None:
            held.pop(request_id, None)
        left = self._engine_queued[key] - 1
        if left:
            self._engine_queued[key] = left
        else:
            del self._engine_queued[key]
