"""Discrete-event simulation of chain-structured serving with static KV reservation.

The system model of seed 003: T. Sun, T. He, I-H. Hou, "Serving Chain-structured Jobs with
Large Memory Footprints with Application to Large Foundation Model Serving"
(arXiv:2604.14993), §2.1 and the simulation set-up of §4.1.1:

- jobs arrive as a Poisson process of rate λ; a job's size r is Exp(1), and a job that takes a
  route (servers j with m_ij layers each) is served for r·T, T = Σ (τ^c_j + τ^p_j m_ij), eq. (2);
- the job holds m_ij cache slots at each server of its route from start to finish (static
  allocation for the longest sequence, §2.1.2); jobs never migrate nor are preempted;
- a server's slots are what its memory leaves after its layers, M̃_j = ⌊(M_j − s_m m_j)/s_c⌋
  (eq. (3)), or whatever a baseline's own cache rule gives it.

Two kinds of dispatcher share the event loop, the slot ledger and the records:

- `ChainDispatch`: JFFC (Alg. 3) over chains with capacities, through the core library's
  `fairpool.sched.routers.jffc.JFFC` (the router the gateway runs), with a central FIFO queue;
- `PathDispatch`: per-request routing over a placement (the PETALS and BPRR baselines of
  `fairpool.sim.chain_baselines`): the policy picks a route when the job arrives, the job is
  committed to it and starts once every server on it has the slots. Waiting jobs start in
  arrival order, first fit: one whose route is still short of slots does not hold back a later
  job whose route has them, and a waiting job holds no slots (all-or-nothing; no deadlock).
  Both choices are the generous reading for the baselines.

Communication time τ^c_j is the total per request (the paper's definition); the authors'
simulator charges a round trip per output token instead (digest §5.1 "Ambiguity"):
`comm_seconds` gives both, and the reproduction reports both.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from fairpool.placement.gca import residual_slots
from fairpool.placement.model import Chain, ChainProblem, Placement
from fairpool.sched.errors import (
    ConfigError,
    require_count,
    require_non_negative,
    require_positive,
)
from fairpool.sched.routers.base import RouteRequest
from fairpool.sched.routers.jffc import JFFC, ChainProfile
from fairpool.sim.metrics import percentile


class CommCharge(StrEnum):
    """How the round trip to a server is charged to a request (digest §5.1 "Ambiguity")."""

    ONCE = "once"  # the paper's text: τ^c_j = RTT_j + overhead
    PER_TOKEN = "per_token"  # the authors' simulator: one round trip per output token


def comm_seconds(
    rtt: float, overhead: float, output_tokens: int, charge: CommCharge | str
) -> float:
    """τ^c_j of a server at round-trip time `rtt` from the orchestrator (§4.1.1:
    RTT + 18 ms), charged once per request or once per output token."""
    require_non_negative("rtt", rtt)
    require_non_negative("overhead", overhead)
    require_count("output_tokens", output_tokens, minimum=1)
    try:
        mode = CommCharge(charge)
    except ValueError:
        raise ConfigError("comm_charge", f"must be 'once' or 'per_token', got {charge!r}") from None
    per_trip = rtt + overhead
    return per_trip if mode is CommCharge.ONCE else per_trip * output_tokens


@dataclass(frozen=True)
class Route:
    """The servers a job goes through, the layers each computes, and its mean time T."""

    servers: tuple[int, ...]
    processed: tuple[int, ...]  # m_ij at each server
    service_seconds: float  # T for a job of size 1


def route_seconds(problem: ChainProblem, servers: Sequence[int], processed: Sequence[int]) -> float:
    """T = Σ_j (τ^c_j + τ^p_j m_ij), eq. (2)."""
    return sum(
        problem.servers[j].comm_seconds + problem.servers[j].layer_seconds * m
        for j, m in zip(servers, processed, strict=True)
    )


def make_route(problem: ChainProblem, servers: Sequence[int], processed: Sequence[int]) -> Route:
    if len(servers) != len(processed) or not servers:
        raise ConfigError("route", "needs one processed-layer count per server, at least one")
    if sum(processed) != problem.layers or min(processed) < 1:
        raise ConfigError("route", f"must compute each of the {problem.layers} layers once")
    return Route(tuple(servers), tuple(processed), route_seconds(problem, servers, processed))


def placement_slots(problem: ChainProblem, placement: Placement) -> tuple[int, ...]:
    """M̃_j = ⌊(M_j − s_m m_j)/s_c⌋ for every server index (eq. (3); GCA's
    `residual_slots`), 0 for a server that hosts no layer."""
    slots = residual_slots(problem, placement)
    return tuple(slots.get(index, 0) for index in range(len(problem.servers)))


# --------------------------------------------------------------------------- jobs and slots


@dataclass
class ChainJob:
    """One request: when it arrived, its size r, and what happened to it."""

    index: int
    arrival: float
    size: float
    route: Route | None = None
    start: float | None = None
    finish: float | None = None

    @property
    def name(self) -> str:
        return f"job-{self.index}"

    @property
    def expected_seconds(self) -> float:
        """T of its route: what a scheduler that cannot see r expects it to take."""
        assert self.route is not None
        return self.route.service_seconds


class SlotLedger:
    """Cache slots per server: capacity, in use, the peak, and who holds them."""

    def __init__(self, capacity: Sequence[int]) -> None:
        for index, slots in enumerate(capacity):
            require_count(f"slots[{index}]", slots)
        self.capacity = tuple(capacity)
        self.used = [0] * len(capacity)
        self.peak = [0] * len(capacity)
        #: Per server: the running jobs holding slots there.
        self.holders: list[dict[int, ChainJob]] = [{} for _ in capacity]

    def free(self, server: int) -> int:
        return self.capacity[server] - self.used[server]

    def fits(self, route: Route) -> bool:
        return all(self.free(j) >= m for j, m in zip(route.servers, route.processed, strict=True))

    def take(self, job: ChainJob) -> None:
        assert job.route is not None
        if not self.fits(job.route):
            raise SimulationError(f"{job.name} started on {job.route.servers} without the slots")
        for j, m in zip(job.route.servers, job.route.processed, strict=True):
            self.used[j] += m
            self.peak[j] = max(self.peak[j], self.used[j])
            self.holders[j][job.index] = job

    def give(self, job: ChainJob) -> None:
        assert job.route is not None
        for j, m in zip(job.route.servers, job.route.processed, strict=True):
            self.used[j] -= m
            del self.holders[j][job.index]


class SimulationError(RuntimeError):
    """A dispatcher broke the model (started a job without its cache slots)."""


# --------------------------------------------------------------------------- dispatchers


class Dispatcher(ABC):
    """Decides which route each job takes and when it starts. The simulator owns the
    ledger; `arrive` and `depart` return the jobs (routes set) to start now."""

    name: str
    ledger: SlotLedger

    def __init__(self, name: str, slots: Sequence[int]) -> None:
        self.name = name
        self.slots = tuple(slots)
        self.ledger = SlotLedger(self.slots)

    def reset(self) -> None:
        self.ledger = SlotLedger(self.slots)

    @abstractmethod
    def arrive(self, job: ChainJob, now: float) -> list[ChainJob]: ...

    @abstractmethod
    def depart(self, job: ChainJob, now: float) -> list[ChainJob]: ...

    @abstractmethod
    def queued(self) -> int:
        """Jobs that arrived and have not started."""


class ChainDispatch(Dispatcher):
    """JFFC (seed 003 Alg. 3) over fixed chains: central FIFO queue, an arrival goes to the
    fastest chain with Z_k < c_k, a completion on chain k lets the queue's head in.

    The choice is the core router's (`fairpool.sched.routers.jffc.JFFC`); this class only
    keeps the queue and maps router workers to chains."""

    def __init__(
        self, problem: ChainProblem, chains: Sequence[Chain], slots: Sequence[int], name: str
    ) -> None:
        if not chains:
            raise ConfigError("chains", "needs at least one chain")
        super().__init__(name, slots)
        self.problem = problem
        self.chains = tuple(chains)
        self.routes: dict[str, Route] = {}
        self.profiles: dict[str, ChainProfile] = {}
        demand = [0] * len(slots)
        for index, chain in enumerate(self.chains):
            route = make_route(problem, chain.servers, chain.processed)
            worker = f"chain-{index}"
            self.routes[worker] = route
            self.profiles[worker] = ChainProfile(chain.capacity, 1.0 / route.service_seconds)
            for j, m in zip(chain.servers, chain.processed, strict=True):
                demand[j] += m * chain.capacity
        for j, (needed, have) in enumerate(zip(demand, self.slots, strict=True)):
            if needed > have:
                raise ConfigError(
                    "chains",
                    f"capacities need {needed} cache slots at server {j}, it has {have} "
                    "(constraint (3))",
                )
        self._queue: deque[ChainJob] = deque()
        self.router = JFFC(self.routes, chains=self.profiles)

    def reset(self) -> None:
        super().reset()
        self._queue.clear()
        self.router = JFFC(self.routes, chains=self.profiles)

    def _dispatch(self, job: ChainJob) -> ChainJob:
        worker = self.router.route(RouteRequest(job.name, "sim", (), 0)).worker
        job.route = self.routes[worker]
        return job

    def arrive(self, job: ChainJob, now: float) -> list[ChainJob]:
        if self.router.has_room():
            return [self._dispatch(job)]
        self._queue.append(job)
        return []

    def depart(self, job: ChainJob, now: float) -> list[ChainJob]:
        self.router.complete(job.name)
        if self._queue and self.router.has_room():
            return [self._dispatch(self._queue.popleft())]
        return []

    def queued(self) -> int:
        return len(self._queue)

    @property
    def total_capacity(self) -> int:
        return sum(chain.capacity for chain in self.chains)

    @property
    def service_rate(self) -> float:
        """ν = Σ_k c_k μ_k, eq. (4): JFFC is stable below it (Lemma 3.6)."""
        return sum(p.capacity * p.service_rate for p in self.profiles.values())


class PathPolicy(Protocol):
    """A baseline's request routing: the route a job takes, chosen when it arrives."""

    def choose(self, job: ChainJob, now: float, ledger: SlotLedger) -> Route: ...


