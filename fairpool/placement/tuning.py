"""Choosing GBP-CR's capacity requirement c.

Sun, He, Hou 2026, seed 003, §3.1.3 (eqs. 13-14) and §3.2.3. A small c gives every server
more layers (short, fast chains, little KV room); a large c gives fewer layers and more
concurrency. For every c in 1..c_max: place with GBP-CR, build the chains, skip c when
λ ≥ ν = Σ c_k μ_k (Lemma 3.6), and score it by
- `lowerBound` (default): Theorem 3.7's lower bound (31)/λ — the paper's best tuner (Fig. 6-7);
- `upperBound`: the bound (32)/λ (reserves too much cache, per the paper);
- `surrogate`: c·K(c) of eq. (14) (reserves too little, per the paper).
Ties go to the smaller c. With a `tolerance` (the planner's, for deployments), scores within
that fraction of the best count as ties too and go to the plan using the fewest servers:
a plan that deploys twelve more nodes to shave 0.01 % off a bound is not better. Chains come
from GCA (`mode="paper"`, the paper's §3.2.3) or from
GBP-CR's disjoint chains mapped to vLLM engines (`mode="vllm"`, digest §6.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fairpool.placement.bounds import chain_bounds, total_rate
from fairpool.placement.disjoint import disjoint_chains
from fairpool.placement.gbp_cr import gbp_cr
from fairpool.placement.gca import gca
from fairpool.placement.model import Chain, ChainProblem, Placement, ResponseBounds
from fairpool.sched.errors import ConfigError, require_count

Mode = Literal["paper", "vllm"]
Tuning = Literal["lowerBound", "upperBound", "surrogate"]
TUNINGS: tuple[Tuning, ...] = ("lowerBound", "upperBound", "surrogate")


@dataclass(frozen=True)
class VllmMapping:
    """How GBP-CR chains become vLLM engines (`mode="vllm"`; see `disjoint_chains`)."""

    rebalance: bool = True
    first_stage_extra: int = 0  # bytes only stage 0 holds (input embedding)
    last_stage_extra: int = 0  # bytes only the last stage holds (norm + lm_head)
    max_stages: int | None = None  # longer chains are not deployed


@dataclass(frozen=True)
class Candidate:
    """One value of c, evaluated."""

    capacity_param: int
    placement: Placement
    chains: tuple[Chain, ...]
    bounds: ResponseBounds
    chains_needed: int | None  # K(c), eq. (13); None when GBP-CR never meets λ/(ρ̄c)
    score: float


@dataclass(frozen=True)
class Tuned:
    """The chosen c and the score of every c that gave a stable pool, by c."""

    best: Candidate
    scores: tuple[tuple[int, float], ...]


def chains_needed(placement: Placement) -> int | None:
    """K(c) of eq. (13) for GBP-CR's placement at c: the chains it took to reach λ/(ρ̄c).

    GBP-CR stops at the first chain that reaches the target, so K(c) is its chain count;
    None stands for K(c) = ∞ (all servers used and the target still missed)."""
    return len(placement.chains) if placement.target_met else None


def build_chains(
    problem: ChainProblem, placement: Placement, mode: Mode, mapping: VllmMapping
) -> list[Chain]:
    """GCA's chains (paper) or the disjoint vLLM engines (vllm) of a placement."""
    if mode == "paper":
        return gca(problem, placement)
    if mode != "vllm":
        raise ConfigError("mode", f"must be 'paper' or 'vllm', got {mode!r}")
    engines = disjoint_chains(
        problem, placement, mapping.rebalance, mapping.first_stage_extra, mapping.last_stage_extra
    )
    if mapping.max_stages is None:
        return engines
    return [engine for engine in engines if len(engine.servers) <= mapping.max_stages]


