"""The planner's reasons, as sentences for the people who run the pool."""

from __future__ import annotations

from collections.abc import Sequence

from fairpool.placement.bounds import chain_bounds, total_rate
from fairpool.placement.disjoint import chain_from_partition, engine_of, exact_partition
from fairpool.placement.gbp_cr import required_rate
from fairpool.placement.model import Chain, ChainProblem, Placement, ResponseBounds
from fairpool.placement.tuning import Candidate, Tuned, VllmMapping

#: Where one vLLM engine per chain departs from Sun, He, Hou 2026, seed 003 (digest §6.2).
VLLM_DIFFERENCES = (
    "vLLM differs from the paper: layer partitions are exact (a chain's last stage computes "
    "L minus the layers before it instead of overlapping them, its spare memory becomes KV)",
    "vLLM differs from the paper: no two chains share a node (an engine owns its GPUs, so "
    "GCA's server-sharing chains and their extra capacity are not used)",
    "vLLM differs from the paper: KV is paged, not reserved per request; capacity counts "
    "requests of maxModelLen tokens, so cap each chain's concurrency at its capacity in the "
    "gateway (vLLM could admit more short requests, and then preempt)",
)

SCORE_NAMES = {
    "lowerBound": "Theorem 3.7's lower bound on mean response time",
    "upperBound": "Theorem 3.7's upper bound on mean response time",
    "surrogate": "the surrogate c·K(c) of eq. (14)",
}


def explain_choice(tuned: Tuned, tuning: str, fixed: bool, tolerance: float = 0.0) -> str:
    """The chosen c and its score against the nearest stable c on either side."""
    best = tuned.best
    if fixed:
        return f"c = {best.capacity_param}: fixed by policy.capacityParam"
    unit = "" if tuning == "surrogate" else " s"
    below = [(c, s) for c, s in tuned.scores if c < best.capacity_param]
    above = [(c, s) for c, s in tuned.scores if c > best.capacity_param]
    neighbours = [f"c = {c}: {score:.4f}{unit}" for c, score in below[-1:] + above[:1]]
    return (
        f"c = {best.capacity_param}: chosen by {SCORE_NAMES[tuning]}, {best.score:.4f}{unit}"
        + (f" ({'; '.join(neighbours)})" if neighbours else " (the only stable c)")
        + f"; {len(tuned.scores)} values of c gave a stable pool, "
        + (
            f"scores within {tolerance:.0%} of the best count as ties and go to the plan with "
            "the fewest nodes, then the lower score"
            if tolerance
            else "ties go to the smaller c"
        )
    )


def explain_bounds(bounds: ResponseBounds, arrival_rate: float, chains: Sequence[Chain]) -> str:
    total = sum(chain.capacity * chain.service_rate for chain in chains)
    return (
        f"predicted mean response time {bounds.lower:.2f} to {bounds.upper:.2f} s at "
        f"{arrival_rate:g} req/s (Theorem 3.7, JFFC); the chains serve up to {total:.3f} req/s"
    )


def explain_fewer_chains(arrival_rate: float, chains: Sequence[Chain]) -> list[str]:
    """What the slower chains add, when the fastest ones alone would be stable.

    The lower bound assumes jobs sit on the fastest chains, so every extra chain can only
    lower it; this line shows by how little, against the nodes the extra chains take."""
    fastest_first = sorted(chains, key=lambda chain: chain.service_seconds)
    for size in range(1, len(chains)):
        subset = fastest_first[:size]
        if arrival_rate < total_rate(subset):
            alone = chain_bounds(arrival_rate, subset)
            every = chain_bounds(arrival_rate, chains)
            nodes = sum(len(chain.servers) for chain in subset)
            return [
                f"the fastest {size} chain(s) alone ({nodes} nodes) would be stable, "
                f"{alone.lower:.4f} to {alone.upper:.4f} s; all {len(chains)} chains give "
                f"{every.lower:.4f} to {every.upper:.4f} s"
            ]
    return []


def explain_speeds(problem: ChainProblem) -> str:
    """Groups from fastest to slowest per layer (τ^p)."""
    per_group: dict[str, float] = {}
    for server in problem.servers:
        per_group.setdefault(server.group or server.name, server.layer_seconds)
    ranked = sorted(per_group.items(), key=lambda item: item[1])
    name, seconds = ranked[0]
    rest = ", ".join(f"{other} ({value:.4g} s)" for other, value in ranked[1:])
    return f"fastest per layer: {name} ({seconds:.4g} s per layer per request)" + (
        f", then {rest}" if rest else ""
    )


def explain_rebalance(
    problem: ChainProblem, candidate: Candidate, mapping: VllmMapping, names: Sequence[str]
) -> list[str]:
    """Chains whose layers REBALANCE moved, with the capacity before and after."""
    lines = []
    extras = (mapping.first_stage_extra, mapping.last_stage_extra)
    for name, chain in zip(names, candidate.chains, strict=True):
        servers = next(c for c in candidate.placement.chains if set(chain.servers) <= set(c))
        exact = exact_partition(candidate.placement, servers, problem.layers)
        before = chain_from_partition(problem, servers, exact, *extras)
        if before.processed != chain.processed or before.servers != chain.servers:
            lines.append(
                f"{name}: layers rebalanced from {_joined(before.processed)} "
                f"(capacity {before.capacity}) to {_joined(chain.processed)} "
                f"(capacity {chain.capacity})"
            )
    return lines


def idle_reasons(
    problem: ChainProblem,
    candidate: Candidate,
    mapping: VllmMapping,
    arrival_rate: float,
    target_load: float,
) -> list[str]:
    """Why each unused node is unused, one line per reason."""
    c = candidate.capacity_param
    placement = candidate.placement
    used = {index for chain in candidate.chains for index in chain.servers}
    chain_of = {index: servers for servers in placement.chains for index in servers}
    reasons: dict[str, list[str]] = {}
    for index, server in enumerate(problem.servers):
        if index in used:
            continue
        if problem.layers_at(server, c) == 0:
            reason = f"too little memory for one layer plus KV for {c} requests"
        elif index in chain_of:
            reason = _dropped_reason(problem, placement, chain_of[index], mapping)
        elif index in placement.layers:
            reason = "their layers do not make a whole chain (GBP-CR's unfinished last chain)"
        else:
            target = required_rate(arrival_rate, target_load, c)
            reason = (
                f"not needed: the chains before them reach λ/(ρ̄c) = {target:.4g} req/s "
                "(GBP-CR stops there)"
            )
        reasons.setdefault(reason, []).append(server.name)
    return [f"idle {', '.join(nodes)}: {reason}" for reason, nodes in reasons.items()]


def _dropped_reason(
    problem: ChainProblem, placement: Placement, servers: tuple[int, ...], mapping: VllmMapping
) -> str:
    engine = engine_of(
        problem,
        placement,
        servers,
        mapping.rebalance,
        mapping.first_stage_extra,
        mapping.last_stage_extra,
    )
    if engine.capacity < 1:
        return "their chain has no KV room left for one request (capacity 0)"
    if mapping.max_stages is not None and len(engine.servers) > mapping.max_stages:
        return f"their chain would have {len(engine.servers)} stages, over maxStages"
    return "their chain's faster stages hold all the layers after rebalancing"


def _joined(counts: Sequence[int]) -> str:
    return ",".join(map(str, counts))
