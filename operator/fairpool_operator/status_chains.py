"""The status of a placement pool, from its chains' workloads and pods: pure, like `status`.

A chain serves when its stage 0 is ready (vLLM's /health answers there only once every stage
has joined the pipeline), so `replicas` and `readyReplicas` count chains, and `endpoints`
list the stage-0 pods. `placement` is the plan the objects were rendered from; a status
refresh that did not plan (after a workload changed) leaves it as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fairpool.api.status import PlacementStatus
from fairpool.placement.planner import PoolPlan as ChainPlan
from fairpool_operator import contract
from fairpool_operator.plan import DesiredPool
from fairpool_operator.status import (
    _endpoint,
    _failure,
    _generation,
    _is_served,
    _name,
    condition,
    image_status,
)

#: Seconds in the status are rounded to this many decimals (a replan with the same inputs
#: writes nothing; a millisecond is finer than any prediction here).
DECIMALS = 4


def placement_status(chains: ChainPlan) -> dict[str, Any]:
    """The plan as `status.placement` (the CRD's shape, checked by the model)."""
    document = chains.to_dict()
    bounds = document["predictedResponseSeconds"]
    document["predictedResponseSeconds"] = {
        key: round(float(value), DECIMALS) for key, value in bounds.items()
    }
    for chain in document["chains"]:
        chain["serviceSeconds"] = round(float(chain["serviceSeconds"]), DECIMALS)
    model = PlacementStatus.model_validate(document)
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def chains_pool_status(
    plan: DesiredPool,
    workloads: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """What a placement pool's status should say (conditions without transition times)."""
    generation = _generation(plan.body)
    wanted = _chains_wanted(plan, workloads)
    heads = [
        pod
        for pod in sorted(pods, key=_name)
        if _is_served(pod) and _labels(pod).get(contract.STAGE_LABEL) == "0"
    ]
    endpoints = [endpoint for endpoint in map(_endpoint, heads) if endpoint is not None]
    ready = len({_labels(pod).get(contract.CHAIN_LABEL) for pod in heads if _ready(pod)})

    if not wanted:
        reason = plan.problem.reason if plan.problem else "Creating"
        ready_condition = condition("Ready", False, reason, "no chain rendered", generation)
    else:
        message = f"{ready}/{wanted} chains ready"
        reason = "ChainsReady" if ready >= wanted else "ChainsNotReady"
        ready_condition = condition("Ready", ready >= wanted, reason, message, generation)
    behind = [_name(obj) for obj in workloads if _rolling(obj)]
    progressing = condition(
        "Progressing",
        bool(behind),
        "RollingOut" if behind else "RolloutComplete",
        f"rolling out {', '.join(sorted(behind))}" if behind else f"{len(workloads)} workloads",
        generation,
    )
    problem = plan.problem or _failure(None, pods)
    if problem is not None:
        degraded = condition("Degraded", True, problem.reason, problem.message, generation)
    else:
        degraded = condition("Degraded", False, "AsExpected", "", generation)
    result: dict[str, Any] = {
        "replicas": len(heads),
        "readyReplicas": ready,
        "endpoints": endpoints,
        "conditions": [ready_condition, progressing, degraded],
    }
    if plan.chains is not None:
        result["placement"] = placement_status(plan.chains)
    if generation is not None:
        result["observedGeneration"] = generation
    return {**result, **image_status(plan)}


def _chains_wanted(plan: DesiredPool, workloads: Sequence[Mapping[str, Any]]) -> int:
    """Chains of the plan; without one (a status refresh), chains with a workload."""
    if plan.chains is not None:
        return len(plan.chains.chains)
    return len({_labels(obj).get(contract.CHAIN_LABEL) for obj in workloads} - {None})


def _rolling(workload: Mapping[str, Any]) -> bool:
    """Whether the controller has yet to act on the latest spec, or pods are not updated."""
    metadata, status = workload.get("metadata", {}), workload.get("status") or {}
    if not status:  # not seen by its controller yet
        return True
    observed = status.get("observedGeneration")  # LeaderWorkerSets have none
    if observed is not None and int(observed) < int(metadata.get("generation", 0) or 0):
        return True
    replicas = int((workload.get("spec") or {}).get("replicas", 1) or 0)
    updated = status.get("updatedReplicas")
    return updated is not None and int(updated) < replicas


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(
        item.get("type") == "Ready" and item.get("status") == "True"
        for item in pod.get("status", {}).get("conditions", []) or []
    )


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("labels") or {}
