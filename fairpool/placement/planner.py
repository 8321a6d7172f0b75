"""PLAN: node groups, a model and a workload in; vLLM pipeline engines out.

Digest §6.3 (a proposal built on Sun, He, Hou 2026, seed 003): build one server per node
(`profile.build_servers`), tune GBP-CR's c (§3.1.3/§3.2.3, Alg. 1 and Theorem 3.7) with
the chains mapped to vLLM engines (`disjoint_chains`: exact partitions, optional
REBALANCE, embedding and lm_head on the end stages, at most `max_stages` stages), and
report each engine's nodes in stage order, its `VLLM_PP_LAYER_PARTITION`, capacity c_k and
service time T_k, the idle nodes, Theorem 3.7's bounds and the reasons.

A model that fits on one node with room gets single-stage chains (partition "L") whenever
that is what the score prefers: GBP-CR then gives every such node all L layers.

Mixed tensor-parallel sizes are rejected (vLLM needs one size on every stage of an engine);
plan one pool per `gpus` value.

With `rebalance` (the default) a chain's capacity no longer depends on c, so a small c
costs the fast chains nothing and only makes GBP-CR build more, slower chains; the lower
bound, which assumes jobs sit on the fastest chains, can only improve with each of them.
The tuned plan may therefore deploy slow chains for a tiny gain (digest §6.5 at λ = 1:
11.8306 s with three chains against 11.8313 s with the H100 chain alone). The explanation
states that trade; `rebalance=False` or `tuning="upperBound"` keep such nodes idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fairpool.placement.explain import (
    VLLM_DIFFERENCES,
    explain_bounds,
    explain_choice,
    explain_fewer_chains,
    explain_rebalance,
    explain_speeds,
    idle_reasons,
)
from fairpool.placement.model import ChainProblem, ResponseBounds
from fairpool.placement.partition import check_partition
from fairpool.placement.profile import ModelProfile, NodeGroup, PlanPolicy, Workload, build_servers
from fairpool.placement.tuning import Tuned, VllmMapping, evaluate_capacity, tune_capacity
from fairpool.sched.errors import ConfigError

__all__ = [
    "ModelProfile",
    "NodeGroup",
    "PlanPolicy",
    "PlannedChain",
    "PoolPlan",
    "Workload",
    "check_partition",
    "plan_chains",
]

#: Error fields of the tuning layer, as the planner's inputs name them.
_SECTIONS = {
    "arrivalRate": "workload.arrivalRate",
    "targetLoad": "workload.targetLoad",
    "capacityParam": "policy.capacityParam",
}


@dataclass(frozen=True)
class PlannedChain:
    """One vLLM engine: `--pipeline-parallel-size len(nodes)`, pods pinned to `nodes`."""

    name: str
    nodes: tuple[str, ...]  # stage order
    groups: tuple[str, ...]  # node group of each stage
    layer_partition: tuple[int, ...]  # layers of each stage; sums to L
    capacity: int  # c_k: concurrent requests (gateway limit; --max-num-seqs ≥ this)
    service_seconds: float  # T_k = Σ (τ^c + τ^p·p_i)

    @property
    def partition_string(self) -> str:
        """`VLLM_PP_LAYER_PARTITION`, e.g. "27,27,26" (just "L" for one stage)."""
        return ",".join(str(count) for count in self.layer_partition)

    @property
    def service_rate(self) -> float:
        return 1.0 / self.service_seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nodes": list(self.nodes),
            "groups": list(self.groups),
            "layerPartition": self.partition_string,
            "capacity": self.capacity,
            "serviceSeconds": self.service_seconds,
        }


@dataclass(frozen=True)
class PoolPlan:
    """What the operator deploys, and why."""

    capacity_param: int
    chains: list[PlannedChain]
    idle_nodes: list[str]
    bounds: ResponseBounds  # Theorem 3.7 on mean response time (seconds)
    explanation: list[str]
    tensor_parallel_size: int = 1  # --tensor-parallel-size of every stage
    scores: tuple[tuple[int, float], ...] = field(default=())  # (c, score) of every stable c

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, camelCase keys (the InferencePool status shape)."""
        return {
            "capacityParam": self.capacity_param,
            "predictedResponseSeconds": {"lower": self.bounds.lower, "upper": self.bounds.upper},
            "chains": [chain.to_dict() for chain in self.chains],
            "idleNodes": list(self.idle_nodes),
            "explanation": list(self.explanation),
        }


