"""Two tenants through the core policies on one simulated engine: who gets served?

Two scenarios run under every policy with the same arrivals:

- `overload` (VTC paper, Fig. 3): both tenants send more than the engine can serve, one
  at twice the other's rate (180 and 90 requests/min, 256 prompt and 256 output tokens).
  A fair policy splits the service evenly; FCFS serves in proportion to the rates.
- `shared-prefix` (DLPM paper, §2): tenant `a` floods requests that share a long system
  prompt, tenant `b` sends fewer, unrelated prompts. LPM serves `a`'s cache hits first
  and starves `b`; VTC is fair but breaks up `a`'s locality; DLPM is fair and keeps it.

A third compares priority bands on and off, under DLPM (or each policy named):

- `priority`: tenant `chat` sends Poisson traffic (1 request/s of a shared 256-token
  system prompt, a 64-token question and 64 output tokens, from 10 s on), far below its
  share, while tenant `bulk` floods the engine with 48 closed-loop streams (1024 shared
  and 256 own prompt tokens, 256 output). It runs with `chat` in band `interactive` and
  `bulk` in `batch` (priority on), with both in the default band at equal weights (off),
  and with `chat` alone for reference, on paged KV memory (vLLM's 16-token blocks). Bands
  order admission only: with priority on, a waiting `chat` request goes before every
  waiting `bulk` one and waits only for KV memory to free; off, it waits for its turn
  among `bulk`'s. `bulk` runs alone for the first 10 s, so that `chat` meets the flood
  in its steady state: its first requests fill the memory at once, and a `chat` request
  arriving then waits, priority or not, until some of them end or are preempted.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fairpool.sched.cost import TenantWeights
from fairpool.sched.registry import make_policy, policy_parameters
from fairpool.sched.requests import Request
from fairpool.sched.tree import Shares
from fairpool.sim.engine import SimEngine, StepTime
from fairpool.sim.fleet import ClosedLoop, Fleet, FleetConfig
from fairpool.sim.metrics import jain_index, percentile
from fairpool.sim.trace import TraceRequest
from fairpool.sim.workloads import poisson_arrivals, stream

# Roughly Llama-2-7B on one A10G with a 10,000-token KV pool, the VTC paper's set-up:
# ~1.7 requests/s of 256 in / 256 out.
DEMO_STEP_TIME = StepTime(base=0.030, per_prefill_token=0.00012, per_decode=0.0006)
DEMO_MEMORY = 10_000
DEMO_QUANTUM = 1024.0
SAMPLE_INTERVAL = 1.0


@dataclass(frozen=True)
class Arrival:
    time: float
    request: Request
    tokens: list[int]
    output_tokens: int


@dataclass(frozen=True)
class TenantResult:
    tenant: str
    sent: int
    finished: int
    service: float
    share: float
    ttft_p50: float | None


@dataclass(frozen=True)
class RunResult:
    scenario: str
    policy: str
    tenants: list[TenantResult]
    throughput: float  # (prompt + output) tokens finished per second
    cache_hit_rate: float
    jain_index: float
    # (virtual time, cumulative service per tenant), sampled once per virtual second
    service_over_time: list[tuple[float, dict[str, float]]]


def _uniform(rate_per_min: float, duration: float, offset: float = 0.0) -> Iterator[float]:
    gap = 60.0 / rate_per_min
    time = offset
    while time < duration:
        yield time
        time += gap


def overload(duration: float, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    arrivals = []
    for tenant, rate in (("a", 180.0), ("b", 90.0)):
        for index, time in enumerate(_uniform(rate, duration, offset=0.01 * (tenant == "b"))):
            tokens = [rng.randrange(32_000) for _ in range(256)]
            request = Request(f"{tenant}-{index}", tenant, 256, 256, arrival=time)
            arrivals.append(Arrival(time, request, tokens, 256))
    return sorted(arrivals, key=lambda arrival: arrival.time)


def shared_prefix(duration: float, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    arrivals = []
    for tenant, rate in (("a", 600.0), ("b", 300.0)):
        documents = [[rng.randrange(32_000) for _ in range(2000)] for _ in range(4)]
        for index, time in enumerate(_uniform(rate, duration, offset=0.01 * (tenant == "b"))):
            tokens = rng.choice(documents) + [rng.randrange(32_000) for _ in range(64)]
            request = Request(f"{tenant}-{index}", tenant, len(tokens), 32, arrival=time)
            arrivals.append(Arrival(time, request, tokens, 32))
    return sorted(arrivals, key=lambda arrival: arrival.time)


SCENARIOS: dict[str, Callable[[float, int], list[Arrival]]] = {
    "overload": overload,
    "shared-prefix": shared_prefix,
}
#: The scenario that compares priority bands on and off (`run_priority`).
PRIORITY = "priority"
#: Every scenario's name: the policy comparisons, then the priority bands'.
SCENARIO_NAMES = (*SCENARIOS, PRIORITY)
SCENARIO_TITLES = {
    "overload": "both tenants overloaded, a sends twice b's rate (256 in / 256 out)",
    "shared-prefix": "questions on 4 shared 2000-token documents per tenant, a at twice b's rate",
    PRIORITY: "interactive chat beside a batch flood, bands on and off",
}
DEMO_POLICIES = ("fcfs", "lpm", "vtc", "dlpm")
#: The policy the priority scenario runs under unless another is named.
PRIORITY_POLICY = "dlpm"


def run(
    scenario: str,
    policy_name: str,
    duration: float = 60.0,
    seed: int = 0,
    weights: dict[str, float] | None = None,
) -> RunResult:
    """Serve the scenario's arrivals for `duration` virtual seconds under one policy."""
    tenant_weights = TenantWeights(weights)
    params: dict[str, Any] = {}
    if "quantum" in policy_parameters(policy_name):
        params["quantum"] = DEMO_QUANTUM
    policy = make_policy(policy_name, weights=tenant_weights, **params)
    engine = SimEngine(
        policy, memory_tokens=DEMO_MEMORY, step_time=DEMO_STEP_TIME, admission="reserve"
    )
    arrivals = SCENARIOS[scenario](duration, seed)
    sent: dict[str, int] = {}
    samples: list[tuple[float, dict[str, float]]] = []
    next_arrival = 0
    while engine.now < duration:
        if not samples or engine.now >= samples[-1][0] + SAMPLE_INTERVAL:
            samples.append((engine.now, dict(policy.served)))
        while next_arrival < len(arrivals) and arrivals[next_arrival].time <= engine.now:
            arrival = arrivals[next_arrival]
            engine.submit(arrival.request, arrival.tokens, arrival.output_tokens)
            sent[arrival.request.tenant] = sent.get(arrival.request.tenant, 0) + 1
            next_arrival += 1
        if engine.idle():
            if next_arrival >= len(arrivals):
                break
            engine.now = arrivals[next_arrival].time
            continue
        engine.step()
    samples.append((engine.now, dict(policy.served)))
    return _summarise(scenario, policy_name, engine, sent, tenant_weights, duration, samples)


