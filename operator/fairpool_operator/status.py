"""Pure functions: the status of a pool (from its Deployment and pods) and of a tenant (from
the plan), and the patch that brings a status up to date — None when it already is, so a
reconcile with nothing changed writes nothing.

Pool conditions: Ready (every replica serves), Progressing (a rollout or scaling is under
way), Degraded (the spec is invalid — the message names the field — or the replicas fail),
and for vLLM pools ModelReady (the weights are where the engines load them; else why not:
`fairpool_operator.model_status`).
Tenant conditions: Ready (in the gateway's table), SecretMissing (its API keys cannot be
read — the message names the Secret and key).
Group conditions: Ready (in the fair order's tree as its spec says; else why not: its parent
is missing or invalid, or the groups form a cycle — the message names them).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from fairpool_operator import contract
from fairpool_operator.model_status import fetch_failure, model_readiness
from fairpool_operator.plan import DesiredPool, GroupPlan, Problem, TenantPlan
from fairpool_operator.render import pod_shape

#: Degraded reasons that only a full reconcile can establish (they need every pool); a
#: status refresh of one pool keeps them as they are.
PLAN_REASONS = frozenset({"DuplicateModel", "Conflict", "PlacementInfeasible"})
#: Container states that mean a replica will not come up by itself.
FAILING_WAITS = frozenset(
    {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"}
)


def condition(
    kind: str, status: bool, reason: str, message: str, generation: int | None
) -> dict[str, Any]:
    """A condition without its transition time (`status_patch` adds it)."""
    body: dict[str, Any] = {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
    }
    if generation is not None:
        body["observedGeneration"] = generation
    return body


def pool_status(
    plan: DesiredPool, deployment: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """What the pool's status should say (conditions without transition times)."""
    generation = _generation(plan.body)
    spec = (deployment or {}).get("spec", {})
    status = (deployment or {}).get("status", {})
    desired = int(spec.get("replicas", 0) or 0)
    replicas = int(status.get("replicas", 0) or 0)
    ready = int(status.get("readyReplicas", 0) or 0)
    updated = int(status.get("updatedReplicas", 0) or 0)
    endpoints = [_endpoint(pod) for pod in sorted(pods, key=_name) if _is_served(pod)]
    endpoints = [endpoint for endpoint in endpoints if endpoint is not None]

    if deployment is None:
        reason = plan.problem.reason if plan.problem else "Creating"
        ready_condition = condition("Ready", False, reason, "no engine Deployment", generation)
    elif desired == 0:
        ready_condition = condition("Ready", False, "ScaledToZero", "replicas: 0", generation)
    else:
        message = f"{ready}/{desired} replicas ready"
        reason = "ReplicasReady" if ready >= desired else "ReplicasNotReady"
        ready_condition = condition("Ready", ready >= desired, reason, message, generation)

    rolling = deployment is not None and (
        int(status.get("observedGeneration", 0) or 0)
        < int(deployment.get("metadata", {}).get("generation", 0) or 0)
        or updated < desired
        or replicas != desired
    )
    progress = (
        f"{updated}/{desired} replicas updated, {replicas} exist"
        if deployment is not None
        else "no engine Deployment"
    )
    progressing = condition(
        "Progressing",
        rolling,
        "RollingOut" if rolling else "RolloutComplete",
        progress,
        generation,
    )
    degraded_problem = plan.problem or fetch_failure(pods) or _failure(deployment, pods)
    if degraded_problem is not None:
        degraded = condition(
            "Degraded", True, degraded_problem.reason, degraded_problem.message, generation
        )
    else:
        degraded = condition("Degraded", False, "AsExpected", "", generation)
    conditions = [ready_condition, progressing, degraded]
    model = model_readiness(plan.pool, plan.problem, pods)
    if model is not None:
        conditions.append(condition("ModelReady", *model, generation))
    result: dict[str, Any] = {
        "replicas": replicas,
        "readyReplicas": ready,
        "endpoints": endpoints,
        "conditions": conditions,
        "selector": pod_selector(plan.name),
    }
    if generation is not None:
        result["observedGeneration"] = generation
    return {**result, **image_status(plan)}


def pod_selector(pool: str) -> str:
    """The label selector of the pool's engine pods, as a string (the scale subresource's
    labelSelectorPath points at it)."""
    return ",".join(f"{key}={value}" for key, value in contract.selector_labels(pool).items())


def image_status(plan: DesiredPool) -> dict[str, Any]:
    """The engine image the pool's rendered pods run, and the digest of the pod shape it
    was chosen for (`render.engine_image` keeps it while that stays); nothing when none was
    rendered or the pool sets engine.image itself."""
    if plan.pool is None or plan.pool.spec.engine.image:
        return {}
    for obj in plan.objects:
        image = _engine_container_image(obj)
        if image is not None:
            return {"engineImage": image, "engineImageSpec": pod_shape(plan.pool)}
    return {}


def _engine_container_image(node: Any) -> str | None:
    """The image of the first container named `engine` anywhere in a rendered object."""
    if isinstance(node, Mapping):
        if node.get("name") == "engine" and isinstance(node.get("image"), str):
            return str(node["image"])
        for value in node.values():
            found = _engine_container_image(value)
            if found is not None:
                return found
    elif isinstance(node, list):
        for item in node:
            found = _engine_container_image(item)
            if found is not None:
                return found
    return None


