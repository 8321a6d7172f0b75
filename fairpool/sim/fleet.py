"""A fleet in virtual time: N engines, one router, a trace of requests.

Events are processed in time order. An arrival is routed at its arrival time (the router
sees the completions that happened before it); an engine runs its next step at its own
clock, seeing every arrival up to then. Engines report admissions, completions and cache
evictions; the fleet forwards completions and evictions to the router (D2LPM's streams 2
and 3) and records what the metrics need.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairpool.sched.batch import BatchPlan
from fairpool.sched.cost import CostModel, TenantWeights
from fairpool.sched.errors import ConfigError, require_count
from fairpool.sched.limits import RequestRateLimiter
from fairpool.sched.registry import make_policy, make_router, policy_parameters
from fairpool.sched.requests import Request
from fairpool.sched.routers.base import RouteRequest
from fairpool.sim.engine import Admission, Completion, SimEngine, StepTime
from fairpool.sim.metrics import Recorder
from fairpool.sim.profiles import Profile
from fairpool.sim.trace import SegmentTokens, TraceRequest


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
    cost: CostModel = field(default_factory=CostModel)
    weights: TenantWeights = field(default_factory=TenantWeights)
    rpm_limit: int | None = None  # requests per minute per tenant, refused beyond it
    policy_params: Mapping[str, Any] = field(default_factory=dict)  # e.g. alpha, beta

    def __post_init__(self) -> None:
        require_count("workers", self.workers, minimum=1)
        require_count("memory_tokens", self.memory_tokens, minimum=1)
        require_count("token_budget", self.token_budget, minimum=1)
        require_count("block_size", self.block_size, minimum=1)

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


class Fleet:
    """Engines and a router, driven through a trace in virtual time."""

    def __init__(self, config: FleetConfig, seed: int = 0) -> None:
        self.config = config
        self.tokens = SegmentTokens(seed)
        self.recorder = Recorder(config.weights)
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
        self._busy: list[tuple[float, int]] = []  # see run()
        router_params: dict[str, Any] = {}
        if config.worker_quantum is not None:
            router_params["worker_quantum"] = config.worker_quantum
        self.router = make_router(
            config.router,
            [engine.name for engine in self.engines],
            cost=config.cost,
            weights=config.weights,
            **router_params,
        )
        self.limiter = (
            RequestRateLimiter(config.rpm_limit) if config.rpm_limit is not None else None
        )
        self._completions: list[tuple[float, int, str, int]] = []
        self._sequence = 0

    def _policy(self) -> Any:
        params: dict[str, Any] = dict(self.config.policy_params)
        if self.config.quantum is not None:
            if "quantum" not in policy_parameters(self.config.policy):
                raise ConfigError(
                    "quantum", f"policy {self.config.policy!r} does not take a quantum"
                )
            params["quantum"] = self.config.quantum
        return make_policy(
            self.config.policy, cost=self.config.cost, weights=self.config.weights, **params
        )

    # ------------------------------------------------------------------ running

    def run(
        self,
        trace: Sequence[TraceRequest],
        duration: float | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> Recorder:
        """Serve `trace` until everything finished, or until `duration` virtual seconds."""
        self._check_fits(trace)
        end = float("inf") if duration is None else duration
        arrivals = sorted(enumerate(trace), key=lambda item: (item[1].t, item[0]))
        next_arrival = 0
        now = 0.0
        # Busy engines by (clock, position): only an engine's own step moves its clock
        # while it is busy, and only a step (done, or stalled: requests wait but the
        # policy admits none into an empty engine) or an arrival (busy) changes that.
        self._busy = [
            (engine.now, position)
            for position, engine in enumerate(self.engines)
            if not engine.idle()
        ]
        heapq.heapify(self._busy)
        while True:
            arrival_time = arrivals[next_arrival][1].t if next_arrival < len(arrivals) else None
            engine_time = self._busy[0][0] if self._busy else None
            if arrival_time is None and engine_time is None:
                break
            if engine_time is None or (arrival_time is not None and arrival_time <= engine_time):
                assert arrival_time is not None
                now = arrival_time
                if now >= end:
                    break
                index, request = arrivals[next_arrival]
                self._dispatch(index, request)
                next_arrival += 1
            else:
                now = engine_time
                if now >= end:
                    break
                _, position = heapq.heappop(self._busy)
                engine = self.engines[position]
                plan = engine.step()
                self.recorder.served_after_step(
                    engine.now, engine.name, engine.policy.served, _charged_tenants(plan)
                )
                if not engine.idle() and not engine.stalled:
                    heapq.heappush(self._busy, (engine.now, position))
            if progress is not None:
                progress(now)
        self._deliver_completions(float("inf"))
        self.recorder.close(min(now, end) if duration is not None else now)
        return self.recorder

    def _dispatch(self, index: int, trace_request: TraceRequest) -> None:
        self._deliver_completions(trace_request.t)
        request = Request(
            f"q{index}",
            trace_request.tenant,
            trace_request.prompt_tokens,
            trace_request.max_tokens,
            arrival=trace_request.t,
            slo=trace_request.slo,
        )
        if self.limiter is not None and not self.limiter.allow(request.tenant, request.arrival):
            self.recorder.rejected(request)
            return
        tokens = self.tokens.tokens(trace_request.segments)
        worker = self.router.route(
            RouteRequest(request.request_id, request.tenant, tokens, request.prompt_tokens)
        )
        position = self._positions[worker]
        engine = self.engines[position]
        was_idle = engine.idle() or engine.stalled
        if was_idle:
            engine.now = max(engine.now, trace_request.t)
        self.recorder.arrived(request, worker)
        engine.submit(request, tokens, trace_request.output_tokens)
        if was_idle:
            heapq.heappush(self._busy, (engine.now, position))

    def _deliver_completions(self, until: float) -> None:
        while self._completions and self._completions[0][0] <= until:
            _, _, request_id, output_tokens = heapq.heappop(self._completions)
            self.router.complete(request_id, output_tokens)

    def _check_fits(self, trace: Sequence[TraceRequest]) -> None:
        blocks_for = self.engines[0].blocks_for
        for index, request in enumerate(trace):
            if blocks_for(request.prompt_tokens + request.max_tokens) > self.config.memory_tokens:
                raise ConfigError(
                    f"request {index}",
                    f"prompt ({request.prompt_tokens}) + max_tokens ({request.max_tokens}) "
                    f"exceeds --memory-tokens ({self.config.memory_tokens}) "
                    f"in blocks of {self.config.block_size}",
                )

    # ------------------------------------------------------------------ EngineListener

    def admitted(self, engine: SimEngine, request: Request) -> None:
        self.recorder.admitted(request, engine.now)

    def preempted(self, engine: SimEngine, request: Request) -> None:
        self.recorder.preempted(request, engine.now)

    def finished(self, engine: SimEngine, completion: Completion) -> None:
        self._sequence += 1
        heapq.heappush(
            self._completions,
            (
                completion.finished_at,
                self._sequence,
                completion.request.request_id,
                completion.output_tokens,
            ),
        )
        self.recorder.finished(completion)

    def evicted(self, engine: SimEngine, tokens: Sequence[int], keep: int) -> None:
        self.router.evicted(tokens, engine.name, keep)


def _charged_tenants(plan: BatchPlan) -> set[str]:
    """The tenants a step can have charged: policies charge admissions (which always
    start a prefill chunk) and output tokens (of decodes and finished prefills)."""
    tenants = {running.tenant for running in plan.decodes}
    tenants.update(running.tenant for running, _ in plan.prefills)
    return tenants
