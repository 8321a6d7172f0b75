"""A pool's front: the one request lifecycle every front end runs.

Admit (hard limits) → hold (the fair queue, while the pool is saturated) → route (the
router's decision) → dispatch → observe output → settle with the engine's reported usage.
`PoolFront` owns these steps for one pool, with an injected clock and no network code:
the gateway wraps it in HTTP, and the simulator's fleet runs the same object in virtual
time, so a simulation shows what a deployed gateway configuration does.

A request becomes a `Flight` when the limits admit it. A flight is either dispatched at
once (there is room and nobody waits) or queued; a queued flight is dispatched when the
fair queue releases it — routing happens at release, so capacity is counted exactly —
and the front end hears of it through `on_release`. Every flight ends in exactly one
`settle`, whatever happened (answered, failed, cancelled, timed out in the queue), and
settlement is the only place ledgers change: the router's deficits and outstanding
counts, the fair queue's counters, the limiter's windows and concurrency, and whatever
the front end subscribed (metrics, logs, the simulator's recorder).

What a settlement charges:

- the engine reported usage: exactly that (prompt, cached prompt, completion tokens);
- dispatched, no usage (the stream was cut, the client left): the input estimate and the
  output observed, as the router and the queue charged them so far;
- never served (queued until it left, or no worker took it): nothing.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairpool.api.inference_pool import RoutingSpec, Saturation
from fairpool.api.tenant_quota import TenantLimits
from fairpool.front.capacity import CapacityGate
from fairpool.front.limits import Limiter, Rejection, Ticket
from fairpool.front.peers import Peers, ReplicaState
from fairpool.front.queue import QUEUE_RETRY_AFTER, FairQueue
from fairpool.sched.cost import CostModel, TenantWeights, Tokens
from fairpool.sched.errors import ConfigError, require_count
from fairpool.sched.registry import make_router, router_parameters
from fairpool.sched.requests import Request
from fairpool.sched.routers import ChainProfile, RouteDecision, Router, RouteRequest
from fairpool.sched.tree import Shares, flow

#: What one node of a routing prefix tree costs, in bytes, beyond its text: measured
#: (tracemalloc) between 580 and 1,400 for trees of prompts over worker URLs.
TREE_NODE_BYTES = 600

#: The status of a request whose client left before its answer ended (nginx's).
CLIENT_CLOSED = 499

#: Characters per token, for estimating the size of a prompt given as text, and for
#: converting a prefix-match threshold in characters into tokens.
CHARS_PER_TOKEN = 4


def tokens_for_chars(chars: int) -> int:
    """Tokens in `chars` characters of text, rounded up (a routing threshold given in
    characters, applied to keys of token ids)."""
    return -(-chars // CHARS_PER_TOKEN)


class NoWorker(Exception):
    """No worker of the pool can take the request (none in rotation)."""


@dataclass(frozen=True)
class FrontRequest:
    """What the front needs of a request."""

    request_id: str
    tenant: str
    key: Sequence[Any]  # the routing key: prompt text (gateway) or token ids (simulator)
    input_tokens: int  # the prompt's size: an estimate (gateway) or exact (simulator)
    output_limit: int | None = None  # most tokens it may produce; None: not given
    limits: TenantLimits = field(default_factory=TenantLimits)
    arrival: float | None = None  # when the front end received it; None: on `arrive`
    #: The band it asked to run in (only ever below its tenant's); None: its tenant's.
    band: str | None = None

    def __post_init__(self) -> None:
        require_count("input_tokens", self.input_tokens)
        if self.output_limit is not None:
            require_count("output_limit", self.output_limit)

    @property
    def reserved_tokens(self) -> int:
        """What the hard limits count it for until the engine reports its usage: the
        prompt estimate and the whole output limit."""
        return self.input_tokens + (self.output_limit or 0)


@dataclass(frozen=True)
class Usage:
    """What an engine reports it served a request."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def uncached_prompt_tokens(self) -> int:
        return max(self.prompt_tokens - self.cached_tokens, 0)


@dataclass(frozen=True)
class Outcome:
    """How a flight ended: an HTTP-style `status` (200, 4xx from the engine, 499 client
    gone, 502/503 no engine answered, 429 queue timeout), the engine's `usage` when it
    reported one, when the first token arrived, and a short `reason` for failures."""

    status: int = 200
    usage: Usage | None = None
    first_token_at: float | None = None
    reason: str | None = None
    #: Without usage: the output to charge, when the front end knows better than what
    #: was observed (a request whose output could not be seen is charged its reservation).
    output_tokens: int | None = None