class PathDispatch(Dispatcher):
    """Per-request routing over a placement; jobs wait on their route for slots (see the
    module's docstring for the start rule)."""

    def __init__(self, policy: PathPolicy, slots: Sequence[int], name: str) -> None:
        super().__init__(name, slots)
        self.policy = policy
        #: Jobs waiting for slots, in arrival order, each with the server it is short at.
        self._waiting: list[tuple[ChainJob, int]] = []

    def reset(self) -> None:
        super().reset()
        self._waiting.clear()

    def arrive(self, job: ChainJob, now: float) -> list[ChainJob]:
        job.route = self.policy.choose(job, now, self.ledger)
        for j, m in zip(job.route.servers, job.route.processed, strict=True):
            if m > self.slots[j]:
                raise SimulationError(
                    f"{self.name} routed {job.name} through server {j}, which can never hold "
                    f"its {m} slots"
                )
        # Every waiting job was short of slots after the last event, and nothing has freed
        # since: the newcomer starts iff it fits, whatever is waiting.
        short = self._short_at(job.route, {})
        if short is None:
            return [job]
        self._waiting.append((job, short))
        return []

    def depart(self, job: ChainJob, now: float) -> list[ChainJob]:
        assert job.route is not None
        freed = frozenset(job.route.servers)
        # Reserve as we go, so that two waiting jobs are not both started on the same slots.
        taken: dict[int, int] = {}
        starting: list[ChainJob] = []
        still: list[tuple[ChainJob, int]] = []
        for waiting, short in self._waiting:
            # Slots at `short` have not grown since it was last checked unless it just freed.
            if short in freed:
                assert waiting.route is not None
                now_short = self._short_at(waiting.route, taken)
                if now_short is None:
                    for j, m in zip(waiting.route.servers, waiting.route.processed, strict=True):
                        taken[j] = taken.get(j, 0) + m
                    starting.append(waiting)
                    continue
                short = now_short
            still.append((waiting, short))
        self._waiting = still
        return starting

    def _short_at(self, route: Route, taken: dict[int, int]) -> int | None:
        """The first server of `route` without its slots (beyond `taken`), or None."""
        for j, m in zip(route.servers, route.processed, strict=True):
            if self.ledger.free(j) - taken.get(j, 0) < m:
                return j
        return None

    def queued(self) -> int:
        return len(self._waiting)