def tune_capacity(
    problem: ChainProblem,
    arrival_rate: float,
    target_load: float = 0.7,
    mode: Mode = "paper",
    tuning: Tuning = "lowerBound",
    mapping: VllmMapping | None = None,
    capacity_params: range | None = None,
    tolerance: float = 0.0,
) -> Tuned:
    """TUNE of §3.2.3 / eq. (14) over `capacity_params` (default 1..c_max).

    Placements repeat across neighbouring c (m_j(c) is a step function), so chains and bounds
    are computed once per distinct placement."""
    if tuning not in TUNINGS:
        raise ConfigError("tuning", f"must be one of {', '.join(TUNINGS)}, got {tuning!r}")
    mapping = mapping or VllmMapping()
    if capacity_params is None:
        capacity_params = range(1, problem.max_capacity_param() + 1)
    seen: dict[tuple[object, ...], tuple[tuple[Chain, ...], ResponseBounds] | None] = {}
    candidates: list[Candidate] = []
    scores: list[tuple[int, float]] = []
    for c in capacity_params:
        placement = gbp_cr(problem, c, arrival_rate, target_load)
        key = _placement_key(placement)
        if key not in seen:
            seen[key] = _stable_chains(problem, placement, arrival_rate, mode, mapping)
        evaluated = seen[key]
        if evaluated is None:
            continue
        chains, bounds = evaluated
        needed = chains_needed(placement)
        if tuning == "lowerBound":
            score = bounds.lower
        elif tuning == "upperBound":
            score = bounds.upper
        elif needed is None:
            continue
        else:
            score = float(c * needed)
        scores.append((c, score))
        candidates.append(Candidate(c, placement, chains, bounds, needed, score))
    if not candidates:
        raise ConfigError(
            "arrivalRate",
            f"{arrival_rate} req/s: no capacity parameter in {_describe(capacity_params)} gives "
            + ("chains meeting λ/(ρ̄c)" if tuning == "surrogate" else "a stable pool (λ < ν)"),
        )
    return Tuned(best=_best(candidates, tolerance), scores=tuple(scores))


def _best(candidates: list[Candidate], tolerance: float) -> Candidate:
    """The lowest score, ties to the smallest c; with a tolerance, first the fewest servers
    among the scores within it."""
    lowest = min(candidate.score for candidate in candidates)
    near = [c for c in candidates if c.score <= lowest + abs(lowest) * tolerance]
    return min(
        near,
        key=lambda c: (
            sum(len(chain.servers) for chain in c.chains) if tolerance else 0,
            c.score,
            c.capacity_param,
        ),
    )


def evaluate_capacity(
    problem: ChainProblem,
    capacity_param: int,
    arrival_rate: float,
    target_load: float = 0.7,
    mode: Mode = "paper",
    mapping: VllmMapping | None = None,
) -> Candidate:
    """One fixed c (no tuning); raises ConfigError when its chains cannot carry λ."""
    c = require_count("capacityParam", capacity_param, minimum=1)
    try:
        tuned = tune_capacity(
            problem, arrival_rate, target_load, mode, "lowerBound", mapping, range(c, c + 1)
        )
    except ConfigError as error:
        if error.parameter != "arrivalRate":
            raise
        raise ConfigError("capacityParam", f"c = {c}: {error.problem}") from error
    return tuned.best


def _stable_chains(
    problem: ChainProblem,
    placement: Placement,
    arrival_rate: float,
    mode: Mode,
    mapping: VllmMapping,
) -> tuple[tuple[Chain, ...], ResponseBounds] | None:
    chains = tuple(build_chains(problem, placement, mode, mapping))
    if not chains or arrival_rate >= total_rate(chains):
        return None
    return chains, chain_bounds(arrival_rate, chains)


def _placement_key(placement: Placement) -> tuple[object, ...]:
    return (
        tuple(sorted(placement.first_layer.items())),
        tuple(sorted(placement.layers.items())),
        placement.chains,
    )


def _describe(capacity_params: range) -> str:
    if len(capacity_params) == 0:
        return "an empty range (no server holds a layer and a cache slot)"
    return f"{capacity_params.start}..{capacity_params.stop - 1}"
