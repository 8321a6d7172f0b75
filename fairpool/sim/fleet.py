"""A fleet in virtual time: N engines behind a pool's front, a trace of requests.

The front is the gateway's own (`fairpool.front.PoolFront`): hard limits, the fair queue
while the pool is saturated, the router, and settlement with the usage the engines report —
so a simulation shows what a deployed gateway configuration does. Without saturation
thresholds (the default, and the papers' setting) every admitted request is routed at once.

Events are processed in time order: a front event (a completion reaching the front, a
queued request's timeout), an arrival, or an engine step, in that order at equal times. An
arrival is admitted and routed at its arrival time (the front sees the completions that
happened before it); an engine runs its next step at its own clock, seeing every request
dispatched to it up to then. Engines report admissions, completions and cache evictions;
the fleet settles completions with the front (D2LPM's stream 2, with the engine's cached
prompt tokens) and passes evictions to the router (stream 3).

A trace request whose client hangs up (`cancel_after`) before it ends leaves wherever it
is — the front's queue, or its engine (`SimEngine.abort`) — and is settled by the core's
rule for a client gone (`Flight.left_by_client`), as the gateway settles it. A hang-up
during the engine step that finishes the request comes too late: a step is atomic.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

from fairpool.api.inference_pool import Saturation
from fairpool.api.tenant_quota import TenantLimits, tenant_id
from fairpool.front import (
    Flight,
    FrontListener,
    FrontRequest,
    NoWorker,
    Outcome,
    PoolFront,
    Rejection,
    Settlement,
    TenantLimiter,
    Usage,
)
from fairpool.front.charges import output_reservation
from fairpool.front.replicas import share_among
from fairpool.sched.batch import BatchPlan
from fairpool.sched.cost import CostModel, TenantWeights
from fairpool.sched.errors import (
    ConfigError,
    require_count,
    require_non_negative,
    require_positive,
)
from fairpool.sched.registry import (
    make_policy,
    policy_parameters,
)
from fairpool.sched.requests import Request
from fairpool.sched.tree import Shares, require_band
from fairpool.sim.engine import Admission, Completion, SimEngine, StepTime
from fairpool.sim.metrics import Recorder
from fairpool.sim.profiles import Profile
from fairpool.sim.trace import Segment, SegmentTokens, TraceRequest

POOL = "pool"


@dataclass(frozen=True)
class FleetConfig:
    workers: int = 1
    policy: str = "dlpm"
    router: str = "d2lpm"
    memory_tokens: int = 10_000
    token_budget: int = 2048
    step_time: StepTime = field(default_factory=StepTime)
    admission: Admission = "paged"
    block_size: int = 1
    quantum: float | None = None
    worker_quantum: float | None = None
    min_match: int = 0  # routing prefix matches shorter than this many tokens count as none
    # The model's context (the pool's `model.maxModelLen`; None: not said): a request's
    # output reservation is capped by what it leaves after the prompt, as the gateway does.
    max_model_len: int | None = None
    cost: CostModel = field(default_factory=CostModel)
    weights: TenantWeights = field(default_factory=TenantWeights)
    # The gateway's front: when a worker counts as full (None: never, requests are routed
    # at once), the fair queue's order and timeout, and each tenant's hard limits.
    saturation: Saturation | None = None
    queue_policy: str = "vtc"
    queue_timeout: float = 60.0
    limits: Mapping[str, TenantLimits] = field(default_factory=dict)
    rpm_limit: int | None = None  # requests per minute for tenants without `limits`
    # Seconds before the engines join the pool's rotation (a pool starting, or waking from
    # zero): requests that arrive earlier wait in the front's queue, or with
    # `wait_for_workers` off are refused (503), as the gateway's pool option says.
    cold_start: float = 0.0
    wait_for_workers: bool = True
    policy_params: Mapping[str, Any] = field(default_factory=dict)  # e.g. alpha, beta
    # Gateway replicas in front of the engines, each a front of its own (queue, router,
    # saturation counts) sharing the hard limits (as replicas with `sharedState` do);
    # requests reach them round robin (`spread`), or each tenant through one (`tenant`).
    gateway_replicas: int = 1
    replica_traffic: Literal["spread", "tenant"] = "spread"
    # The gateway's `fairEngines`; None: as the engines' policy says (vtc, dlpm: on).
    fair_engines: bool | None = None
    # Replicas tell each other what each request was charged on its worker, and what
    # each holds (`fairpool.front.peers`), as the gateway's replicas do through the
    # shared state: D2LPM's deficits, the fair queue's order and the saturation cap span
    # them all (off: each replica decides on its own requests alone).
    share_state: bool = True

    def __post_init__(self) -> None:
        require_count("workers", self.workers, minimum=1)
        require_count("memory_tokens", self.memory_tokens, minimum=1)
        require_count("token_budget", self.token_budget, minimum=1)
        require_count("block_size", self.block_size, minimum=1)
        require_count("min_match", self.min_match)
        require_positive("queue_timeout", self.queue_timeout)
        require_non_negative("cold_start", self.cold_start)
        require_count("gateway_replicas", self.gateway_replicas, minimum=1)
        if self.max_model_len is not None:
            require_count("max_model_len", self.max_model_len, minimum=1)
        if self.rpm_limit is not None:
            require_count("rpm_limit", self.rpm_limit, minimum=1)

    def limits_of(self, tenant: str) -> TenantLimits:
        limits = self.limits.get(tenant)
        if limits is not None:
            return limits
        if self.rpm_limit is None:
            return _UNLIMITED
        return TenantLimits(requestsPerMinute=self.rpm_limit)

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        memory_tokens: int | None = None,
        block_size: int | None = None,
        **settings: Any,
    ) -> FleetConfig:
        """Engines as the profile describes them (memory, budget, step time, admission,
        KV block size)."""
        return cls(
            memory_tokens=memory_tokens or profile.memory_tokens,
            token_budget=profile.token_budget,
            step_time=profile.step_time,
            admission=profile.admission,
            block_size=block_size or profile.block_size,
            **settings,
        )


_UNLIMITED = TenantLimits()


@dataclass(frozen=True)
class ClosedLoop:
    """A tenant's clients that each keep one request in flight: `streams` of them, each
    sending its next request `think_time` seconds after its last one ended (or after a
    refusal's Retry-After) — as `fairpool load --concurrency` and most production clients
    do. Every request is the tenant's shared `prefix` (a system prompt: cacheable), a
    `question` of its own, and `output_tokens` of answer, in `band` (None: the tenant's;
    only a lower one may be asked)."""

    tenant: str
    streams: int
    prefix: int
    question: int
    output_tokens: int
    think_time: float = 0.0
    band: str | None = None

    def __post_init__(self) -> None:
        tenant_id(self.tenant, "tenant")
        require_count("streams", self.streams, minimum=1)
        require_count("prefix", self.prefix)
        require_count("question", self.question, minimum=1)
        require_count("output_tokens", self.output_tokens, minimum=1)
        require_non_negative("think_time", self.think_time)
        if self.band is not None:
            require_band(self.band)

    def request(self, now: float) -> TraceRequest:
        segments: tuple[Segment, ...] = ((None, self.question),)
        if self.prefix:
            segments = ((f"system-{self.tenant}", self.prefix), *segments)
        output = self.output_tokens
        return TraceRequest(now, self.tenant, segments, output, output, band=self.band)


class Fleet:
    """Engines behind a pool's front, driven through a trace in virtual time."""

    def __init__(self, config: FleetConfig, seed: int = 0) -> None:
        self.config = config
        self.tokens = SegmentTokens(seed)
        self.now = 0.0
        #: The fair order's tree (bands, groups) of the weights: each request's flow.
        self.shares = Shares.of(config.weights)
        self.engines = [
            SimEngine(
                self._policy(),
                memory_tokens=config.memory_tokens,
                token_budget=config.token_budget,
                step_time=config.step_time,
                admission=config.admission,
                block_size=config.block_size,
                name=f"w{index}",
                listener=self,
            )
            for index in range(config.workers)
        ]
        self._positions = {engine.name: position for position, engine in enumerate(self.engines)}
        self.recorder = Recorder(self.shares, [engine.name for engine in self.engines])
        self._busy: list[tuple[float, int]] = []  # see run()
        limiter = TenantLimiter(clock=self._clock)  # the replicas' shared state
        #: The gateway's replicas (one unless `gateway_replicas` says more).
        self.fronts = [self._front(limiter) for _ in range(config.gateway_replicas)]
        self._tenant_front: dict[str, PoolFront] = {}  # `tenant` traffic: its replica
        # Completions reaching the front and queue timeouts: (time, sequence, event).
        self._front_events: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = 0
        self._trace: dict[str, tuple[TraceRequest, Sequence[int]]] = {}
        self._flights: dict[str, Flight] = {}
        self._streams: dict[str, ClosedLoop] = {}  # request id → its closed-loop client
        #: Trace requests that wait for another (`after`), by the segment they wait for.
        self._held: dict[str, list[tuple[int, TraceRequest]]] = {}
        self._awaited: dict[str, str] = {}  # request id → its output segment, awaited
        self._sent = 0
        self._end = math.inf
        for front in self.fronts:
            front.listeners.append(_StreamsListener(self))
        if config.share_state and len(self.fronts) > 1:
            share_among(self.fronts)
        if config.cold_start:
            names = list(self._positions)
            for front in self.fronts:
                front.set_rotation([])
            self._at(config.cold_start, lambda: self._join(names))

    def _front(self, limiter: TenantLimiter) -> PoolFront:
        config = self.config
        fair_engines = config.fair_engines
        if fair_engines is None:
            fair_engines = self.engines[0].policy.weighs_tenants
        return PoolFront.build(
            POOL,
            config.router,
            config.cost,
            config.weights,
            limiter,
            workers=[engine.name for engine in self.engines],
            router_options={"worker_quantum": config.worker_quantum, "min_match": config.min_match},
            queue_policy=config.queue_policy,
            saturation=config.saturation,
            queue_timeout=config.queue_timeout,
            clock=self._clock,
            on_release=self._submit,
            wait_for_workers=config.wait_for_workers,
            fair_engines=fair_engines,
        )

    @property
    def front(self) -> PoolFront:
        """The first replica's front (the only one unless `gateway_replicas` > 1)."""
        return self.fronts[0]

    @property
    def router(self) -> Any:
        return self.front.router

    def _front_for(self, index: int, tenant: str) -> PoolFront:
        """Which replica request number `index` of `tenant` enters through."""
        if self.config.replica_traffic == "spread":
            return self.fronts[index % len(self.fronts)]
        front = self._tenant_front.get(tenant)
        if front is None:  # tenants take the replicas in turn, in order of first arrival
            front = self.fronts[len(self._tenant_front) % len(self.fronts)]
            self._tenant_front[tenant] = front
        return front

    def fairness_bound(self) -> float | None:
        """The bound a theorem gives on the gap between the weighted service of two tenants
        with requests waiting in the engines (`max_fully_backlogged_service_gap`), with the
        parameters in force (an `auto` quantum as it grew) and U from the largest prompt
        admitted:

        - one worker: its policy's (VTC Theorem 4.4: 2U; DLPM Theorem 4.1: 2(U + Q)).
          Without a gateway queue or closed-loop clients, demand waits nowhere else, and
          `max_backlogged_service_gap` is the same measure;
        - DLPM engines behind D2LPM: 2·|W|·(U + Q) (DLPM Theorem 5.1), from the engine
          with the largest U + Q. The theorem's tenants are backlogged on every worker; a
          tenant waiting at some workers only, at the gateway or at its client is outside
          it, and `max_backlogged_service_gap` may exceed it.

        Other combinations have no theorem: None.
        """
        found = [engine.policy.service_bound(engine.memory_tokens) for engine in self.engines]
        bounds = [bound for bound in found if bound is not None]
        if not bounds or len(bounds) < len(found):
            return None
        if len(bounds) == 1:
            return bounds[0]
        if self.config.router == "d2lpm" and self.config.policy.split("+")[0] == "dlpm":
            return len(bounds) * max(bounds)
        return None

    def summary(self) -> dict[str, Any]:
        """The recorder's summary (`fairpool sim --json`) with the bound and the quanta
        in force."""
        return {**self.recorder.summary(fairness_bound=self.fairness_bound()), **self.quanta()}

    def quanta(self) -> dict[str, float | None]:
        """The quanta in force: DLPM's Q (the largest over the engines) and D2LPM's Q^w;
        None where the policy or router has none."""
        engine_quanta = [engine.policy.quantum for engine in self.engines]
        known = [value for value in engine_quanta if value is not None]
        return {
            "quantum": max(known) if known else None,
            "worker_quantum": self.router.worker_quantum,
        }

    def _clock(self) -> float:
        return self.now

    def _policy(self) -> Any:
        params: dict[str, Any] = dict(self.config.policy_params)
        if self.config.quantum is not None:
            if "quantum" not in policy_parameters(self.config.policy):
                raise ConfigError(
                    "quantum", f"policy {self.config.policy!r} does not take a quantum"
                )
            params["quantum"] = self.config.quantum
        weights = self.shares.without_deadlines()  # as the engines' configuration has them
        return make_policy(self.config.policy, cost=self.config.cost, weights=weights, **params)

    # ------------------------------------------------------------------ running

    def run(
        self,
        trace: Sequence[TraceRequest],
        duration: float | None = None,
        progress: Callable[[float], None] | None = None,
        clients: Sequence[ClosedLoop] = (),
    ) -> Recorder:
        """Serve `trace`, and the closed-loop `clients`, until everything finished (a
        trace alone), or until `duration` virtual seconds (needed with clients)."""
        if clients and duration is None:
            raise ConfigError("duration", "closed-loop clients need a duration to stop")
        named = [(f"request {index}", request) for index, request in enumerate(trace)]
        named += [(f"--client {client.tenant}", client.request(0.0)) for client in clients]
        self._check_requests(named)
        end = math.inf if duration is None else duration
        self._end = self.recorder.horizon = end
        self._sent = len(trace)
        ready = self._hold_dependents(trace)
        for client in clients:
            if client.think_time == 0:  # its next request is always ready: backlogged
                self.recorder.client_waiting(self._flow(client.request(0.0)), +1, 0.0)
            for _ in range(client.streams):
                self._at(0.0, lambda client=client: self._send(client))  # type: ignore[misc]
        arrivals = sorted(ready, key=lambda item: (item[1].t, item[0]))
        next_arrival = 0
        # Busy engines by (clock, position): only an engine's own step moves its clock
        # while it is busy, and only a step (done, or stalled: requests wait but the
        # policy admits none into an empty engine) or a dispatch (busy) changes that.
        self._busy = [
            (engine.now, position)
            for position, engine in enumerate(self.engines)
            if not engine.idle()
        ]
        heapq.heapify(self._busy)
        while True:
            front_time = self._front_events[0][0] if self._front_events else math.inf
            arrival_time = arrivals[next_arrival][1].t if next_arrival < len(arrivals) else math.inf
            engine_time = self._busy[0][0] if self._busy else math.inf
            moment = min(front_time, arrival_time, engine_time)
            if moment == math.inf or moment >= end:
                break
            self.now = moment
            if front_time == moment:
                _, _, event = heapq.heappop(self._front_events)
                event()
            elif arrival_time == moment:
                index, request = arrivals[next_arrival]
                self._arrive(index, request)
                next_arrival += 1
            else:
                _, position = heapq.heappop(self._busy)
                self._step(self.engines[position])
            if progress is not None:
                progress(moment)
        # The run lasted until `end` if work was left then, else until its last event.
        ran_until = end if moment != math.inf else self.now
        self._drain_front_events()
        self.recorder.close(ran_until)
        return self.recorder

    def _hold_dependents(self, trace: Sequence[TraceRequest]) -> list[tuple[int, TraceRequest]]:
        """Set aside the requests that wait for another (`after`), to be sent when it
        finishes; returns the others, numbered. ConfigError if one waits for a segment no
        request of the trace generates."""
        producers = {
            request.output_segment: f"q{index}"
            for index, request in enumerate(trace)
            if request.output_segment is not None
        }
        ready = []
        for index, request in enumerate(trace):
            if request.after is None:
                ready.append((index, request))
            elif request.after not in producers:
                raise ConfigError(
                    f"request {index}: after", f"no request generates {request.after!r}"
                )
            else:
                self._held.setdefault(request.after, []).append((index, request))
                self._awaited[producers[request.after]] = request.after
        return ready

    def _release(self, segment: str) -> None:
        """The request generating `segment` finished: send those waiting for it, now or
        at their own time if later."""
        for index, request in self._held.pop(segment, []):
            moment = max(request.t, self.now)
            waited = replace(request, t=moment)
            self._at(moment, partial(self._arrive, index, waited))

    def _send(self, client: ClosedLoop, held: bool = False) -> None:
        """One stream of a closed-loop client sends its next request, now (`held`: it was
        due since the stream's think time ended, and waited at the client)."""
        if held:
            self.recorder.client_waiting(self._flow(client.request(self.now)), -1, self.now)
        if self.now >= self._end:
            return
        index, self._sent = self._sent, self._sent + 1
        request_id = f"q{index}"
        self._streams[request_id] = client
        self._arrive(index, client.request(self.now))

    def _stream_ended(self, request_id: str, retry_after: float = 0.0) -> None:
        """A stream's request ended: its next is due after the think time, and sent then,
        or when a refusal's Retry-After lets it (due meanwhile: backlogged at the client)."""
        client = self._streams.pop(request_id, None)
        if client is None:
            return
        due = self.now + client.think_time
        send = max(due, self.now + retry_after)
        held = due < send and due < self._end
        if held:
            flow_id = self._flow(client.request(due))
            self._at(due, lambda: self.recorder.client_waiting(flow_id, +1, due))
        self._at(send, lambda: self._send(client, held))

    def _flow(self, request: TraceRequest) -> str:
        """The flow the fair order runs `request` in: its tenant, or `tenant@band`."""
        return request.flow(self.shares)

    def _arrive(self, index: int, trace_request: TraceRequest) -> None:
        tenant = trace_request.tenant
        request = Request(  # what the engine schedules: in its flow, as the gateway tags it
            f"q{index}",
            self._flow(trace_request),
            trace_request.prompt_tokens,
            trace_request.max_tokens,
            arrival=trace_request.t,
            slo=trace_request.slo,
        )
        tokens = self.tokens.tokens(trace_request.segments)
        front_request = FrontRequest(
            request.request_id,
            tenant,
            tokens,
            request.prompt_tokens,
            output_reservation(
                request.max_tokens, 1, request.prompt_tokens, self.config.max_model_len
            ),
            self.config.limits_of(tenant),
            arrival=request.arrival,
            band=trace_request.band,
        )
        try:
            flight = self._front_for(index, tenant).arrive(front_request)
        except Rejection as rejection:
            self.recorder.rejected(request)
            self._stream_ended(request.request_id, rejection.retry_after)
            return
        except NoWorker:
            self.recorder.rejected(request)
            self._stream_ended(request.request_id, 1.0)
            return
        self.recorder.arrived(request)
        self._trace[request.request_id] = (trace_request, tokens)
        flight.context = request
        self._flights[request.request_id] = flight
        if flight.queued:
            self._at(self.now + flight.front.queue_timeout, lambda: self._expire(flight))
        else:
            self._submit(flight)
        if trace_request.cancel_after is not None:
            stream = trace_request.stream
            leaves = trace_request.t + trace_request.cancel_after
            self._at(leaves, lambda: self._hang_up(flight, stream))

    def _submit(self, flight: Flight) -> None:
        """Hand a dispatched flight to its worker's engine, now."""
        request: Request = flight.context
        if flight.settled:  # released, but no worker could take it
            self._forget(request, rejected=True)
            return
        assert flight.decision is not None
        trace_request, tokens = self._trace.pop(request.request_id)
        engine = self._engine_of(flight)
        output = trace_request.output_segment
        output_ids = self.tokens.tokens([(output, trace_request.output_tokens)]) if output else ()
        with self._waking(engine):
            engine.submit(request, tokens, trace_request.output_tokens, output_ids)
        self.recorder.dispatched(request, engine.name, self.now)

    def _engine_of(self, flight: Flight) -> SimEngine:
        assert flight.decision is not None
        return self.engines[self._positions[flight.decision.worker]]

    @contextmanager
    def _waking(self, engine: SimEngine) -> Iterator[None]:
        """Around a change to `engine`'s requests: an engine that was idle or stalled (so
        off the busy heap) and now has work steps again, from now."""
        was_idle = engine.idle() or engine.stalled
        if was_idle:
            engine.now = max(engine.now, self.now)
        yield
        if was_idle and not engine.idle():
            heapq.heappush(self._busy, (engine.now, self._positions[engine.name]))

    def _hang_up(self, flight: Flight, streamed: bool) -> None:
        """The client of `flight` leaves now. Unless it was answered (or refused) first,
        the request leaves the front's queue or its engine, and is settled as the gateway
        settles a client gone: charged its prompt and what its stream delivered (its whole
        output reservation if its answer was not streamed), nothing if it never reached an
        engine."""
        if flight.settled or flight.request_id not in self._flights:
            return
        request: Request = flight.context
        sent = flight.decision is not None  # the fleet hands a dispatched flight over at once
        if sent:
            engine = self._engine_of(flight)
            if streamed:
                flight.observe_output(engine.produced(request.request_id))
            with self._waking(engine):
                engine.abort(request.request_id)
        else:
            self._trace.pop(request.request_id, None)
        del self._flights[request.request_id]
        self.recorder.hung_up(request, self.now)
        flight.settle(flight.left_by_client(sent=sent, streamed=streamed))

    def _expire(self, flight: Flight) -> None:
        if flight.expire() is not None:
            self._trace.pop(flight.request_id, None)
            self._forget(flight.context, rejected=True)

    def _forget(self, request: Request, rejected: bool) -> None:
        self._flights.pop(request.request_id, None)
        if rejected:
            self.recorder.expired(request, self.now)

    def _step(self, engine: SimEngine) -> None:
        plan = engine.step()
        self.recorder.served_after_step(
            engine.now, engine.name, engine.policy.served, _charged_tenants(plan)
        )
        if not engine.idle() and not engine.stalled:
            heapq.heappush(self._busy, (engine.now, self._positions[engine.name]))
        for front in self.fronts:
            if front.saturation is not None:
                front.update_load(
                    engine.name,
                    kv_usage=engine.memory_utilization,
                    waiting=engine.policy.waiting_count,
                )

    def _join(self, workers: list[str]) -> None:
        for front in self.fronts:
            front.set_rotation(workers)

    def _at(self, time: float, event: Callable[[], None]) -> None:
        self._sequence += 1
        heapq.heappush(self._front_events, (time, self._sequence, event))

    def _drain_front_events(self) -> None:
        """Deliver what is left when the run ends (completions after `duration`), in time
        order, so that the front's ledgers end consistent."""
        while self._front_events:
            moment, _, event = heapq.heappop(self._front_events)
            self.now = max(self.now, moment)
            event()

    def _check_requests(self, named: Sequence[tuple[str, TraceRequest]]) -> None:
        """Refuse, before anything runs, a request no engine could hold, or that asks a
        band above its tenant's; the error names it."""
        blocks_for = self.engines[0].blocks_for
        for name, request in named:
            if blocks_for(request.prompt_tokens + request.max_tokens) > self.config.memory_tokens:
                raise ConfigError(
                    name,
                    f"prompt ({request.prompt_tokens}) + max_tokens ({request.max_tokens}) "
                    f"exceeds --memory-tokens ({self.config.memory_tokens}) "
                    f"in blocks of {self.config.block_size}",
                )
            try:
                self._flow(request)
            except ConfigError as error:
                raise ConfigError(f"{name}: band", error.problem) from None

    # ------------------------------------------------------------------ EngineListener

    def admitted(self, engine: SimEngine, request: Request) -> None:
        self.recorder.admitted(request, engine.now, engine.name)
        flight = self._flights.get(request.request_id)
        if flight is not None and not flight.started:  # the front hears of it at engine time
            self._at(engine.now, flight.start)

    def preempted(self, engine: SimEngine, request: Request) -> None:
        self.recorder.preempted(request, engine.now, engine.name)

    def finished(self, engine: SimEngine, completion: Completion) -> None:
        """The engine finished a request at `completion.finished_at` (its clock may be ahead
        of the fleet's): the front settles it then."""
        self.recorder.finished(completion)
        flight = self._flights.pop(completion.request.request_id)
        usage = Usage(
            completion.request.prompt_tokens,
            completion.cached_tokens,
            completion.output_tokens,
        )
        outcome = Outcome(200, usage, first_token_at=completion.first_token_at)

        def settle() -> None:
            flight.settle(outcome)

        self._at(completion.finished_at, settle)
        segment = self._awaited.pop(completion.request.request_id, None)
        if segment is not None:
            self._at(completion.finished_at, lambda: self._release(segment))

    def evicted(self, engine: SimEngine, tokens: Sequence[int], keep: int) -> None:
        for front in self.fronts:  # every replica's prefix tree stands for the engines' caches
            front.router.evicted(tokens, engine.name, keep)


class _StreamsListener(FrontListener):
    """Tells a closed-loop client's stream that its request ended (however it ended)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def settled(self, settlement: Settlement) -> None:
        retry_after = 1.0 if settlement.status == 429 else 0.0
        self.fleet._stream_ended(settlement.request.request_id, retry_after)


def _charged_tenants(plan: BatchPlan) -> set[str]:
    """The tenants a step can have charged: policies charge admissions (which always
    start a prefill chunk) and output tokens (of decodes and finished prefills)."""
    tenants = {running.tenant for running in plan.decodes}
    tenants.update(running.tenant for running, _ in plan.prefills)
    return tenants