# --------------------------------------------------------------------------- the run


def poisson_jobs(rate: float, count: int, rng: random.Random) -> list[tuple[float, float]]:
    """`count` (arrival time, size) pairs: Poisson(λ) arrivals, sizes Exp(1) (§4.1.1)."""
    require_positive("arrival_rate", rate)
    require_count("jobs", count, minimum=1)
    now = 0.0
    jobs = []
    for _ in range(count):
        now += rng.expovariate(rate)
        jobs.append((now, rng.expovariate(1.0)))
    return jobs


@dataclass(frozen=True)
class Summary:
    """Mean, median, tail and extremes of one metric over the measured jobs (seconds)."""

    mean: float
    stdev: float
    median: float
    p95: float
    p99: float
    minimum: float
    maximum: float

    @staticmethod
    def of(values: Sequence[float]) -> Summary:
        """The summary of `values` (at least one)."""
        if not values:
            raise ConfigError("jobs", "no job was measured")
        data = list(values)
        return Summary(
            mean=statistics.fmean(data),
            stdev=statistics.pstdev(data),
            median=statistics.median(data),
            p95=percentile(data, 0.95) or 0.0,
            p99=percentile(data, 0.99) or 0.0,
            minimum=min(data),
            maximum=max(data),
        )


@dataclass
class ChainRun:
    """What one simulation recorded."""

    dispatcher: str
    arrived: int
    completed: int
    measured: int  # jobs after the warm-up, which the summaries cover
    response_stderr: float  # of the mean response, by batch means (runs are autocorrelated)
    response: Summary
    waiting: Summary
    service: Summary
    slots: tuple[int, ...]  # cache slots of each server
    peak_slots: tuple[int, ...]  # the most in use at once
    end_time: float
    start_order_fifo: bool  # jobs started in arrival order (JFFC's central queue)
    routes: dict[tuple[int, ...], int] = field(default_factory=dict)  # jobs per server path


