"""One fair order (issue 29): priority bands, nested shares and weights, in the simulator.

Everything but the last measure runs in virtual time (`fairpool.sim.fleet`: engines behind
the gateway's own front), so those numbers do not depend on this machine. Service is what
the engines computed for a tenant (uncached prompt tokens + 2 × output tokens), read over a
window that leaves a warm-up out. A flood is a tenant's closed-loop streams, each sending
its next request when its last one ends, each request its tenant's shared system prompt
(100 tokens), a question and an answer; the seed draws each stream's question and answer
lengths (lognormal around 150 and 64 tokens, σ 0.5), because streams of identical lengths
move in lockstep (they are admitted together and finish together), which no real flood
does, and because without it the seeds would only rename tokens.

The pool of measures 1, 2, 3 and 5: two engines with Llama-3-8B-on-H100 step times and
8,192 KV tokens each (16-token blocks, vLLM's paged admission), DLPM engines (the default),
D2LPM routing, one gateway with its default saturation.

1. **Interactive under a batch flood.** An interactive-band tenant sends Poisson requests
   (system prompt, a 100-token question, 64-token answer) at 30 % of the capacity the
   batch flood alone is served (128 streams, batch band). Its TTFT p99 beside the flood
   against the same requests (same seed) alone on the pool: goal ≤ 1.5× + 25 ms. The
   flood's service rate against the capacity the interactive tenant leaves — the flood's
   rate alone minus the interactive tenant's rate in the same run: goal ≥ 0.9×. The same
   run with priority off (both tenants in the standard band) is reported beside.
2. **The lowest band's minimum share.** One flood (128 streams) in each band; the batch
   band's part of the service against its minimum share φ (`Shares.min_shares`), less the
   slack docs/scheduling.md states for it (S_b ≥ φ·S − (2 + φ)·U over any stretch, U the
   largest request's cost), summed over the engines, as each engine runs its own tree.
   The standard band's likewise. Reported: the worst wait of a batch request (arrival to
   its first admission, or to the window's end if it was still waiting), and the longest
   stretch in which no batch request was admitted anywhere (the band's head waiting),
   beside what the stated bound on that comes to at an engine's mean rate.
3. **Nesting.** Org A (group weight 1) holds ten tenants, org B (weight 1) one; all flood
   (64 streams each): A and B half each, goal within 5 %. Flat weights (no groups) beside:
   10 : 1, within 5 %.
4. **4 : 1 weights**, gold against bronze, both flooding with 24 streams, in the shape of
   tests/test_sim_replicas.py: two engines with Llama-2-7B-on-A10G step times (S-LoRA's
   reserved admission), D2LPM, VTC and DLPM engines. Two regimes, the fraction of the
   window in which some request waited in an engine's queue reported as the evidence:
   *the gateway decides* (the profile's 10,000 KV tokens, `maxOutstanding` 8: the engines
   run all they are sent, requests wait at the gateway) and *the engines decide* (2,048 KV
   tokens, the default saturation: the engines hold queues). One gateway: the test's
   fixed lengths, then five seeds; then 2 and 4 gateway replicas, traffic `spread` (round
   robin) and `tenant` (each tenant through one replica), fixed lengths, over a longer
   window (four replicas spreading converge slowly). Goal: every run within 5 % of 4.
5. **Twelve tenants**, weights 1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8, all flooding (32 streams
   each), one gateway and two replicas (spread): each tenant's part of the service against
   its weighted share w_i / Σ w, goal every tenant within 10 %.
6. **A tenant below its share in a KV-pressured pool**: bench/bench_kv_fairness.py's pool
   and its functions (four engines of 2,048 KV tokens, DLPM, the default saturation; light
   tenant weight 2, 24 streams, beside a 96-stream flood of weight 1): its service rate
   beside the flood against alone, and the flood's part of the service against the rest
   (`bench_kv_fairness.below_entitlements`): each within 10 % of its entitlement.
7. **Decision cost** (wall time, this machine): the gateway's fair queue (`FairQueue`,
   VTC over the tree) with 1,000 tenants waiting, flat, and the same tenants in 50 groups
   across the 3 bands. A decision is `release()`: choose the next request and admit it
   (charging it); then it finishes and its tenant sends another, so all keep waiting. The
   median over repeats of the mean per decision, the two interleaved in one process; goal:
   the tree ≤ 2× flat.

Results: bench/results/tree.json (every number, the goals, the machine, the command),
tree.md (a table per measure, each verdict and sentence computed from the numbers) and
tree.png. Run: `python bench/bench_tree.py` (about seven minutes on two cores); `--quick`
runs every measure at toy size with one seed and records nothing.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_kv_fairness as kv
from _common import RESULTS, write_results

from fairpool.api.inference_pool import Saturation
from fairpool.front import FairQueue, Flight, FrontListener, Settlement
from fairpool.sched.cost import CostModel, Tokens
from fairpool.sched.requests import Request
from fairpool.sched.routers import RouteDecision
from fairpool.sched.tree import BAND_NAMES, Group, Shares
from fairpool.sim.engine import SimEngine
from fairpool.sim.fleet import ClosedLoop, Fleet, FleetConfig
from fairpool.sim.metrics import Recorder, percentile
from fairpool.sim.profiles import get_profile
from fairpool.sim.trace import TraceRequest
from fairpool.sim.workloads import lognormal_length, poisson_arrivals, stream

# ---------------------------------------------------------------------- workloads

POOL_PROFILE, POOL_MEMORY, POOL_WORKERS = "llama3-8b-h100", 8192, 2
PREFIX, QUESTION, OUTPUT = 100, 150, 64  # tokens: tests/test_sim_replicas.py's request
LENGTH_SIGMA, QUESTION_CAP, OUTPUT_CAP = 0.5, 1000, 512  # a flood's streams' lengths
CHAT_QUESTION = 100  # the interactive tenant's question (its answer: OUTPUT)
COST = CostModel()

INTERACTIVE_LOAD = 0.3  # the interactive tenant's rate, as a part of the flood's capacity
FLOOD_STREAMS = 128
NEST_STREAMS, NEST_TENANTS = 64, 10
WEIGHTED_STREAMS, TWELVE_WEIGHTS = 32, (1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8)
GOLD_WEIGHT, WEIGHT_STREAMS = 4.0, 24
TEST_PROFILE = "llama2-7b-a10g"

TTFT_FACTOR, TTFT_SLACK = 1.5, 0.025  # seconds
LEFT_GOAL = 0.9  # the flood's rate against the capacity left
WEIGHT_TOLERANCE, TWELVE_TOLERANCE = 0.05, 0.10
DECISION_TENANTS, DECISION_GROUPS, DECISION_RATIO = 1000, 50, 2.0


@dataclass(frozen=True)
class Regime:
    """Where requests wait in measure 4, and so which scheduler decides."""

    label: str
    memory: int
    saturation: Saturation


REGIMES = {
    "gateway": Regime("the gateway decides", 10_000, Saturation(maxOutstanding=8)),
    "engines": Regime("the engines decide", 2048, Saturation()),
}


@dataclass(frozen=True)
class Settings:
    """Durations (virtual seconds), seeds and sizes: the full run's by default."""

    quick: bool = False
    warm: float = 10.0  # left out of the pool's runs (measures 1, 2, 3, 5)
    end: float = 60.0
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    test_warm: float = 20.0  # measure 4 (tests/test_sim_replicas.py's window, one gateway)
    test_end: float = 80.0
    replicas_end: float = 300.0  # measure 4, replicas
    replicas: tuple[int, ...] = (2, 4)
    engines: tuple[str, ...] = ("vtc", "dlpm")
    kv_duration: float = 120.0  # measure 6 (bench_kv_fairness.py's)
    kv_warm: float = 30.0
    decisions: int = 2000  # measure 7: per repeat
    repeats: int = 7