def plan_chains(
    model: ModelProfile,
    groups: Sequence[NodeGroup],
    workload: Workload,
    policy: PlanPolicy | None = None,
) -> PoolPlan:
    """PLAN(𝒩, model, workload, policy) of digest §6.3, lines 1-16 (no hysteresis)."""
    policy = policy or PlanPolicy()
    servers = build_servers(model, groups, workload)
    problem = ChainProblem(servers, model.layers, model.layer_bytes, model.slot_bytes)
    _require_room(problem)
    mapping = VllmMapping(
        rebalance=policy.rebalance,
        first_stage_extra=model.embedding_bytes,
        last_stage_extra=model.head_bytes,
        max_stages=policy.max_stages,
    )
    tuned = _tune(problem, workload, policy, mapping)
    best = tuned.best
    names = [f"chain-{k}" for k in range(len(best.chains))]
    chains = [
        PlannedChain(
            name=name,
            nodes=tuple(servers[index].name for index in chain.servers),
            groups=tuple(servers[index].group for index in chain.servers),
            layer_partition=chain.processed,
            capacity=chain.capacity,
            service_seconds=chain.service_seconds,
        )
        for name, chain in zip(names, best.chains, strict=True)
    ]
    for chain in chains:  # what vLLM will be given must pass vLLM's own checks
        check_partition(chain.partition_string, len(chain.nodes), model.layers)
    used = {node for chain in chains for node in chain.nodes}
    explanation = [
        explain_choice(
            tuned,
            policy.tuning,
            fixed=policy.capacity_param is not None,
            tolerance=policy.score_tolerance,
        ),
        explain_bounds(best.bounds, workload.arrival_rate, best.chains),
        *explain_fewer_chains(workload.arrival_rate, best.chains),
        explain_speeds(problem),
        *explain_rebalance(problem, best, mapping, names),
        *idle_reasons(problem, best, mapping, workload.arrival_rate, workload.target_load),
        *VLLM_DIFFERENCES,
    ]
    return PoolPlan(
        capacity_param=best.capacity_param,
        chains=chains,
        idle_nodes=[server.name for server in servers if server.name not in used],
        bounds=best.bounds,
        explanation=explanation,
        tensor_parallel_size=groups[0].gpus,
        scores=tuned.scores,
    )


def _require_room(problem: ChainProblem) -> None:
    """All nodes together must hold L layers with KV for one request each (c = 1)."""
    hosted = sum(problem.layers_at(server, 1) for server in problem.servers)
    if hosted < problem.layers:
        raise ConfigError(
            "nodeGroups",
            f"the nodes hold at most {hosted} of the model's {problem.layers} layers with KV "
            "for one request of maxModelLen tokens; add nodes or memory",
        )


def _tune(
    problem: ChainProblem, workload: Workload, policy: PlanPolicy, mapping: VllmMapping
) -> Tuned:
    try:
        if policy.capacity_param is None:
            return tune_capacity(
                problem,
                workload.arrival_rate,
                workload.target_load,
                "vllm",
                policy.tuning,
                mapping,
                tolerance=policy.score_tolerance,
            )
        best = evaluate_capacity(
            problem,
            policy.capacity_param,
            workload.arrival_rate,
            workload.target_load,
            "vllm",
            mapping,
        )
        return Tuned(best=best, scores=((best.capacity_param, best.score),))
    except ConfigError as error:
        if error.parameter not in _SECTIONS:
            raise
        raise ConfigError(_SECTIONS[error.parameter], error.problem) from error