@dataclass(frozen=True)
class Settlement:
    """A flight's end, as every ledger sees it."""

    pool: str
    flight: Flight
    status: int
    reason: str | None
    worker: str | None  # the worker that had it last; None if it never reached one
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reported: bool  # the token counts are the engine's, not estimates
    service: float
    dispatched_at: float | None  # when the queue let it through; None if it never did
    first_token_at: float | None
    finished_at: float

    @property
    def request(self) -> FrontRequest:
        return self.flight.request

    @property
    def flow(self) -> str:
        """What the fair order charged: the tenant, or `tenant@band` (`Flight.flow`)."""
        return self.flight.flow

    @property
    def band(self) -> str:
        return self.flight.band

    @property
    def arrival(self) -> float:
        return self.flight.arrival

    @property
    def served(self) -> bool:
        """An engine answered it (whatever the answer)."""
        return self.worker is not None and self.status < 500 and self.status != 429


class FrontListener:
    """What a front end hears from a pool's front; every hook is optional."""

    def rejected(self, pool: str, request: FrontRequest, rejection: Rejection) -> None:
        """Refused on arrival by a hard limit or the queue limit."""

    def queued(self, flight: Flight) -> None:
        """Admitted, waiting in the fair queue."""

    def dispatched(self, flight: Flight, decision: RouteDecision) -> None:
        """Routed to `decision.worker` (again, after a failed attempt)."""

    def settled(self, settlement: Settlement) -> None:
        """Over, and charged."""