QUICK = Settings(
    quick=True,
    warm=1.0,
    end=3.0,
    seeds=(0,),
    test_warm=2.0,
    test_end=10.0,
    replicas_end=12.0,
    replicas=(2,),
    engines=("dlpm",),
    kv_duration=6.0,
    kv_warm=2.0,
    decisions=50,
    repeats=1,
)


def say(message: str) -> None:
    print(f"bench_tree: {message}", file=sys.stderr, flush=True)


def flood(tenant: str, streams: int, seed: int) -> list[ClosedLoop]:
    """`tenant`'s flood: `streams` closed-loop streams, each of its own lengths (the seed's)."""
    rng = stream(seed, "flood", tenant)
    return [
        ClosedLoop(
            tenant,
            1,
            PREFIX,
            lognormal_length(rng, QUESTION, LENGTH_SIGMA, QUESTION_CAP),
            lognormal_length(rng, OUTPUT, LENGTH_SIGMA, OUTPUT_CAP),
        )
        for _ in range(streams)
    ]


def fixed_flood(tenant: str, streams: int) -> list[ClosedLoop]:
    """tests/test_sim_replicas.py's flood: every request of the same lengths."""
    return [ClosedLoop(tenant, streams, PREFIX, QUESTION, OUTPUT)]


def largest_cost(clients: Iterable[ClosedLoop]) -> float:
    """U: the largest request's cost, its prompt uncached."""
    return max(COST.service(c.prefix + c.question, c.output_tokens) for c in clients)


def pool(shares: Shares, **settings: Any) -> FleetConfig:
    return FleetConfig.from_profile(
        get_profile(POOL_PROFILE),
        POOL_MEMORY,
        workers=POOL_WORKERS,
        policy="dlpm",
        router="d2lpm",
        weights=shares,
        saturation=Saturation(),
        **settings,
    )


# ---------------------------------------------------------------------- runs


class WaitingFleet(Fleet):
    """A fleet that keeps each request's wait — from its arrival to its first admission by
    an engine, or to when it left unserved (the gateway queue's timeout) — and when each
    flow had a request admitted."""

    def __init__(self, config: FleetConfig, seed: int = 0) -> None:
        super().__init__(config, seed)
        self.arrivals: dict[str, tuple[str, float]] = {}  # request → (flow, arrival)
        self.waited_until: dict[str, float] = {}
        self.admissions: dict[str, list[float]] = {}  # flow → its admissions' times
        for front in self.fronts:
            front.listeners.append(_Arrivals(self))

    def admitted(self, engine: SimEngine, request: Request) -> None:
        super().admitted(engine, request)
        self.waited_until.setdefault(request.request_id, engine.now)
        self.admissions.setdefault(request.tenant, []).append(engine.now)

    def waits(self, flow: str, since: float, end: float) -> list[float]:
        """The waits of `flow`'s requests that arrived in [since, end); one still waiting
        at `end` counts until then."""
        return [
            min(self.waited_until.get(request_id, end), end) - arrival
            for request_id, (name, arrival) in self.arrivals.items()
            if name == flow and since <= arrival < end
        ]

    def longest_unserved(self, flow: str, since: float, end: float) -> float:
        """The longest stretch of [since, end) in which no request of `flow` was admitted
        anywhere in the pool (engines' clocks differ: their admissions are sorted)."""
        times = sorted(t for t in self.admissions.get(flow, []) if since <= t < end)
        edges = [since, *times, end]
        return max(later - earlier for earlier, later in itertools.pairwise(edges))


