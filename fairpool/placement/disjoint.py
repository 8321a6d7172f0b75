"""GBP-CR's disjoint chains as vLLM engines: exact layer partitions and their capacities.

A vLLM engine owns its GPUs and splits the layers exactly (`VLLM_PP_LAYER_PARTITION`), so
the mapping of Sun, He, Hou 2026, seed 003 onto it differs from the paper in two ways
(digest §6.2): a chain's last stage computes L − Σ(previous) instead of overlapping, and
GCA's server-sharing chains are not used — each complete GBP-CR chain is one engine whose
capacity is c_k = min_i ⌊(M_i − s_m·p_i − extra_i)/(s_c·p_i)⌋ (eq. (3) with one chain per
server) and whose service time is T_k = Σ (τ^c_i + τ^p_i·p_i) (eq. 2).
"""

from __future__ import annotations

from collections.abc import Sequence

from fairpool.placement.model import Chain, ChainProblem, Placement
from fairpool.sched.errors import ConfigError, require_count


def exact_partition(placement: Placement, servers: Sequence[int], layers: int) -> list[int]:
    """Layers each stage computes: m_ij = (a_j + m_j) − (a_i + m_i) along the chain (§2.1).

    A layer is computed by the first stage that hosts it, so the last stage of a GBP-CR chain,
    shifted left to end at L, computes L − Σ(previous); a stage whose layers all come before
    the previous stage's end computes none."""
    partition: list[int] = []
    covered = 0
    for index in servers:
        if placement.layers.get(index, 0) < 1 or placement.first_layer[index] > covered + 1:
            raise ConfigError("placement.chains", f"chain {tuple(servers)} skips a layer")
        end = min(placement.first_layer[index] + placement.layers[index] - 1, layers)
        partition.append(max(end - covered, 0))
        covered = max(covered, end)
    if covered != layers:
        raise ConfigError("placement.chains", f"chain {tuple(servers)} stops before layer {layers}")
    return partition


def stage_capacity(problem: ChainProblem, index: int, processed: int, extra_bytes: int) -> int:
    """Concurrent requests one stage's KV room allows: ⌊(M − s_m·p − extra)/(s_c·p)⌋."""
    server = problem.servers[index]
    room = server.memory - problem.layer_bytes * processed - extra_bytes
    return room // (problem.slot_bytes * processed)


def chain_from_partition(
    problem: ChainProblem,
    servers: Sequence[int],
    partition: Sequence[int],
    first_stage_extra: int,
    last_stage_extra: int,
) -> Chain:
    """The engine of these stages; stages computing 0 layers are dropped first."""
    stages = [(index, count) for index, count in zip(servers, partition, strict=True) if count]
    capacities = []
    for position, (index, count) in enumerate(stages):
        extra = first_stage_extra if position == 0 else 0
        extra += last_stage_extra if position == len(stages) - 1 else 0
        capacities.append(stage_capacity(problem, index, count, extra))
    seconds = sum(
        problem.servers[index].comm_seconds + problem.servers[index].layer_seconds * count
        for index, count in stages
    )
    return Chain(
        servers=tuple(index for index, _ in stages),
        processed=tuple(count for _, count in stages),
        capacity=min(capacities),
        service_seconds=seconds,
    )


def rebalanced_partition(
    problem: ChainProblem,
    servers: Sequence[int],
    first_stage_extra: int = 0,
    last_stage_extra: int = 0,
) -> list[int] | None:
    """REBALANCE of digest §6.3 (a proposal beyond Sun, He, Hou 2026, seed 003).

    Binary-search the largest c' with Σ_i min(L, ⌊(M_i − extra_i)/(s_m + s_c·c')⌋) ≥ L, then
    give layers to the stages fastest per layer first (lowest τ^p, ties by stage order) up
    to those caps; the stage order stays. None if the stages cannot hold L layers at all."""
    layers = problem.layers
    extras = [0] * len(servers)
    extras[0] += first_stage_extra
    extras[-1] += last_stage_extra

    def caps(reservation: int) -> list[int]:
        per_layer = problem.layer_bytes + problem.slot_bytes * reservation
        return [
            min(layers, max(problem.servers[index].memory - extra, 0) // per_layer)
            for index, extra in zip(servers, extras, strict=True)
        ]

    if sum(caps(0)) < layers:
        return None
    fits, too_many = 0, max(problem.servers[index].memory for index in servers) + 1
    while too_many - fits > 1:
        middle = (fits + too_many) // 2
        if sum(caps(middle)) >= layers:
            fits = middle
        else:
            too_many = middle
    limits = caps(fits)
    partition = [0] * len(servers)
    remaining = layers
    by_speed = sorted(
        range(len(servers)),
        key=lambda stage: (problem.servers[servers[stage]].layer_seconds, stage),
    )
    for stage in by_speed:
        partition[stage] = min(limits[stage], remaining)
        remaining -= partition[stage]
    return partition


def disjoint_chains(
    problem: ChainProblem,
    placement: Placement,
    rebalance: bool,
    first_stage_extra: int = 0,
    last_stage_extra: int = 0,
) -> list[Chain]:
    """One engine per complete GBP-CR chain (digest §6.2/§6.3 PLAN lines 8-12).

    `first_stage_extra`/`last_stage_extra` are bytes only stage 0 (input embedding) and the
    last stage (norm + lm_head) hold. With `rebalance`, the REBALANCE partition replaces the
    exact one when it gives at least the same capacity (ties: the lower T_k). Engines with
    capacity < 1 are left out: they could not run a single request."""
    first_extra = require_count("firstStageExtraBytes", first_stage_extra)
    last_extra = require_count("lastStageExtraBytes", last_stage_extra)
    engines = [
        engine_of(problem, placement, servers, rebalance, first_extra, last_extra)
        for servers in placement.chains
    ]
    return [engine for engine in engines if engine.capacity >= 1]


def engine_of(
    problem: ChainProblem,
    placement: Placement,
    servers: Sequence[int],
    rebalance: bool,
    first_stage_extra: int = 0,
    last_stage_extra: int = 0,
) -> Chain:
    """The engine of one complete chain, capacity < 1 included (see `disjoint_chains`)."""
    extras = (first_stage_extra, last_stage_extra)
    exact = exact_partition(placement, servers, problem.layers)
    engine = chain_from_partition(problem, servers, exact, *extras)
    balanced = rebalanced_partition(problem, servers, *extras) if rebalance else None
    if balanced is None:
        return engine
    candidate = chain_from_partition(problem, servers, balanced, *extras)
    if (candidate.capacity, -candidate.service_seconds) >= (
        engine.capacity,
        -engine.service_seconds,
    ):
        return candidate
    return engine