def tenant_status(plan: TenantPlan) -> dict[str, Any]:
    """What the tenant's status should say (conditions without transition times)."""
    generation = _generation(plan.body)
    if plan.problem is not None:
        ready = condition("Ready", False, plan.problem.reason, plan.problem.message, generation)
    else:
        message = plan.note or "in the gateway's tenant table"
        ready = condition("Ready", True, "InGatewayTable", message, generation)
    conditions = [ready]
    if plan.secret_problem is not None:
        problem = plan.secret_problem
        conditions.append(
            condition("SecretMissing", True, problem.reason, problem.message, generation)
        )
    elif plan.quota is not None and plan.quota.spec.api_key_secret_ref is not None:
        name = plan.quota.spec.api_key_secret_ref.name
        conditions.append(
            condition("SecretMissing", False, "SecretFound", f"Secret {name!r}", generation)
        )
    result: dict[str, Any] = {"conditions": conditions}
    if generation is not None:
        result["observedGeneration"] = generation
    return result


def group_status(plan: GroupPlan) -> dict[str, Any]:
    """What the group's status should say (conditions without transition times); the
    served numbers are `Reconciler.record_served`'s."""
    generation = _generation(plan.body)
    if plan.problem is not None:
        ready = condition("Ready", False, plan.problem.reason, plan.problem.message, generation)
    else:
        parent = plan.group.spec.parent if plan.group is not None else None
        where = f"under TenantGroup {parent}" if parent else "directly under the bands"
        ready = condition("Ready", True, "InTree", where, generation)
    result: dict[str, Any] = {
        "conditions": [ready],
        "members": {"groups": plan.groups, "tenants": plan.tenants},
    }
    if generation is not None:
        result["observedGeneration"] = generation
    return result


def carried_problem(current: Mapping[str, Any] | None) -> Problem | None:
    """A Degraded condition of a kind only the full reconcile sets, from the current status."""
    for item in (current or {}).get("conditions", []) or []:
        degraded = item.get("type") == "Degraded" and item.get("status") == "True"
        if degraded and item.get("reason") in PLAN_REASONS:
            return Problem(str(item["reason"]), str(item.get("message", "")))
    return None


def status_patch(
    current: Mapping[str, Any] | None, desired: Mapping[str, Any], now: str
) -> dict[str, Any] | None:
    """The merge patch of `.status` that makes `current` say `desired`, or None if it does.

    A condition keeps its lastTransitionTime while its status stays the same; fields of the
    status that `desired` does not mention (kopf's, the served tokens) are left alone.
    """
    current = current or {}
    wanted = dict(desired)
    if "conditions" in wanted:
        wanted["conditions"] = merge_conditions(
            current.get("conditions") or [], wanted["conditions"], now
        )
    changed = {key: value for key, value in wanted.items() if current.get(key) != value}
    return changed or None


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], conditions: Sequence[Mapping[str, Any]], now: str
) -> list[dict[str, Any]]:
    """`conditions` with transition times: the previous one's while the status is unchanged."""
    before = {item.get("type"): item for item in previous}
    merged = []
    for item in conditions:
        old = before.get(item["type"])
        same = old is not None and old.get("status") == item["status"]
        stamp = old.get("lastTransitionTime") if same and old is not None else None
        merged.append({**item, "lastTransitionTime": stamp or now})
    return merged


def _failure(
    deployment: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> Problem | None:
    """Why the replicas fail, if they do: the Deployment's own verdict, or a pod that cannot
    start (crash loop, image that cannot be pulled)."""
    for item in (deployment or {}).get("status", {}).get("conditions", []) or []:
        kind, status, reason = item.get("type"), item.get("status"), item.get("reason", "")
        if kind == "ReplicaFailure" and status == "True":
            return Problem("ReplicaFailure", str(item.get("message", reason)))
        if kind == "Progressing" and status == "False" and reason == "ProgressDeadlineExceeded":
            return Problem("ProgressDeadlineExceeded", str(item.get("message", reason)))
    for pod in sorted(pods, key=_name):
        for state in pod.get("status", {}).get("containerStatuses", []) or []:
            waiting = (state.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in FAILING_WAITS:
                message = f"pod {_name(pod)}: {waiting['reason']}: {waiting.get('message', '')}"
                return Problem(str(waiting["reason"]), message.rstrip(": "))
    return None


def _endpoint(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    address = pod.get("status", {}).get("podIP")
    if not address:
        return None
    host = (
        f"[{address}]"
        if isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address)
        else address
    )
    ready = any(
        item.get("type") == "Ready" and item.get("status") == "True"
        for item in pod.get("status", {}).get("conditions", []) or []
    )
    return {"pod": _name(pod), "address": f"http://{host}:{contract.ENGINE_PORT}", "ready": ready}


def _is_served(pod: Mapping[str, Any]) -> bool:
    metadata, status = pod.get("metadata", {}), pod.get("status", {})
    return not metadata.get("deletionTimestamp") and status.get("phase") not in (
        "Succeeded",
        "Failed",
    )


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _generation(body: Mapping[str, Any]) -> int | None:
    generation = body.get("metadata", {}).get("generation")
    return int(generation) if generation is not None else None