class _Arrivals(FrontListener):
    def __init__(self, fleet: WaitingFleet) -> None:
        self.fleet = fleet

    def queued(self, flight: Flight) -> None:
        arrival = flight.request.arrival
        when = self.fleet.now if arrival is None else arrival
        self.fleet.arrivals.setdefault(flight.request_id, (flight.flow, when))

    def dispatched(self, flight: Flight, decision: RouteDecision) -> None:
        self.queued(flight)

    def settled(self, settlement: Settlement) -> None:
        self.fleet.waited_until.setdefault(settlement.request.request_id, self.fleet.now)


@dataclass
class Window:
    """One run, read over [warm, end)."""

    fleet: Fleet
    recorder: Recorder
    warm: float
    end: float

    def service(self, flow: str) -> float:
        return self.recorder.service_at(flow, self.end) - self.recorder.service_at(flow, self.warm)

    def rate(self, flow: str) -> float:
        return self.service(flow) / (self.end - self.warm)

    def total(self) -> float:
        return sum(self.service(flow) for flow in self.recorder.service_times)

    def finished(self, tenant: str) -> int:
        """`tenant`'s requests that finished in the window."""
        return sum(
            1
            for c in self.recorder.completions
            if c.request.tenant == tenant and self.warm <= c.finished_at < self.end
        )

    def ttft_p99(self, tenant: str) -> float | None:
        return percentile(
            (
                c.first_token_at - c.request.arrival
                for c in self.recorder.completions
                if c.request.tenant == tenant and self.warm <= c.request.arrival < self.end
            ),
            0.99,
        )

    def engine_queue(self) -> float:
        """The part of the window in which some request waited in an engine's queue."""
        spans = [
            (max(start, self.warm), min(stop, self.end))
            for workers in self.recorder.worker_backlog.values()
            for intervals in workers.values()
            for start, stop in intervals
        ]
        return _covered(spans) / (self.end - self.warm)