def _summarise(
    scenario: str,
    policy_name: str,
    engine: SimEngine,
    sent: dict[str, int],
    weights: TenantWeights,
    duration: float,
    samples: list[tuple[float, dict[str, float]]],
) -> RunResult:
    served = engine.policy.served
    tenants = sorted(sent)
    total = sum(served[tenant] for tenant in tenants) or 1.0
    results = []
    for tenant in tenants:
        done = [c for c in engine.completions if c.request.tenant == tenant]
        ttfts = [c.first_token_at - c.request.arrival for c in done]
        results.append(
            TenantResult(
                tenant=tenant,
                sent=sent[tenant],
                finished=len(done),
                service=served[tenant],
                share=served[tenant] / total,
                ttft_p50=percentile(ttfts, 0.5),
            )
        )
    finished_tokens = sum(c.request.prompt_tokens + c.output_tokens for c in engine.completions)
    prompt = engine.prompt_tokens or 1
    return RunResult(
        scenario=scenario,
        policy=policy_name,
        tenants=results,
        throughput=finished_tokens / max(engine.now, duration),
        cache_hit_rate=engine.cached_prompt_tokens / prompt,
        jain_index=jain_index([served[t] / weights[t] for t in tenants]),
        service_over_time=samples,
    )


# --- priority bands -----------------------------------------------------------------------

INTERACTIVE, BATCH = "chat", "bulk"  # the priority scenario's tenants
PRIORITY_RATE = 1.0  # chat requests per second (Poisson)
PRIORITY_WARM_UP = 10.0  # seconds of bulk alone before chat starts (at most half the run)
BULK = ClosedLoop(BATCH, streams=48, prefix=1024, question=256, output_tokens=256)
PRIORITY_BANDS = {INTERACTIVE: "interactive", BATCH: "batch"}


@dataclass(frozen=True)
class BandTenant:
    tenant: str
    band: str
    sent: int
    finished: int
    share: float  # of the service delivered in the run
    ttft_p50: float | None
    ttft_p99: float | None
    throughput: float  # (prompt + output) tokens finished per second


@dataclass(frozen=True)
class PriorityRun:
    label: str  # "on", "off" or "alone"
    tenants: list[BandTenant]
    # (arrival, TTFT) of every interactive request that finished (as the percentiles count)
    interactive_ttfts: list[tuple[float, float]]

    def tenant(self, name: str) -> BandTenant | None:
        return next((tenant for tenant in self.tenants if tenant.tenant == name), None)


