"""Two tenants through the core policies on one simulated engine: who gets served?

Two scenarios, each run under every policy with the same arrivals:

- `overload` (VTC paper, Fig. 3): both tenants send more than the engine can serve, one
  at twice the other's rate (180 and 90 requests/min, 256 prompt and 256 output tokens).
  A fair policy splits the service evenly; FCFS serves in proportion to the rates.
- `shared-prefix` (DLPM paper, §2): tenant `a` floods requests that share a long system
  prompt, tenant `b` sends fewer, unrelated prompts. LPM serves `a`'s cache hits first
  and starves `b`; VTC is fair but breaks up `a`'s locality; DLPM is fair and keeps it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fairpool.sched.cost import TenantWeights
from fairpool.sched.registry import make_policy, policy_parameters
from fairpool.sched.requests import Request
from fairpool.sim.engine import SimEngine, StepTime
from fairpool.sim.metrics import jain_index, percentile

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
SCENARIO_TITLES = {
    "overload": "both tenants overloaded, a sends twice b's rate (256 in / 256 out)",
    "shared-prefix": "questions on 4 shared 2000-token documents per tenant, a at twice b's rate",
}
DEMO_POLICIES = ("fcfs", "lpm", "vtc", "dlpm")


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