def _covered(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the union of `spans`."""
    covered, reach = 0.0, -math.inf
    for start, stop in sorted(span for span in spans if span[1] > span[0]):
        if stop > reach:
            covered += stop - max(start, reach)
            reach = stop
    return covered


def serve(
    label: str,
    config: FleetConfig,
    warm: float,
    end: float,
    clients: Sequence[ClosedLoop] = (),
    seed: int = 0,
    fleet_type: type[Fleet] = Fleet,
    trace: Sequence[TraceRequest] = (),
) -> Window:
    """Run `clients` and `trace` on `config` until `end` (virtual seconds)."""
    started = time.perf_counter()
    fleet = fleet_type(config, seed)
    recorder = fleet.run(list(trace), duration=end, clients=list(clients))
    say(f"{label}: {end:g} virtual s in {time.perf_counter() - started:.1f} s")
    return Window(fleet, recorder, warm, end)


# ---------------------------------------------------------------------- goals and rows


@dataclass(frozen=True)
class Goal:
    kind: Literal["at least", "at most", "within"]
    target: float
    text: str  # the goal as the report states it (with how the target comes about)
    tolerance: float = 0.0  # `within`: relative

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        if self.kind == "at least":
            return value >= self.target
        if self.kind == "at most":
            return value <= self.target
        return abs(value / self.target - 1) <= self.tolerance

    def margin(self, value: float | None) -> float | None:
        """How far the goal is met, ≥ 1 when it is (`at least`, `at most` goals)."""
        if value is None or not value or self.kind == "within" or self.target <= 0:
            return None
        return value / self.target if self.kind == "at least" else self.target / value


@dataclass
class Row:
    measure: int
    what: str
    value: float | None
    measured: str  # the number(s), as the report shows them
    goal: Goal | None = None  # None: reported beside a goal's row, for comparison
    details: dict[str, Any] = field(default_factory=dict)
    short: str = ""  # what the chart calls it

    @property
    def label(self) -> str:
        return f"{self.measure}. {self.short or self.what}"

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.goal.met(self.value)

    def record(self) -> dict[str, Any]:
        return {
            "measure": self.measure,
            "what": self.what,
            "value": self.value,
            "measured": self.measured,
            "goal": None if self.goal is None else self.goal.text,
            "goal_kind": None if self.goal is None else self.goal.kind,
            "goal_target": None if self.goal is None else self.goal.target,
            "goal_tolerance": None if self.goal is None else self.goal.tolerance,
            "met": self.met,
            **self.details,
        }


@dataclass
class Measure:
    """A measure's rows and the sentences the report says of them."""

    title: str
    rows: list[Row]
    notes: list[str]


def within(target: float, tolerance: float, text: str) -> Goal:
    return Goal("within", target, f"{text} (within {tolerance:.0%})", tolerance)


def _over(part: float, whole: float) -> float:
    """part / whole; infinity where `whole` is 0 (a toy run may serve a tenant nothing)."""
    return part / whole if whole else math.inf


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{1000 * seconds:.1f} ms"


def _more_or_less(value: float, reference: float) -> str:
    return "above" if value > reference else "below" if value < reference else "at"


def _verdict(row: Row) -> str:
    return "met" if row.met else "not met"


# ---------------------------------------------------------------------- 1. interactive


def chat_trace(capacity: float, end: float, seed: int) -> tuple[list[TraceRequest], float]:
    """Poisson requests of the interactive tenant at INTERACTIVE_LOAD of `capacity` (each
    costs its question and answer: its system prompt is cached), and their rate."""
    rate = INTERACTIVE_LOAD * capacity / COST.service(CHAT_QUESTION, OUTPUT)
    segments = (("system-chat", PREFIX), (None, CHAT_QUESTION))
    times = poisson_arrivals(rate, 0.0, end, stream(seed, "chat"))
    return [TraceRequest(t, "chat", segments, OUTPUT, OUTPUT) for t in times], rate


def interactive(settings: Settings) -> Measure:
    seed, warm, end = settings.seeds[0], settings.warm, settings.end
    bands = Shares({}, tenant_bands={"chat": "interactive", "batch": "batch"})
    batch = flood("batch", FLOOD_STREAMS, seed)
    flood_alone = serve("1/4 the batch flood alone", pool(bands), warm, end, batch, seed=seed)
    capacity = flood_alone.rate("batch")
    trace, rate = chat_trace(capacity, end, seed)
    chat_alone = serve(
        "2/4 the interactive tenant alone", pool(bands), warm, end, (), seed, trace=trace
    )
    runs = {
        "on": serve("3/4 both, bands on", pool(bands), warm, end, batch, seed, trace=trace),
        "off": serve("4/4 both, bands off", pool(Shares({})), warm, end, batch, seed, trace=trace),
    }
    alone_p99 = chat_alone.ttft_p99("chat")
    limit = TTFT_FACTOR * (alone_p99 or 0.0) + TTFT_SLACK
    ttft_goal = Goal(
        "at most",
        limit,
        f"≤ {TTFT_FACTOR:g}× alone ({_ms(alone_p99)}) + {1000 * TTFT_SLACK:g} ms = {_ms(limit)}",
    )
    left_goal = Goal("at least", LEFT_GOAL, f"≥ {LEFT_GOAL:g}× the capacity left")
    rows, figures = [], {}
    for band, window in runs.items():
        p99 = window.ttft_p99("chat")
        left = capacity - window.rate("chat")
        batch_vs_left = _over(window.rate("batch"), left)
        figures[band] = (p99, batch_vs_left)
        label = "bands on" if band == "on" else "bands off (both standard)"
        rows.append(
            Row(
                1,
                f"interactive TTFT p99 beside the flood, {label}",
                p99,
                f"{_ms(p99)} ({(p99 or 0) / (alone_p99 or 1):.2f}× alone)",
                ttft_goal if band == "on" else None,
                {"bands": band, "ttft_p99_alone_s": alone_p99, "ttft_p99_s": p99},
                f"interactive TTFT p99, bands {band}",
            )
        )
        rows.append(
            Row(
                1,
                f"batch flood's rate against the capacity left, {label}",
                round(batch_vs_left, 4),
                f"{window.rate('batch'):,.0f} of {left:,.0f} service/s ({batch_vs_left:.3f}×)",
                left_goal if band == "on" else None,
                {
                    "bands": band,
                    "batch_rate": round(window.rate("batch")),
                    "capacity_left": round(left),
                    "interactive_rate": round(window.rate("chat")),
                },
                f"batch rate / capacity left, bands {band}",
            )
        )
    load = _over(chat_alone.rate("chat"), capacity)
    notes = [
        f"The flood alone was served {capacity:,.0f} service/s (engines holding a queue "
        f"{flood_alone.engine_queue():.0%} of the window); the interactive tenant's "
        f"{rate:.1f} requests/s were {load:.0%} of that, alone. Capacity left = the flood's "
        "rate alone minus the interactive tenant's rate in the same run.",
        f"With bands the interactive TTFT p99 was {_ms(figures['on'][0])}, with priority off "
        f"{_ms(figures['off'][0])}, alone {_ms(alone_p99)}: the goal ({_ms(limit)}) is "
        f"{_verdict(rows[0])} with bands and "
        f"{'met' if ttft_goal.met(figures['off'][0]) else 'not met'} without.",
        f"The flood kept {figures['on'][1]:.3f}× the capacity left with bands and "
        f"{figures['off'][1]:.3f}× without (goal ≥ {LEFT_GOAL:g}×: {_verdict(rows[1])} "
        "with bands).",
    ]
    return Measure("1. Interactive under a batch flood", rows, notes)


# ---------------------------------------------------------------------- 2. minimum share


def minimum_share(settings: Settings) -> Measure:
    seed, warm, end = settings.seeds[0], settings.warm, settings.end
    tenants = {"live": "interactive", "std": "standard", "bulk": "batch"}
    shares = Shares({}, tenant_bands=tenants)
    clients = [c for tenant in tenants for c in flood(tenant, FLOOD_STREAMS, seed)]
    config = pool(shares)
    window = serve("1/1 a flood in each band", config, warm, end, clients, seed, WaitingFleet)
    total, largest = window.total(), largest_cost(clients)
    rows, parts = [], {}
    for tenant in ("std", "bulk"):
        band = tenants[tenant]
        minimum = shares.min_shares[band]
        slack = _over(POOL_WORKERS * (2 + minimum) * largest, total)
        part = _over(window.service(tenant), total)
        parts[band] = part
        goal = Goal(
            "at least",
            minimum - slack,
            f"≥ φ − n(2 + φ)U/S, n = {POOL_WORKERS} engines: {minimum:g} − {slack:.4f}",
        )
        rows.append(
            Row(
                2,
                f"{band} band's part of the service, every band flooding",
                round(part, 4),
                f"{part:.4f}",
                goal,
                {
                    "band": band,
                    "min_share": minimum,
                    "slack": slack,
                    "service": window.service(tenant),
                },
                f"{band} band's part",
            )
        )
    assert isinstance(window.fleet, WaitingFleet)
    waits = window.fleet.waits("bulk", warm, end)
    worst, mean = max(waits, default=0.0), statistics.fmean(waits) if waits else 0.0
    finished = window.finished("bulk") / (end - warm)
    little = _over(FLOOD_STREAMS, finished)
    unserved = window.fleet.longest_unserved("bulk", warm, end)
    minimum = shares.min_shares["batch"]
    per_engine = total / POOL_WORKERS / (end - warm)
    bound = _over((2 + minimum) * largest / minimum + largest, per_engine)
    rows += [
        Row(
            2,
            "worst wait of a batch request (arrival to first admission)",
            round(worst, 3),
            f"{worst:.2f} s (mean {mean:.2f} s)",
            None,
            {"mean_wait_s": round(mean, 3), "littles_law_wait_s": round(little, 3)},
            "worst batch wait",
        ),
        Row(
            2,
            "longest stretch with no batch request admitted anywhere",
            round(unserved, 3),
            f"{unserved:.2f} s",
            None,
            {"stated_bound_s_at_an_engine_rate": round(bound, 3), "U": largest},
            "longest stretch, no batch admission",
        ),
    ]
    notes = [
        f"Over the window the bands took interactive {1 - sum(parts.values()):.3f}, standard "
        f"{parts['standard']:.3f} and batch {parts['batch']:.3f} of the service "
        f"(S = {total:,.0f}, U = {largest:,.0f}); the batch band was "
        f"{_more_or_less(parts['batch'], minimum)} its minimum share {minimum:g} "
        f"({_verdict(rows[1])}).",
        f"The worst batch wait was {worst:.2f} s, the mean {mean:.2f} s: the flood keeps "
        f"{FLOOD_STREAMS} requests outstanding and {finished:.1f} of its requests finished "
        "per second, so by Little's law a request spends "
        f"{little:.2f} s from its arrival to its end on average ({_over(mean, little):.0%} of "
        "it waiting), its wait set by its own tenant's earlier requests.",
        f"The longest stretch in which no batch request was admitted anywhere was "
        f"{unserved:.2f} s, {_more_or_less(unserved, bound)} the {bound:.2f} s that the "
        "stated bound on the band's head request ((2 + φ)U/φ + U of others' service at "
        f"an engine) comes to at an engine's mean rate ({per_engine:,.0f} service/s).",
    ]
    return Measure("2. The lowest band's minimum share", rows, notes)


# ---------------------------------------------------------------------- 3. nesting


def nesting(settings: Settings) -> Measure:
    seed, warm, end = settings.seeds[0], settings.warm, settings.end
    org_a = [f"a{index}" for index in range(NEST_TENANTS)]
    tenants = [*org_a, "b0"]
    clients = [c for tenant in tenants for c in flood(tenant, NEST_STREAMS, seed)]
    groups = {"org-a": Group(1.0), "org-b": Group(1.0)}
    members = {tenant: "org-a" if tenant in org_a else "org-b" for tenant in tenants}
    shapes = {
        "nested": Shares({}, groups=groups, tenant_groups=members),
        "flat": Shares({}),
    }
    rows, ratios = [], {}
    for index, (shape, shares) in enumerate(shapes.items(), 1):
        window = serve(f"{index}/2 {shape}", pool(shares), warm, end, clients, seed=seed)
        a = sum(window.service(tenant) for tenant in org_a)
        b = window.service("b0")
        ratios[shape] = _over(a, b)
        expected = 1.0 if shape == "nested" else float(NEST_TENANTS)
        rows.append(
            Row(
                3,
                f"org A ({NEST_TENANTS} tenants) : org B (1), "
                + ("groups of weight 1 each" if shape == "nested" else "flat weights"),
                round(ratios[shape], 4),
                f"{ratios[shape]:.3f} : 1 (A {_over(a, a + b):.3f} of the service)",
                within(expected, WEIGHT_TOLERANCE, f"{expected:g} : 1"),
                {"org_a_service": a, "org_b_service": b},
                f"org A : B, {shape}",
            )
        )
    notes = [
        f"With groups org A took {ratios['nested']:.2f}× org B's service, half each being the "
        f"goal ({_verdict(rows[0])}); with flat weights it took {ratios['flat']:.2f}× "
        f"({_verdict(rows[1])} against {NEST_TENANTS} : 1)."
    ]
    return Measure("3. Nesting", rows, notes)


# ---------------------------------------------------------------------- 4. 4 : 1 weights


def gold_to_bronze(
    label: str,
    settings: Settings,
    engines: str,
    regime: Regime,
    clients: list[ClosedLoop],
    end: float,
    seed: int = 0,
    replicas: int = 1,
    traffic: str = "spread",
) -> tuple[float, float]:
    """gold : bronze service over [test_warm, end), and how long engines held a queue."""
    config = FleetConfig.from_profile(
        get_profile(TEST_PROFILE),
        regime.memory,
        workers=2,
        policy=engines,
        router="d2lpm",
        weights=Shares({"gold": GOLD_WEIGHT, "bronze": 1.0}),
        saturation=regime.saturation,
        gateway_replicas=replicas,
        replica_traffic=traffic,
    )
    window = serve(label, config, settings.test_warm, end, clients, seed=seed)
    return _over(window.service("gold"), window.service("bronze")), window.engine_queue()


def weights_four_to_one(settings: Settings) -> Measure:
    goal = within(GOLD_WEIGHT, WEIGHT_TOLERANCE, f"{GOLD_WEIGHT:g} : 1")
    fixed = fixed_flood("gold", WEIGHT_STREAMS) + fixed_flood("bronze", WEIGHT_STREAMS)
    # every (engines, regime): fixed lengths, the seeds, then the replicas
    plan = list(itertools.product(settings.engines, REGIMES))
    per_case = 1 + len(settings.seeds) + 2 * len(settings.replicas)
    count, total = itertools.count(1), len(plan) * per_case
    rows: list[Row] = []

    def step(text: str) -> str:
        return f"{next(count)}/{total} {text}"

    for engines, name in plan:
        regime = REGIMES[name]
        case = f"{engines} engines, {regime.label}"
        tag = f"{engines}, {regime.label.removeprefix('the ')}"
        ratio, queued = gold_to_bronze(
            step(f"{case}, fixed lengths"), settings, engines, regime, fixed, settings.test_end
        )
        one = (settings.test_warm, settings.test_end)
        rows.append(
            _weights_row(
                f"{case}, one gateway, fixed lengths",
                f"{tag}, 1 gateway, fixed",
                [ratio],
                [queued],
                goal,
                window=one,
            )
        )
        seeded = [
            gold_to_bronze(
                step(f"{case}, seed {seed}"),
                settings,
                engines,
                regime,
                flood("gold", WEIGHT_STREAMS, seed) + flood("bronze", WEIGHT_STREAMS, seed),
                settings.test_end,
                seed,
            )
            for seed in settings.seeds
        ]
        rows.append(
            _weights_row(
                f"{case}, one gateway, seeds {', '.join(map(str, settings.seeds))}",
                f"{tag}, 1 gateway, seeds",
                [r for r, _ in seeded],
                [q for _, q in seeded],
                goal,
                settings.seeds,
                one,
            )
        )
        for replicas, traffic in itertools.product(settings.replicas, ("spread", "tenant")):
            ratio, queued = gold_to_bronze(
                step(f"{case}, {replicas} replicas, {traffic}"),
                settings,
                engines,
                regime,
                fixed,
                settings.replicas_end,
                replicas=replicas,
                traffic=traffic,
            )
            rows.append(
                _weights_row(
                    f"{case}, {replicas} replicas, traffic {traffic}, fixed lengths",
                    f"{tag}, {replicas} replicas, {traffic}",
                    [ratio],
                    [queued],
                    goal,
                    window=(settings.test_warm, settings.replicas_end),
                )
            )
    return Measure("4. 4 : 1 weights", rows, _weights_notes(rows, settings))


def _weights_row(
    what: str,
    short: str,
    ratios: list[float],
    queued: list[float],
    goal: Goal,
    seeds: Sequence[int] = (),
    window: tuple[float, float] | None = None,
) -> Row:
    """A row of gold : bronze ratios: its value the one farthest from the goal's."""
    worst = max(ratios, key=lambda ratio: abs(ratio / goal.target - 1))
    shown = ", ".join(f"{ratio:.2f}" for ratio in ratios)
    queue = ", ".join(f"{part:.0%}" for part in queued)
    details: dict[str, Any] = {
        "ratios": [round(ratio, 4) for ratio in ratios],
        "engines_held_a_queue": [round(part, 3) for part in queued],
    }
    if seeds:
        details["seeds"] = list(seeds)
    if window:
        details["window_s"] = list(window)
    measured = f"{shown} : 1 (engines queued {queue} of the window)"
    return Row(4, what, round(worst, 4), measured, goal, details, short)


def _weights_notes(rows: list[Row], settings: Settings) -> list[str]:
    missed = [row for row in rows if not row.met]
    worst = max(rows, key=lambda row: abs((row.value or 0) / GOLD_WEIGHT - 1))
    return [
        f"One gateway over [{settings.test_warm:g}, {settings.test_end:g}) virtual s, replicas "
        f"over [{settings.test_warm:g}, {settings.replicas_end:g}); {len(rows) - len(missed)} "
        f"of {len(rows)} rows within {WEIGHT_TOLERANCE:.0%} of {GOLD_WEIGHT:g} : 1. The "
        f"farthest: {worst.what}, {worst.value:.2f} : 1.",
        "Not met: " + "; ".join(f"{row.what} ({row.value:.2f} : 1)" for row in missed) + "."
        if missed
        else "Every run met the goal.",
    ]


# ---------------------------------------------------------------------- 5. twelve tenants


def twelve_tenants(settings: Settings) -> Measure:
    seed, warm, end = settings.seeds[0], settings.warm, settings.end
    tenants = [f"t{index:02d}" for index in range(len(TWELVE_WEIGHTS))]
    weights = dict(zip(tenants, TWELVE_WEIGHTS, strict=True))
    clients = [c for tenant in tenants for c in flood(tenant, WEIGHTED_STREAMS, seed)]
    goal = within(1.0, TWELVE_TOLERANCE, "each tenant's part / its weighted share = 1")
    rows = []
    for index, replicas in enumerate((1, 2), 1):
        config = pool(Shares(weights), gateway_replicas=replicas)
        window = serve(f"{index}/2 {replicas} gateway(s)", config, warm, end, clients, seed=seed)
        total = window.total()
        ratios = {
            tenant: _over(window.service(tenant), total) / (weight / sum(TWELVE_WEIGHTS))
            for tenant, weight in weights.items()
        }
        worst = max(ratios.values(), key=lambda ratio: abs(ratio - 1))
        rows.append(
            Row(
                5,
                f"12 tenants, weights {', '.join(map(str, TWELVE_WEIGHTS))}; "
                f"{'one gateway' if replicas == 1 else f'{replicas} replicas, spread'}",
                round(worst, 4),
                f"{min(ratios.values()):.3f} to {max(ratios.values()):.3f} "
                f"(weight 1: {ratios[tenants[0]]:.3f}, weight 8: {ratios[tenants[-1]]:.3f})",
                goal,
                {"ratios": {t: round(r, 4) for t, r in ratios.items()}, "weights": weights},
                "one gateway" if replicas == 1 else f"{replicas} replicas, spread",
            )
        )
    notes = [
        f"With {'one gateway' if row is rows[0] else 'two replicas'} the tenants' parts came to "
        f"{row.measured.split(' (')[0]} of their weighted shares ({_verdict(row)})."
        for row in rows
    ]
    return Measure("5. Twelve tenants, weights 1 to 8", rows, notes)


# ---------------------------------------------------------------------- 6. KV pressure


def kv_pressure(settings: Settings) -> Measure:
    duration, warm = settings.kv_duration, settings.kv_warm
    weights = {"flood": 1.0, "light": 2.0}
    say("1/2 KV pool: light below its share beside the flood")
    below = kv.run("dlpm", "default", kv.FLOOD_STREAMS, kv.LIGHT_BELOW, weights, duration, warm)
    say("2/2 KV pool: light alone")
    alone = kv.run("dlpm", "default", 0, kv.LIGHT_BELOW, weights, duration, warm)
    parts = kv.sides(below, kv.below_entitlements(below, alone))
    ratio = {tenant: _over(part["share"], part["entitled"]) for tenant, part in parts.items()}
    goal = within(1.0, kv.TOLERANCE, "part of the service / entitlement = 1")
    rows = [
        Row(
            6,
            f"{tenant} tenant, light below its share in a KV-pressured pool: its part of the "
            "service / its entitlement (light: its demand alone; flood: the rest)",
            round(ratio[tenant], 4),
            f"{parts[tenant]['share']:.3f}/{parts[tenant]['entitled']:.3f}",
            goal,
            {
                "ttft_p50_beside_s": below.light_ttft_p50,
                "ttft_p50_alone_s": alone.light_ttft_p50,
                "preemptions_beside": below.preemptions,
            }
            if tenant == "light"
            else {},
            f"{tenant} part / entitled",
        )
        for tenant in kv.TENANTS
    ]
    notes = [
        f"Beside the flood the light tenant was served {ratio['light']:.3f}× its rate alone "
        f"({_verdict(rows[0])}) and the flood {ratio['flood']:.3f}× the rest "
        f"({_verdict(rows[1])}); the light tenant's TTFT p50 was "
        f"{_ms(below.light_ttft_p50)} against {_ms(alone.light_ttft_p50)} alone, with "
        f"{below.preemptions:,} preemptions in the pool."
    ]
    return Measure("6. A tenant below its share under KV pressure", rows, notes)


# ---------------------------------------------------------------------- 7. decision cost


class DecisionLoop:
    """A gateway's fair queue with every tenant waiting (two requests each). A decision is
    `release()`: the next request in the fair order, admitted and charged; it then finishes
    and its tenant sends another, so that every tenant keeps waiting."""

    def __init__(self, shares: Shares, tenants: Sequence[str]) -> None:
        self.queue = FairQueue(COST, shares, clock=lambda: 0.0)
        self.rng = random.Random(0)
        self.owners: dict[str, str] = {}
        self.ids = itertools.count()
        for tenant in tenants:
            self.send(tenant)
            self.send(tenant)

    def send(self, tenant: str) -> None:
        request_id = f"r{next(self.ids)}"
        self.owners[request_id] = tenant
        request = Request(request_id, tenant, self.rng.randint(50, 500), OUTPUT)
        self.queue.enqueue(request, None)

    def run(self, decisions: int) -> float:
        """Microseconds per decision, the mean over `decisions` of them."""
        spent = 0
        for _ in range(decisions):
            started = time.perf_counter_ns()
            request_id = self.queue.release()
            spent += time.perf_counter_ns() - started
            assert request_id is not None
            self.queue.finish(request_id, Tokens(None, OUTPUT))
            self.send(self.owners.pop(request_id))
        return spent / decisions / 1000


def decision_shapes() -> dict[str, Shares]:
    """1,000 tenants (weights 1 to 4) flat, and the same in 50 groups across the 3 bands."""
    tenants = [f"t{index:04d}" for index in range(DECISION_TENANTS)]
    weights = {tenant: 1.0 + index % 4 for index, tenant in enumerate(tenants)}
    group_of = {tenant: f"g{index % DECISION_GROUPS:02d}" for index, tenant in enumerate(tenants)}
    band_of_group = {f"g{g:02d}": BAND_NAMES[g % len(BAND_NAMES)] for g in range(DECISION_GROUPS)}
    nested = Shares(
        weights,
        groups={name: Group(1.0 + index % 3) for index, name in enumerate(band_of_group)},
        tenant_groups=group_of,
        tenant_bands={tenant: band_of_group[group] for tenant, group in group_of.items()},
    )
    return {"flat": Shares(weights), "tree": nested}


def decision_cost(settings: Settings) -> Measure:
    shapes = decision_shapes()
    loops = {name: DecisionLoop(shares, list(shares)) for name, shares in shapes.items()}
    samples: dict[str, list[float]] = {name: [] for name in loops}
    for repeat in range(settings.repeats):
        for name, loop in loops.items():  # interleaved: both see the same machine
            samples[name].append(loop.run(settings.decisions))
        say(f"decision cost: repeat {repeat + 1}/{settings.repeats}")
    flat, tree = (statistics.median(samples[name]) for name in ("flat", "tree"))
    ratio = tree / flat
    details = {"samples_us": {k: [round(v, 2) for v in s] for k, s in samples.items()}}
    rows = [
        Row(
            7,
            f"{DECISION_TENANTS:,} tenants, flat: µs per decision",
            round(flat, 2),
            f"{flat:.1f} µs",
            None,
            details,
        ),
        Row(
            7,
            f"{DECISION_TENANTS:,} tenants in {DECISION_GROUPS} groups across 3 bands: "
            "µs per decision",
            round(tree, 2),
            f"{tree:.1f} µs",
            None,
        ),
        Row(
            7,
            "tree : flat",
            round(ratio, 3),
            f"{ratio:.2f}×",
            Goal("at most", DECISION_RATIO, f"≤ {DECISION_RATIO:g}×"),
            short="decision cost, tree : flat",
        ),
    ]
    notes = [
        f"A decision of the gateway's fair queue took {flat:.1f} µs over {DECISION_TENANTS:,} "
        f"flat tenants and {tree:.1f} µs over the tree, {ratio:.2f}× ({_verdict(rows[-1])}); "
        f"medians of {settings.repeats} interleaved repeats of {settings.decisions:,} decisions."
    ]
    return Measure("7. Decision cost", rows, notes)


# ---------------------------------------------------------------------- report


def report(measures: list[Measure]) -> str:
    rows = [row for measure in measures for row in measure.rows]
    graded = [row for row in rows if row.goal is not None]
    met = sum(1 for row in graded if row.met)
    lines = [
        "Virtual time (the simulator) but for measure 7; every verdict and sentence is "
        "computed from the numbers (bench/bench_tree.py's docstring has the set-ups).",
        "",
        f"{met} of {len(graded)} goals met.",
    ]
    for measure in measures:
        lines += ["", f"### {measure.title}", "", "| what | measured | goal | met |"]
        lines.append("|---|---|---|:-:|")
        for row in measure.rows:
            goal = "—" if row.goal is None else row.goal.text
            mark = "—" if row.met is None else "yes" if row.met else "**no**"
            lines.append(f"| {row.what} | {row.measured} | {goal} | {mark} |")
        lines += ["", *measure.notes]
    return "\n".join(lines) + "\n"


def plot(measures: dict[int, Measure], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(14, 12), gridspec_kw={"height_ratios": [1, 1.7]})
    _plot_ttft(axes[0][0], measures[1])
    _plot_twelve(axes[0][1], measures[5])
    _plot_ratios(axes[1][0], measures[3].rows + measures[4].rows)
    bounded = [
        row
        for m in measures.values()
        for row in m.rows
        if row.goal is not None and row.goal.margin(row.value) is not None
    ]
    _plot_margins(axes[1][1], bounded)
    figure.suptitle("One fair order: bands, groups, weights (the simulator; decision cost: wall)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _plot_ttft(axis: Any, measure: Measure) -> None:
    on, off = (row for row in measure.rows if "TTFT" in row.what)
    values = [on.details["ttft_p99_alone_s"], on.value, off.value]
    axis.bar(
        ["alone", "bands on", "bands off"],
        [1000 * (v or 0) for v in values],
        color=["tab:gray", "tab:blue", "tab:orange"],
    )
    assert on.goal is not None
    axis.axhline(1000 * on.goal.target, color="tab:red", linestyle=":", label="goal")
    axis.set_ylabel("ms")
    axis.set_title("1. interactive TTFT p99 beside a batch flood", fontsize=10)
    axis.legend(fontsize=8)


def _plot_twelve(axis: Any, measure: Measure) -> None:
    width = 0.4
    for offset, row in enumerate(measure.rows):
        ratios = list(row.details["ratios"].values())
        xs = [index + offset * width for index in range(len(ratios))]
        axis.bar(xs, ratios, width, label=row.short)
    weights = TWELVE_WEIGHTS
    axis.set_xticks([i + width / 2 for i in range(len(weights))], [f"w{w}" for w in weights])
    axis.axhspan(1 - TWELVE_TOLERANCE, 1 + TWELVE_TOLERANCE, color="tab:green", alpha=0.2)
    axis.set_ylabel("part of the service / weighted share")
    axis.set_title("5. twelve tenants, weights 1 to 8 (green: ±10 %)", fontsize=10)
    axis.legend(fontsize=8)


def _plot_ratios(axis: Any, rows: list[Row]) -> None:
    """Measures 3 and 4: each run's ratio over the goal's (a row of seeds: every seed)."""
    points = [
        (ratio / row.goal.target, index)
        for index, row in enumerate(rows)
        if row.goal is not None
        for ratio in row.details.get("ratios", [row.value])
    ]
    axis.scatter([x for x, _ in points], [y for _, y in points], s=16, color="tab:blue")
    axis.axvspan(1 - WEIGHT_TOLERANCE, 1 + WEIGHT_TOLERANCE, color="tab:green", alpha=0.2)
    axis.set_yticks(range(len(rows)), [row.label for row in rows], fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel("measured ratio / the goal's (green: ±5 %)")
    axis.set_title("3. org A : org B and 4. gold : bronze, every run", fontsize=10)


def _plot_margins(axis: Any, rows: list[Row]) -> None:
    margins = [row.goal.margin(row.value) or 0.0 for row in rows if row.goal is not None]
    colors = ["tab:green" if margin >= 1 else "tab:red" for margin in margins]
    axis.barh([row.label for row in rows], margins, color=colors)
    axis.axvline(1.0, color="black", linestyle="--")
    axis.set_xscale("log")
    axis.invert_yaxis()
    axis.tick_params(axis="y", labelsize=7)
    axis.set_xlabel("measured / goal (at least), goal / measured (at most): ≥ 1 met")
    axis.set_title("goals with a bound", fontsize=10)


# ---------------------------------------------------------------------- main

MEASURES = {
    1: interactive,
    2: minimum_share,
    3: nesting,
    4: weights_four_to_one,
    5: twelve_tenants,
    6: kv_pressure,
    7: decision_cost,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="toy size, one seed, no record")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    started = time.perf_counter()
    measures = {}
    for number, measure in MEASURES.items():
        say(f"measure {number} of {len(MEASURES)}: {measure.__name__}")
        measures[number] = measure(settings)
    text = report(list(measures.values()))
    print(text)
    say(f"done in {time.perf_counter() - started:.0f} s")
    if settings.quick:
        print("bench_tree: quick run ok")
        return
    results = {
        "settings": {
            "pool": {
                "profile": POOL_PROFILE,
                "workers": POOL_WORKERS,
                "memory_tokens": POOL_MEMORY,
                "engines": "dlpm",
                "router": "d2lpm",
                "saturation": "the gateway's default",
            },
            "request": {"prefix": PREFIX, "question": QUESTION, "output": OUTPUT},
            "lengths": {
                "sigma": LENGTH_SIGMA,
                "question_cap": QUESTION_CAP,
                "output_cap": OUTPUT_CAP,
            },
            "window_s": [settings.warm, settings.end],
            "seeds": list(settings.seeds),
            "regimes": {
                name: {
                    "memory_tokens": regime.memory,
                    "saturation": regime.saturation.model_dump(by_alias=True),
                }
                for name, regime in REGIMES.items()
            },
        },
        "rows": [row.record() for m in measures.values() for row in m.rows],
    }
    path = write_results("tree", results, text)
    plot(measures, RESULTS / "tree.png")
    say(f"wrote {path}, tree.md and tree.png")


if __name__ == "__main__":
    main()