def simulate(
    dispatcher: Dispatcher, jobs: Iterable[tuple[float, float]], warmup: int = 0
) -> ChainRun:
    """Serve `jobs` ((arrival, size) in arrival order) until all complete; summaries cover
    the jobs after the first `warmup` arrivals. Deterministic given the jobs."""
    require_count("warmup", warmup)
    dispatcher.reset()
    ledger = dispatcher.ledger
    # Events: (time, kind, sequence, job); completions (kind 0) before arrivals (kind 1) at
    # equal times, so a freed slot is there for the arrival.
    events: list[tuple[float, int, int, ChainJob]] = []
    sequence = 0
    last_arrival = -math.inf
    for index, (arrival, size) in enumerate(jobs):
        if arrival < last_arrival:
            raise ConfigError("jobs", "must be in arrival order")
        require_non_negative("job size", size)
        last_arrival = arrival
        events.append((arrival, 1, sequence, ChainJob(index, arrival, size)))
        sequence += 1
    arrived = sequence
    heapq.heapify(events)
    finished: list[ChainJob] = []
    started_order: list[int] = []
    now = 0.0

    def start(job: ChainJob) -> None:
        nonlocal sequence
        assert job.route is not None
        ledger.take(job)
        job.start = now
        job.finish = now + job.size * job.route.service_seconds
        started_order.append(job.index)
        heapq.heappush(events, (job.finish, 0, sequence, job))
        sequence += 1

    while events:
        now, kind, _, job = heapq.heappop(events)
        if kind == 1:
            starting = dispatcher.arrive(job, now)
        else:
            ledger.give(job)
            finished.append(job)
            starting = dispatcher.depart(job, now)
        for ready in starting:
            start(ready)
    if dispatcher.queued():
        raise SimulationError(f"{dispatcher.name}: {dispatcher.queued()} jobs never started")
    measured = sorted((job for job in finished if job.index >= warmup), key=lambda j: j.index)
    routes: dict[tuple[int, ...], int] = {}
    for job in measured:
        assert job.route is not None
        routes[job.route.servers] = routes.get(job.route.servers, 0) + 1
    return ChainRun(
        dispatcher=dispatcher.name,
        arrived=arrived,
        completed=len(finished),
        measured=len(measured),
        response_stderr=batch_stderr([_response(job) for job in measured]),
        response=Summary.of([_response(job) for job in measured]),
        waiting=Summary.of([_waiting(job) for job in measured]),
        service=Summary.of([_service(job) for job in measured]),
        slots=ledger.capacity,
        peak_slots=tuple(ledger.peak),
        end_time=now,
        start_order_fifo=started_order == sorted(started_order),
        routes=routes,
    )


def batch_stderr(values: Sequence[float], batches: int = 20) -> float:
    """Standard error of the mean of a correlated series, from the spread of the means of
    `batches` consecutive batches (batch means)."""
    size = len(values) // batches
    if size < 2:
        return statistics.pstdev(values) / math.sqrt(len(values)) if values else 0.0
    means = [statistics.fmean(values[b * size : (b + 1) * size]) for b in range(batches)]
    return statistics.stdev(means) / math.sqrt(batches)


def _response(job: ChainJob) -> float:
    assert job.finish is not None
    return job.finish - job.arrival


def _waiting(job: ChainJob) -> float:
    assert job.start is not None
    return job.start - job.arrival


def _service(job: ChainJob) -> float:
    assert job.finish is not None and job.start is not None
    return job.finish - job.start