@dataclass(frozen=True)
class PriorityResult:
    scenario: str
    policy: str
    runs: list[PriorityRun]  # on, off, alone
    findings: list[str]  # sentences derived from the runs' numbers

    def run(self, label: str) -> PriorityRun:
        return next(run for run in self.runs if run.label == label)


def chat_arrivals(duration: float, seed: int) -> list[TraceRequest]:
    """The interactive tenant's Poisson requests, from the warm-up to `duration`."""
    start = min(PRIORITY_WARM_UP, duration / 2)
    times = poisson_arrivals(PRIORITY_RATE, start, duration, stream(seed, PRIORITY, INTERACTIVE))
    segments = ((f"system-{INTERACTIVE}", 256), (None, 64))
    return [TraceRequest(round(time, 6), INTERACTIVE, segments, 64, 64) for time in times]


def run_priority(
    policy_name: str = PRIORITY_POLICY,
    duration: float = 60.0,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> PriorityResult:
    """The `priority` scenario under one policy: priority on (chat interactive, bulk
    batch), off (both in the default band, equal weights), and chat alone; `progress`
    hears each run's label as it starts."""
    on = Shares(tenant_bands=PRIORITY_BANDS)
    runs = []
    for label, shares, clients in (
        ("on", on, [BULK]),
        ("off", Shares(), [BULK]),
        ("alone", on, []),
    ):
        if progress is not None:
            progress(label)
        config = FleetConfig(
            policy=policy_name,
            memory_tokens=DEMO_MEMORY,
            step_time=DEMO_STEP_TIME,
            admission="paged",
            block_size=16,
            weights=shares,
        )
        fleet = Fleet(config, seed=seed)
        fleet.run(chat_arrivals(duration, seed), duration=duration, clients=clients)
        runs.append(_priority_run(label, fleet))
    return PriorityResult(PRIORITY, policy_name, runs, priority_findings(runs))


def _priority_run(label: str, fleet: Fleet) -> PriorityRun:
    summary = fleet.summary()
    duration = summary["duration_s"] or 1.0
    total = sum(tenant["service"] for tenant in summary["tenants"].values()) or 1.0
    tenants = [
        BandTenant(
            tenant=name,
            band=fleet.shares.tenant_band(name),
            sent=figures["requests"],
            finished=figures["finished"],
            share=figures["service"] / total,
            ttft_p50=figures["ttft_p50"],
            ttft_p99=figures["ttft_p99"],
            throughput=(figures["input_tokens"] + figures["output_tokens"]) / duration,
        )
        for name, figures in summary["tenants"].items()
    ]
    ttfts = [
        (c.request.arrival, c.first_token_at - c.request.arrival)
        for c in fleet.recorder.completions
        if c.request.tenant == INTERACTIVE
    ]
    return PriorityRun(label, tenants, sorted(ttfts))


def priority_findings(runs: list[PriorityRun]) -> list[str]:
    """What the runs show, each sentence from their numbers."""
    by_label = {run.label: run for run in runs}
    on, off, alone = (by_label.get(label) for label in ("on", "off", "alone"))
    if on is None or off is None:
        return []
    findings = []
    chat_on, chat_off = on.tenant(INTERACTIVE), off.tenant(INTERACTIVE)
    chat_alone = alone.tenant(INTERACTIVE) if alone is not None else None
    if chat_on is not None and chat_off is not None:
        for name in ("p99", "p50"):
            with_bands = getattr(chat_on, f"ttft_{name}")
            without = getattr(chat_off, f"ttft_{name}")
            if with_bands is None or without is None:
                continue
            if with_bands == without:
                change = f"left {INTERACTIVE}'s TTFT {name} at {milliseconds(without)}"
            else:
                verb = "cut" if with_bands < without else "raised"
                change = (
                    f"{verb} {INTERACTIVE}'s TTFT {name} from {milliseconds(without)} "
                    f"to {milliseconds(with_bands)}"
                )
            reference = getattr(chat_alone, f"ttft_{name}", None)
            findings.append(f"priority {change} (alone: {milliseconds(reference)})")
        findings.append(
            f"without priority, {INTERACTIVE} took {chat_off.share:.0%} of the service "
            f"(an equal share: {1 / len(off.tenants):.0%})"
        )
    bulk_on, bulk_off = on.tenant(BATCH), off.tenant(BATCH)
    if bulk_on is not None and bulk_off is not None and bulk_off.throughput:
        cost = bulk_on.throughput / bulk_off.throughput - 1
        findings.append(
            f"{BATCH}'s throughput: {bulk_on.throughput:,.0f} tokens/s with priority, "
            f"{bulk_off.throughput:,.0f} without ({cost:+.1%})"
        )
    return findings


def milliseconds(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:,.0f} ms"
