"""Pipeline chains over heterogeneous GPUs (Sun, He, Hou 2026, seed 003).

- `gbp_cr` (Alg. 1) places contiguous layers so that every server keeps KV room for c jobs;
  `gca` (Alg. 2) finds the chains and capacities JFFS needs over any placement;
  `disjoint_chains` maps GBP-CR's chains to vLLM engines (exact partitions).
- `jffc_bounds`/`chain_bounds` (Theorem 3.7), `exact_two_chains` (App. A.3) and
  `mmc_response_time` predict JFFC's mean response time; `tune_capacity` chooses c.
- `plan_chains` is the operator's planner: node groups, model and workload in, engines out;
  `check_partition` reads `VLLM_PP_LAYER_PARTITION` as the pinned vLLM does.
"""

from fairpool.placement.bounds import (
    chain_bounds,
    exact_two_chains,
    jffc_bounds,
    mmc_response_time,
    total_rate,
)
from fairpool.placement.disjoint import disjoint_chains, exact_partition, rebalanced_partition
from fairpool.placement.gbp_cr import gbp_cr, required_rate
from fairpool.placement.gca import gca
from fairpool.placement.model import (
    Chain,
    ChainProblem,
    Explanation,
    Placement,
    ResponseBounds,
    Server,
)
from fairpool.placement.partition import check_partition
from fairpool.placement.planner import PlannedChain, PoolPlan, plan_chains
from fairpool.placement.profile import ModelProfile, NodeGroup, PlanPolicy, Workload
from fairpool.placement.tuning import (
    Candidate,
    Tuned,
    VllmMapping,
    build_chains,
    chains_needed,
    evaluate_capacity,
    tune_capacity,
)

__all__ = [
    "Candidate",
    "Chain",
    "ChainProblem",
    "Explanation",
    "ModelProfile",
    "NodeGroup",
    "Placement",
    "PlanPolicy",
    "PlannedChain",
    "PoolPlan",
    "ResponseBounds",
    "Server",
    "Tuned",
    "VllmMapping",
    "Workload",
    "build_chains",
    "chain_bounds",
    "chains_needed",
    "check_partition",
    "disjoint_chains",
    "evaluate_capacity",
    "exact_partition",
    "exact_two_chains",
    "gbp_cr",
    "gca",
    "jffc_bounds",
    "mmc_response_time",
    "plan_chains",
    "rebalanced_partition",
    "required_rate",
    "total_rate",
    "tune_capacity",
]