class Phase(enum.Enum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"  # admitted by the queue; routed unless an attempt failed
    SETTLED = "settled"


class Flight:
    """One admitted request from the limits to its settlement. A front end that is told
    of a release (`on_release`) checks `settled`: a release whose routing failed is
    settled at once."""

    __slots__ = (
        "arrival",
        "band",
        "context",
        "decision",
        "dispatched_at",
        "flow",
        "front",
        "output_tokens",
        "phase",
        "request",
        "started",
        "ticket",
    )

    def __init__(self, front: PoolFront, request: FrontRequest, ticket: Ticket) -> None:
        self.front = front
        self.request = request
        self.ticket = ticket
        shares = front.queue.weights
        tenant_band = shares.tenant_band(request.tenant)
        #: What the fair order schedules it as: its tenant in its band, `tenant@band` below.
        self.flow = flow(request.tenant, request.band, tenant_band)
        self.band = request.band or tenant_band
        self.phase = Phase.QUEUED
        self.decision: RouteDecision | None = None
        self.arrival = front.clock() if request.arrival is None else request.arrival
        self.dispatched_at: float | None = None
        self.output_tokens = 0  # observed so far
        #: The engine began serving it: it no longer waits in the engine's queue.
        self.started = False
        self.context: Any = None  # the front end's own (the gateway's waiter)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def tenant(self) -> str:
        return self.request.tenant

    @property
    def queued(self) -> bool:
        return self.phase is Phase.QUEUED

    @property
    def settled(self) -> bool:
        return self.phase is Phase.SETTLED

    def undispatch(self) -> None:
        """The worker never took the request (failed before its first byte): nothing was
        served there, so its charge on that worker is refunded. The flight keeps its
        place in the pool and may `redispatch`."""
        if self.phase is not Phase.DISPATCHED or self.decision is None:
            raise ConfigError("flight", f"{self.request_id!r} is not dispatched")
        self.front.left_engine_queue(self)
        self.front.router.complete(self.request_id, 0, 0)
        self.decision = None
        self.started = False

    def redispatch(self) -> RouteDecision:
        """Route again after `undispatch`; NoWorker if no worker is in rotation."""
        if self.phase is not Phase.DISPATCHED or self.decision is not None:
            raise ConfigError("flight", f"{self.request_id!r} is not waiting for a worker")
        return self.front._route(self)

    def observe_output(self, tokens: int) -> None:
        """`tokens` more output tokens reached the client; charged in the fair queue now,
        corrected to the engine's usage at settlement. The first means it has started."""
        if self.phase is Phase.DISPATCHED and tokens:
            self.output_tokens += tokens
            self.front.queue.record_output(self.request_id, tokens)
            self.start()

    def start(self) -> None:
        """The engine began serving it (the simulator sees its admission; the gateway, its
        first token): it waits in the engine's queue no more, so its tenant may send the
        engine another (`PoolFront.fair_engines`)."""
        if self.phase is Phase.DISPATCHED and self.decision is not None and not self.started:
            self.front.left_engine_queue(self)
            self.started = True
            if self.front.fair_engines:
                self.front.release_waiting()

    def left_by_client(self, sent: bool, streamed: bool) -> Outcome:
        """What it is charged, its client having left before its answer ended
        (`fairpool.front.charges`): its whole output reservation if it was `sent` to an
        engine and not `streamed`; what was observed of a stream; nothing if never sent
        (a flight routed and never sent is undispatched)."""
        if self.settled:
            return Outcome(CLIENT_CLOSED, reason="client_closed")
        if sent and not streamed:
            reserved = self.request.output_limit or 0
            return Outcome(CLIENT_CLOSED, reason="client_closed", output_tokens=reserved)
        if self.decision is not None and not sent:
            self.undispatch()  # routed, never sent: nothing served
        return Outcome(CLIENT_CLOSED, reason="client_closed")

    def expire(self) -> Rejection | None:
        """The queue timeout passed: a flight still queued leaves, charged nothing, and
        the Rejection to give its client is returned (None if it was released first)."""
        if self.phase is not Phase.QUEUED:
            return None
        timeout = self.front.queue_timeout
        rejection = Rejection(
            "queue_timeout",
            QUEUE_RETRY_AFTER,
            f"no worker became free within the queue timeout of {timeout:g} s",
        )
        self.settle(Outcome(status=429, reason=rejection.reason))
        return rejection

    def settle(self, outcome: Outcome) -> Settlement | None:
        """End the flight and charge it (see the module's docstring); only the first call
        counts, so every exit path of a front end may call it."""
        if self.phase is Phase.SETTLED:
            return None
        return self.front._settle(self, outcome)


Ledger = Callable[[Settlement], None]


class PoolFront:
    """Limits, fair queue, router and settlement of one pool."""

    def __init__(
        self,
        name: str,
        router: Router,
        queue: FairQueue,
        limiter: Limiter,
        cost: CostModel,
        saturation: Saturation | None = None,
        queue_timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        on_release: Callable[[Flight], None] | None = None,
        wait_for_workers: bool = True,
        fair_engines: bool = False,
    ) -> None:
        self.name = name
        self.router = router
        self.queue = queue
        self.limiter = limiter
        self.cost = cost
        #: When a request may go, and to which workers (`fairpool.front.capacity`).
        self.gate = CapacityGate(router, queue, saturation, fair_engines, clock)
        self.queue_timeout = queue_timeout
        #: While no worker is in rotation: queue requests (True), or refuse them (NoWorker).
        self.wait_for_workers = wait_for_workers
        self.clock = clock
        self.on_release = on_release
        self.listeners: list[FrontListener] = []
        self._flights: dict[str, Flight] = {}  # every flight not settled yet
        self._queued: dict[str, Flight] = {}
        self._releasing = False
        self._release_again = False
        # Every ledger hears every settlement, in this order, then the listeners.
        self._ledgers: list[Ledger] = [self._settle_router, self._settle_queue, self._settle_limits]

    @classmethod
    def for_routing(
        cls,
        name: str,
        routing: RoutingSpec,
        cost: CostModel,
        weights: Mapping[str, float],
        limiter: Limiter,
        *,
        max_tree_bytes: int | None = None,
        chains: Mapping[str, ChainProfile] | None = None,
        saturated_when: Saturation | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_release: Callable[[Flight], None] | None = None,
        fair_engines: bool = False,
    ) -> PoolFront:
        """A pool's front as its `RoutingSpec` describes it, routing on prompt text.
        `max_tree_bytes` bounds the prefix tree's memory: half for its text (a byte a
        character) and half for its nodes (TREE_NODE_BYTES each)."""
        options: dict[str, Any] = {
            "worker_quantum": routing.worker_quantum,
            "min_match": routing.min_match_chars,
            "max_tree_tokens": max_tree_bytes and max_tree_bytes // 2,
            "max_tree_nodes": max_tree_bytes and max_tree_bytes // (2 * TREE_NODE_BYTES),
            "chains": chains,
        }
        return cls.build(
            name,
            routing.policy,
            cost,
            weights,
            limiter,
            router_options=options,
            queue_policy=routing.queue_policy,
            saturation=saturated_when,
            queue_timeout=routing.queue_timeout_seconds,
            clock=clock,
            on_release=on_release,
            wait_for_workers=routing.wait_for_workers,
            fair_engines=fair_engines,
        )

    @classmethod
    def build(
        cls,
        name: str,
        router: str,
        cost: CostModel,
        weights: Mapping[str, float],
        limiter: Limiter,
        *,
        workers: Iterable[str] = (),
        router_options: Mapping[str, Any] | None = None,
        queue_policy: str = "vtc",
        clock: Callable[[], float] = time.monotonic,
        **front: Any,
    ) -> PoolFront:
        """A pool's front — router, fair queue, capacity gate, lifecycle — as the gateway
        (`for_routing`) and the simulator build it: the router named `router` with those of
        `router_options` it takes and that are set, a fair queue of `queue_policy`, and
        `front` (saturation, queue timeout, ...) as `PoolFront` takes them."""
        accepted = router_parameters(router)
        options = {key: value for key, value in (router_options or {}).items() if value}
        made = make_router(
            router,
            workers,
            cost=cost,
            weights=weights,
            **{key: value for key, value in options.items() if key in accepted},
        )
        queue = FairQueue(cost, weights, policy=queue_policy, clock=clock)
        return cls(name, made, queue, limiter, cost, clock=clock, **front)

    # ------------------------------------------------------------------ the capacity gate

    @property
    def saturation(self) -> Saturation | None:
        """When a worker counts as full; None: never (only a router's own room limits)."""
        return self.gate.saturation

    @saturation.setter
    def saturation(self, saturation: Saturation | None) -> None:
        self.gate.saturation = saturation

    @property
    def fair_engines(self) -> bool:
        """The engines keep the tenants' weights among the requests they hold."""
        return self.gate.fair_engines

    @property
    def peers(self) -> Peers | None:
        """The gateway's other replicas, when they share their queues (`share_with`)."""
        return self.gate.peers

    def has_capacity(self, tenant: str | None = None) -> bool:
        """Whether a request (of `tenant`, a flow) may be dispatched now. The front keeps
        "nobody waits while there is capacity for them" true after each of its calls;
        capacity changes must therefore reach it through them (`set_rotation`,
        `update_load`, `set_saturation`, `settle`)."""
        return self.gate.has_capacity(tenant)

    def workers_with_room(self, tenant: str | None = None) -> list[str]:
        """The workers a request (of `tenant`) may go to now (`CapacityGate`)."""
        return self.gate.workers_with_room(tenant)

    def not_started(self, worker: str, tenant: str) -> int:
        """`tenant`'s requests sent to `worker` that its engine has not started."""
        return self.gate.not_started(worker, tenant)

    # ------------------------------------------------------------------ requests

    def arrive(self, request: FrontRequest) -> Flight:
        """Admit `request` under its tenant's limits and dispatch it, or queue it while the
        pool is saturated. Raises `Rejection` (counted nowhere but by the listeners) when a
        hard limit or the queue limit refuses it, and `NoWorker` (settled) when no worker
        is in rotation and the front does not wait for one."""
        if request.request_id in self._flights:
            raise ConfigError("request_id", f"{request.request_id!r} is already in flight")
        try:
            ticket = self.limiter.admit(
                request.tenant, request.limits, request.reserved_tokens, request.request_id
            )
        except Rejection as rejection:
            self.tell_rejected(request, rejection)
            raise
        flight = Flight(self, request, ticket)
        self._flights[request.request_id] = flight
        if not self.router.workers and not self.wait_for_workers:
            flight.phase = Phase.DISPATCHED  # admitted, and no worker to take it
            flight.settle(Outcome(status=503, reason="no_worker"))
            raise NoWorker(f"pool {self.name!r} has no model server in rotation")
        scheduled = Request(
            request.request_id,
            flight.flow,
            request.input_tokens,
            max(request.output_limit or 0, 1),
            arrival=flight.arrival,  # its deadline's start, where its band has deadlines
        )
        try:
            if self.gate.may_dispatch_now(flight.flow):
                self.queue.admit_now(scheduled)
                flight.phase = Phase.DISPATCHED
            else:
                self.queue.enqueue(scheduled, request.limits.queued)
        except Rejection as rejection:
            del self._flights[request.request_id]
            self.limiter.settle(ticket, 0)
            self.tell_rejected(request, rejection)
            raise
        except BaseException:
            del self._flights[request.request_id]
            self.limiter.settle(ticket, 0)
            raise
        if flight.phase is Phase.DISPATCHED:
            self._route_or_settle(flight)
            if self.queue.queued():  # one more in flight moves the shares: a queued tenant
                self.release_waiting()  # may now be below its own, with room to go
        else:
            self._queued[request.request_id] = flight
            for listener in self.listeners:
                listener.queued(flight)
        return flight

    def share_with(self, peers: Peers) -> None:
        """Decide with the gateway's other replicas (`fairpool.front.peers`): their
        requests count in the saturation cap, their queued tenants in the fair order."""
        self.gate.peers = peers
        self.queue.wait_with(peers.waiting_counters, peers.queued)
        self.release_waiting()

    def replica_state(self) -> ReplicaState:
        """What this front holds, as it tells the other replicas."""
        in_flight = {
            worker.worker_id: worker.outstanding
            for worker in self.router.workers.values()
            if worker.outstanding
        }
        queue = self.queue
        queued = {
            tenant: (queue.queued(tenant), queue.counter(tenant))
            for tenant in queue.queued_tenants()
        }
        return ReplicaState(in_flight, queued)

    def charged_elsewhere(self, tenant: str, worker: str, service: float) -> None:
        """Another replica's request of `tenant` was charged `service` on `worker`: it
        counts in this replica's routing (D2LPM's deficits) and fair order as its own."""
        self.router.charge_elsewhere(tenant, worker, service)
        self.queue.charge_elsewhere(tenant, service)

    def release_waiting(self) -> None:
        """Capacity may have freed: release queued flights in fair order while the pool
        has room, routing each and telling the front end (`on_release`). Safe to call at
        any time, from within a release too."""
        if self._releasing:
            self._release_again = True
            return
        self._releasing = True
        try:
            self._release_again = True
            while self._release_again:
                self._release_again = False
                while self.queue.queued():
                    if self.has_capacity():  # a slot open to all: the fair order's
                        tenant = self.queue.next_tenant()
                        if tenant is not None and not self.gate.peers_let_go(tenant):
                            break
                    else:  # saturated: a tenant a worker is open to alone goes
                        tenant = self.gate.tenant_with_room()
                    request_id = None if tenant is None else self.queue.release(tenant)
                    if request_id is None:
                        break
                    flight = self._queued.pop(request_id)
                    flight.phase = Phase.DISPATCHED
                    with contextlib.suppress(Exception):  # settled: its front end sees that
                        self._route_or_settle(flight)
                    if self.on_release is not None:
                        self.on_release(flight)
        finally:
            self._releasing = False

    # ------------------------------------------------------------------ workers and weights

    def set_rotation(self, workers: Iterable[str]) -> tuple[list[str], list[str]]:
        """Make `workers` the ones in rotation; returns (added, removed). Requests in
        flight on a removed worker settle without touching a worker re-added later."""
        wanted = set(workers)
        removed = [worker for worker in self.router.workers if worker not in wanted]
        for worker in removed:
            self.router.remove_worker(worker)
        added = sorted(wanted - set(self.router.workers))
        for worker in added:
            self.router.add_worker(worker)
        if added:
            self.release_waiting()
        return added, removed

    def set_saturation(self, saturation: Saturation | None) -> None:
        """New saturation thresholds (None: none)."""
        self.saturation = saturation
        self.release_waiting()

    def update_load(self, worker: str, kv_usage: float, waiting: int) -> None:
        """What `worker`'s engine reports of its load (it must be in rotation)."""
        self.router.update_load(worker, kv_usage=kv_usage, waiting=waiting)
        self.release_waiting()

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """New weights (with their bands and groups, when a `Shares`)."""
        table = Shares.of(weights if isinstance(weights, TenantWeights) else dict(weights))
        self.router.set_weights(table)
        self.queue.set_weights(table)

    # ------------------------------------------------------------------ state

    def tenant_state(self) -> dict[str, dict[str, Any]]:
        """Per tenant: the queue's counter, service, queued and in-flight requests and
        longest wait, and the router's per-worker state (D2LPM deficits)."""
        state: dict[str, dict[str, Any]] = {
            tenant: dict(values) for tenant, values in self.queue.state().items()
        }
        for tenant, per_worker in self.router.tenant_state().items():
            state.setdefault(tenant, {})["deficits"] = per_worker
        return state

    # ------------------------------------------------------------------ internals

    def left_engine_queue(self, flight: Flight) -> None:
        """`flight` started in its engine, or left its worker before it did."""
        if not flight.started and flight.decision is not None:
            self.gate.started(flight.decision.worker, flight.flow, flight.request_id)

    def _route_or_settle(self, flight: Flight) -> RouteDecision:
        """Route a flight the queue admitted; if that fails, the flight is settled (nothing
        served) before the error propagates."""
        try:
            return self._route(flight)
        except NoWorker:
            flight.settle(Outcome(status=503, reason="no_worker"))
            raise
        except BaseException:
            flight.settle(Outcome(status=500, reason="internal_error"))
            raise

    def _route(self, flight: Flight) -> RouteDecision:
        if not self.router.workers:
            raise NoWorker(f"pool {self.name!r} has no worker in rotation")
        request = flight.request
        eligible = None if self.saturation is None else self.workers_with_room(flight.flow)
        if eligible == []:  # a worker failed and the others are full: wait no longer
            eligible = None
        decision = self.router.route(
            RouteRequest(request.request_id, flight.flow, request.key, request.input_tokens),
            eligible,
        )
        flight.decision = decision
        self.gate.sent(decision.worker, flight.flow, flight.request_id)
        if flight.dispatched_at is None:
            flight.dispatched_at = self.clock()
        for listener in self.listeners:
            listener.dispatched(flight, decision)
        return decision

    def _settle(self, flight: Flight, outcome: Outcome) -> Settlement:
        was = flight.phase
        if was is Phase.DISPATCHED:
            self.left_engine_queue(flight)
        flight.phase = Phase.SETTLED
        self._flights.pop(flight.request_id, None)
        if was is Phase.QUEUED:
            self._queued.pop(flight.request_id, None)
            self.queue.withdraw(flight.request_id)
        settlement = self._settlement(flight, outcome, was)
        for ledger in self._ledgers:
            ledger(settlement)
        for listener in self.listeners:
            listener.settled(settlement)
        self.release_waiting()
        return settlement

    def _settlement(self, flight: Flight, outcome: Outcome, was: Phase) -> Settlement:
        request, usage = flight.request, outcome.usage
        worker = flight.decision.worker if flight.decision is not None else None
        if usage is not None:
            prompt, cached, completion = (
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
            )
        elif worker is not None:
            completion = flight.output_tokens
            if outcome.output_tokens is not None:
                completion = max(completion, outcome.output_tokens)
            prompt, cached = request.input_tokens, 0
        else:
            prompt = cached = completion = 0
        return Settlement(
            pool=self.name,
            flight=flight,
            status=outcome.status,
            reason=outcome.reason,
            worker=worker,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
            reported=usage is not None,
            service=self.cost.service(max(prompt - cached, 0), completion),
            dispatched_at=flight.dispatched_at if was is not Phase.QUEUED else None,
            first_token_at=outcome.first_token_at,
            finished_at=self.clock(),
        )

    # The ledgers. Each takes from a settlement what it keeps.

    def _settle_router(self, settlement: Settlement) -> None:
        if settlement.worker is None:
            return
        extend = (
            settlement.prompt_tokens - settlement.cached_tokens if settlement.reported else None
        )
        self.router.complete(settlement.request.request_id, settlement.completion_tokens, extend)

    def _settle_queue(self, settlement: Settlement) -> None:
        if settlement.worker is None:
            served = Tokens(extend=0, output=0)
        elif settlement.reported:
            served = Tokens(
                extend=settlement.prompt_tokens - settlement.cached_tokens,
                output=settlement.completion_tokens,
            )
        else:
            served = Tokens(output=settlement.completion_tokens)
        self.queue.finish(settlement.request.request_id, served)

    def _settle_limits(self, settlement: Settlement) -> None:
        tokens = settlement.prompt_tokens + settlement.completion_tokens
        self.limiter.settle(settlement.flight.ticket, tokens)

    def tell_rejected(self, request: FrontRequest, rejection: Rejection) -> None:
        """Tell the listeners a limit refused `request` (the front's own limits, or limits
        the front end checked before `arrive`, such as limits shared by replicas)."""
        for listener in self.listeners:
            listener.rejected(self.name, request, rejection)
