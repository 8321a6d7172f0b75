"""What a namespace should hold, from its pools, tenants, tenant groups and key Secrets: a
pure function.

`plan_namespace` validates every InferencePool, TenantQuota and TenantGroup (as the API holds
them: the CRD schema cannot say "exactly one of path, pvc, hub" or "vllm needs
model.source"), settles duplicates (the older object keeps a model name, a tenant id or an
API key), reads each tenant's keys (from Secrets labelled `fairpool.io/api-keys: "true"`
only), builds the fair order's tree of groups, and renders every pool's objects and the
gateway's Secret. Whatever is wrong becomes a `Problem` naming the field, for the object's
status; nothing raises. The operator applies the plan; `fairpool render` prints it.

The tree is always one: a group whose parent does not exist (or is invalid), or that is in
a cycle, is not Ready and is placed directly under its band until that is mended; a tenant
whose group does not exist (or is invalid) stays Ready, directly under its band, with a
note saying so — as a tenant naming a pool that does not exist yet.

An invalid pool loses nothing it had: its objects are not rendered (so the ones running stay
as they are) and its entry in the gateway's configuration, if it had one, is kept. A pool
or tenant being deleted (deletionTimestamp set) is planned as gone.

A pool with `spec.placement` is planned into chains (`fairpool.api.pool_plan`, from the
cluster's Nodes when it discovers them) and rendered chain by chain (`render_chains`); its
gateway entry lists the chains. A placement that cannot be planned (the nodes cannot hold
the model, say) is a problem like an invalid spec: what runs stays.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairpool.api.common import API_VERSION
from fairpool.api.gateway_config import (
    ChainWorker,
    GatewayConfig,
    GatewayPool,
    GatewayTenant,
    KubernetesWorkersSpec,
    WorkerSource,
    api_keys,
    gateway_pool,
    gateway_tenant,
)
from fairpool.api.inference_pool import InferencePool
from fairpool.api.manifests import Manifests, Secret
from fairpool.api.placement import NodeGroupSpec
from fairpool.api.pool_plan import node_groups, pool_plan, spec_field
from fairpool.api.shares import GroupShare
from fairpool.api.status import InferencePoolStatus
from fairpool.api.tenant_group import TenantGroup, fair_order, group_problems
from fairpool.api.tenant_quota import TenantQuota
from fairpool.api.validation import validate
from fairpool.placement.planner import PoolPlan as ChainPlan
from fairpool.sched.errors import ConfigError
from fairpool_operator import contract
from fairpool_operator.config import OperatorConfig
from fairpool_operator.render import Manifest, gateway_secret, pool_objects, scheduler_configmap
from fairpool_operator.render_chains import chain_objects, chain_url

#: Service names are DNS-1035 labels: a letter first, at most 63 characters with "-engine".
POOL_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,54}[a-z0-9])?$")


@dataclass(frozen=True)
class Problem:
    """Why an object is not (fully) in effect; `message` starts with the field."""

    reason: str
    message: str


@dataclass
class DesiredPool:
    """One InferencePool as the operator wants it: the objects to create for it, why it is
    not (fully) in effect, and its chain plan (`fairpool.placement.PoolPlan`) when it has
    spec.placement."""

    name: str
    body: Mapping[str, Any]
    pool: InferencePool | None  # None: invalid, nothing rendered
    objects: list[Manifest] = field(default_factory=list)
    problem: Problem | None = None
    chains: ChainPlan | None = None  # a placement pool's plan, as rendered


@dataclass
class TenantPlan:
    name: str
    body: Mapping[str, Any]
    quota: TenantQuota | None  # None: invalid
    problem: Problem | None = None  # the tenant is not Ready
    secret_problem: Problem | None = None  # the SecretMissing condition
    note: str = ""  # a remark for the Ready condition's message
    in_gateway: bool = False


@dataclass
class GroupPlan:
    """One TenantGroup: whether it is in the tree as it says, and what is under it."""

    name: str
    body: Mapping[str, Any]
    group: TenantGroup | None  # None: invalid
    problem: Problem | None = None  # the group is not Ready
    groups: list[str] = field(default_factory=list)  # the groups directly under it
    tenants: list[str] = field(default_factory=list)  # the tenants directly under it


@dataclass
class NamespacePlan:
    pools: list[DesiredPool]
    tenants: list[TenantPlan]
    gateway: GatewayConfig
    gateway_secret: Manifest
    groups: list[GroupPlan] = field(default_factory=list)

    @property
    def objects(self) -> list[Manifest]:
        """Every object to create or update, in order: each pool's, then the gateway's."""
        return [obj for pool in self.pools for obj in pool.objects] + [self.gateway_secret]


def plan_namespace(
    pools: Iterable[Mapping[str, Any]],
    quotas: Iterable[Mapping[str, Any]],
    secrets: Mapping[str, Mapping[str, Any]],
    config: OperatorConfig,
    previous_gateway: GatewayConfig | None = None,
    nodes: Sequence[Mapping[str, Any]] | None = None,
    groups: Iterable[Mapping[str, Any]] = (),
) -> NamespacePlan:
    """The plan for a namespace. `secrets` holds (at least) the Secrets the tenants name;
    `previous_gateway` is the configuration last written, whose entries of pools that are
    invalid now are kept; `nodes` are the cluster's Nodes, for placement pools that
    discover theirs (None: not read); `groups` are the TenantGroups."""
    pools_planned = pool_plans(body for body in pools if not _deleting(body))
    tenant_plans = _tenant_plans(body for body in quotas if not _deleting(body))
    planned_groups, tree = group_plans(body for body in groups if not _deleting(body))
    _place_tenants(tenant_plans, planned_groups, tree)
    accepted = [plan.quota for plan in tenant_plans if plan.quota is not None and not plan.problem]
    for plan in pools_planned:
        if plan.pool is None:
            continue
        if plan.pool.spec.placement is None:
            plan.objects = pool_objects(plan.pool, accepted, config, tree)
        else:
            _plan_chains(plan, accepted, config, nodes, tree)

    valid = [plan for plan in pools_planned if plan.pool is not None]
    entries = [_gateway_entry(plan, config) for plan in valid]
    entries += _kept_entries(pools_planned, entries, previous_gateway)
    entries.sort(key=lambda entry: entry.name)
    known = {entry.name for entry in entries}
    candidates = []
    for tenant in tenant_plans:
        if tenant.quota is None or tenant.problem is not None:
            continue
        keys = _keys(tenant, secrets, config.namespace)
        if keys is None:
            continue
        wanted = tenant.quota.spec.pools
        allowed = [name for name in wanted if name in known]
        missing = [name for name in wanted if name not in known]
        if wanted and not allowed:
            tenant.problem = Problem(
                "PoolNotFound", f"spec.pools: no InferencePool named {', '.join(missing)} exists"
            )
            continue
        if missing:
            note = f"spec.pools: {', '.join(missing)} not found (ignored until created)"
            tenant.note = "; ".join(part for part in (tenant.note, note) if part)
        candidates.append((tenant, gateway_tenant(tenant.quota, keys, allowed)))
    _refuse_shared_keys(candidates)
    tenants = []
    for tenant, entry in candidates:
        if tenant.problem is None:
            tenants.append(entry)
            tenant.in_gateway = True
    document: dict[str, object] = {
        "listen": contract.GATEWAY_LISTEN,
        "admin": contract.GATEWAY_ADMIN,
        "pools": entries,
        "tenants": tenants,
    }
    used = fair_order([tenant.place() for tenant in tenants], tree).groups
    if used:
        document["groups"] = used
    shared_state = config.shared_state()
    if shared_state is not None:
        document["sharedState"] = shared_state
    gateway = validate(GatewayConfig, document, "gateway configuration")
    secret = gateway_secret(gateway, config.namespace, config.gateway_secret)
    return NamespacePlan(pools_planned, tenant_plans, gateway, secret, planned_groups)


def needs_nodes(pools: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a pool discovers its nodes (so the Nodes are worth listing)."""
    return any(
        ((body.get("spec") or {}).get("placement") or {}).get("discovery") is not None
        for body in pools
    )


def secret_names(quotas: Iterable[Mapping[str, Any]]) -> set[str]:
    """The Secrets the (valid) TenantQuotas name: what the operator reads before planning."""
    names = set()
    for body in quotas:
        quota = _parse(TenantQuota, "TenantQuota", body)
        if isinstance(quota, TenantQuota) and quota.spec.api_key_secret_ref is not None:
            names.add(quota.spec.api_key_secret_ref.name)
    return names


def pool_plans(bodies: Iterable[Mapping[str, Any]]) -> list[DesiredPool]:
    """Each pool validated, by name; of pools serving the same model the oldest wins."""
    plans = []
    models: dict[str, str] = {}
    for body in sorted(bodies, key=_age):
        name = str(body.get("metadata", {}).get("name", ""))
        parsed = _parse(InferencePool, "InferencePool", body)
        if isinstance(parsed, Problem):
            plans.append(DesiredPool(name, body, None, problem=parsed))
        elif not POOL_NAME.match(name):
            message = "metadata.name: must start with a letter and have at most 56 characters"
            plans.append(DesiredPool(name, body, None, problem=Problem("InvalidSpec", message)))
        elif (local := _local_source(parsed)) is not None:
            plans.append(DesiredPool(name, body, None, problem=Problem("InvalidSpec", local)))
        elif parsed.spec.model.name in models:
            owner = models[parsed.spec.model.name]
            message = (
                f"spec.model.name: model {parsed.spec.model.name!r} is already served by "
                f"InferencePool {owner}"
            )
            plans.append(DesiredPool(name, body, None, problem=Problem("DuplicateModel", message)))
        else:
            models[parsed.spec.model.name] = name
            plans.append(DesiredPool(name, body, with_pinned_image(parsed, body)))
    return sorted(plans, key=lambda plan: plan.name)


def with_pinned_image(pool: InferencePool, body: Mapping[str, Any]) -> InferencePool:
    """The pool with the engine image its status records (`render.engine_image`); the rest
    of the status, the operator's own writing, is not read back."""
    status = body.get("status") or {}
    image, shape = status.get("engineImage"), status.get("engineImageSpec")
    if not (isinstance(image, str) and image and isinstance(shape, str)):
        return pool
    pinned = InferencePoolStatus(engineImage=image, engineImageSpec=shape)
    return pool.model_copy(update={"status": pinned})


def _local_source(pool: InferencePool) -> str | None:
    """Why a vLLM pool's source cannot be loaded in a cluster: a path on one machine."""
    uri = pool.spec.model.uri
    if pool.spec.engine.kind != "vllm" or uri is None or uri.scheme != "file":
        return None
    return (
        f"spec.model.source: {uri} is a path on one machine (for fairpool up); in a cluster "
        "put the weights in a PersistentVolumeClaim (pvc://claim/path) or fetch them "
        "(hf://, s3://, gs://)"
    )


def _tenant_plans(bodies: Iterable[Mapping[str, Any]]) -> list[TenantPlan]:
    plans = []
    tenants: dict[str, str] = {}
    for body in sorted(bodies, key=_age):
        name = str(body.get("metadata", {}).get("name", ""))
        parsed = _parse(TenantQuota, "TenantQuota", body)
        if isinstance(parsed, Problem):
            plans.append(TenantPlan(name, body, None, problem=parsed))
        elif parsed.tenant in tenants:
            owner = tenants[parsed.tenant]
            message = f"spec.tenant: tenant {parsed.tenant!r} is defined by TenantQuota {owner}"
            plans.append(
                TenantPlan(name, body, parsed, problem=Problem("DuplicateTenant", message))
            )
        else:
            tenants[parsed.tenant] = name
            plans.append(TenantPlan(name, body, parsed))
    return sorted(plans, key=lambda plan: plan.name)


def group_plans(
    bodies: Iterable[Mapping[str, Any]],
) -> tuple[list[GroupPlan], dict[str, GroupShare]]:
    """Each TenantGroup validated, and the tree of the valid ones: a group whose parent is
    missing or invalid, or that is in a cycle, has a problem and is placed at the top."""
    plans = []
    for body in bodies:
        name = str(body.get("metadata", {}).get("name", ""))
        parsed = _parse(TenantGroup, "TenantGroup", body)
        if isinstance(parsed, Problem):
            plans.append(GroupPlan(name, body, None, problem=parsed))
        else:
            plans.append(GroupPlan(name, body, parsed))
    plans.sort(key=lambda plan: plan.name)
    invalid = {plan.name for plan in plans if plan.group is None}
    tree = {plan.name: plan.group.share() for plan in plans if plan.group is not None}
    problems = group_problems(tree, "TenantGroup named")
    for plan in plans:
        if plan.name not in problems:
            continue
        reason, problem = problems[plan.name]
        parent = tree[plan.name].parent
        if parent in invalid:
            problem = f"TenantGroup {parent!r} is invalid (its status says why)"
        plan.problem = Problem(
            reason, f"spec.parent: {problem}; the group is directly under its band meanwhile"
        )
        tree[plan.name] = tree[plan.name].model_copy(update={"parent": None})
    for plan in plans:
        plan.groups = sorted(name for name, group in tree.items() if group.parent == plan.name)
    return plans, tree


def _place_tenants(
    tenants: list[TenantPlan], groups: list[GroupPlan], tree: Mapping[str, GroupShare]
) -> None:
    """Each valid tenant in its group; one whose group is missing or invalid directly under
    its band, with a note (its TenantQuota keeps spec.group: it joins once the group is
    there). Each group lists the tenants it has."""
    invalid = {plan.name for plan in groups if plan.group is None}
    members: dict[str, list[str]] = {}
    for plan in tenants:
        if plan.quota is None or plan.problem is not None:
            continue
        group = plan.quota.spec.group
        if group is None:
            continue
        if group in tree:
            members.setdefault(group, []).append(plan.quota.tenant)
            continue
        why = "is invalid" if group in invalid else "not found"
        why = f"TenantGroup {group!r} {why}"
        plan.note = f"spec.group: {why}; the tenant is directly under its band meanwhile"
        spec = plan.quota.spec.model_copy(update={"group": None})
        plan.quota = plan.quota.model_copy(update={"spec": spec})
    for group_plan in groups:
        group_plan.tenants = sorted(members.get(group_plan.name, []))


def _keys(
    plan: TenantPlan, secrets: Mapping[str, Mapping[str, Any]], namespace: str
) -> list[str] | None:
    """The tenant's API keys; None, with the plan's problems set, when it has none."""
    assert plan.quota is not None
    reference = plan.quota.spec.api_key_secret_ref
    where = "spec.apiKeySecretRef"
    if reference is None:
        plan.problem = Problem("NoApiKeys", f"{where}: not set; no API key reaches this tenant")
        return None
    body = secrets.get(reference.name)
    label = f'{contract.API_KEYS_LABEL}: "true"'
    if body is None:
        reason = "SecretNotFound"
        message = (
            f"{where}: Secret {reference.name!r} not found in namespace {namespace} among the "
            f"Secrets labelled {label} (the operator reads API keys only from those)"
        )
    elif not _key_secret(body):
        reason = "SecretNotLabelled"
        message = (
            f"{where}: Secret {reference.name!r} lacks the label {label}; the operator reads "
            "API keys only from Secrets so labelled"
        )
    else:
        reason = "SecretInvalid"
        try:
            secret = validate(Secret, {"apiVersion": "v1", "kind": "Secret", **body}, "Secret")
            values = secret.values()
            if reference.key is not None and reference.key not in values:
                reason = "KeyNotFound"
                message = f"{where}: Secret {reference.name!r} has no key {reference.key!r}"
            else:
                reason = "NoKeys"
                return api_keys(Manifests(secrets={reference.name: secret}), reference, where)
        except ConfigError as error:
            message = str(error)
    plan.secret_problem = Problem(reason, message)
    plan.problem = plan.secret_problem
    return None


def _key_secret(body: Mapping[str, Any]) -> bool:
    """Whether a Secret is labelled as holding API keys (the only ones read for keys)."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in contract.API_KEYS_LABELS.items())


def _refuse_shared_keys(candidates: list[tuple[TenantPlan, GatewayTenant]]) -> None:
    """A key must name one tenant: of TenantQuotas sharing a key (one Secret, or the same
    key in two), the older keeps it and the others get a problem naming it (the gateway
    would refuse a configuration giving one key to two tenants)."""
    owners: dict[str, TenantPlan] = {}
    for tenant, entry in sorted(candidates, key=lambda candidate: _age(candidate[0].body)):
        shared = [owners[digest] for digest in entry.api_key_sha256 if digest in owners]
        if shared:
            assert tenant.quota is not None and tenant.quota.spec.api_key_secret_ref is not None
            secret = tenant.quota.spec.api_key_secret_ref.name
            tenant.problem = Problem(
                "DuplicateKey",
                f"spec.apiKeySecretRef: a key in Secret {secret!r} is already the key of "
                f"TenantQuota {shared[0].name}; a key must name one tenant",
            )
            continue
        owners.update(dict.fromkeys(entry.api_key_sha256, tenant))


def _kept_entries(
    plans: list[DesiredPool], entries: list[GatewayPool], previous: GatewayConfig | None
) -> list[GatewayPool]:
    """Gateway entries of pools that are invalid now, as last written, while they collide with
    no valid pool: a bad edit does not take a serving pool off the gateway."""
    if previous is None:
        return []
    invalid = {plan.name for plan in plans if plan.pool is None}
    names = {entry.name for entry in entries}
    models = {entry.model for entry in entries}
    return [
        entry
        for entry in previous.pools
        if entry.name in invalid and entry.name not in names and entry.model not in models
    ]


def _plan_chains(
    plan: DesiredPool,
    quotas: list[TenantQuota],
    config: OperatorConfig,
    nodes: Sequence[Mapping[str, Any]] | None,
    tree: Mapping[str, GroupShare],
) -> None:
    """A placement pool's chains and objects; an infeasible placement is a problem (and,
    as for an invalid spec, nothing is rendered: what runs stays)."""
    assert plan.pool is not None
    pool = plan.pool
    try:
        groups: list[NodeGroupSpec] = node_groups(pool, nodes).groups
        chains = pool_plan(pool, nodes)
        objects = chain_objects(pool, chains, groups, config)
    except ConfigError as error:
        message = f"{spec_field(error.parameter, pool)}: {error.problem}"
        plan.pool, plan.problem = None, Problem("PlacementInfeasible", message)
        return
    plan.chains = chains
    plan.objects = [scheduler_configmap(pool, quotas, config.namespace, tree), *objects]


def _gateway_entry(plan: DesiredPool, config: OperatorConfig) -> GatewayPool:
    """A pool's workers: its headless Service's endpoints, or its chains' Services."""
    assert plan.pool is not None
    if plan.chains is None:
        return gateway_pool(plan.pool, _workers(plan.pool, config))
    chains = [
        ChainWorker(
            name=chain.name,
            url=chain_url(plan.pool, chain.name, config.namespace),
            capacity=chain.capacity,
            serviceRate=chain.service_rate,
        )
        for chain in plan.chains.chains
        if chain.capacity >= 1
    ]
    return gateway_pool(plan.pool, [], chains=chains)


def _workers(pool: InferencePool, config: OperatorConfig) -> WorkerSource:
    service = contract.engine_name(pool.name)
    source = KubernetesWorkersSpec(namespace=config.namespace, service=service, portName="http")
    return WorkerSource(kubernetes=source)


def _parse(
    model: type[InferencePool] | type[TenantQuota] | type[TenantGroup],
    kind: str,
    body: Mapping[str, Any],
) -> Any:
    """The object, or a Problem naming the field (list items may lack apiVersion and kind)."""
    document = {"apiVersion": API_VERSION, "kind": kind, **body}
    document.pop("status", None)  # the operator's own writing, not the user's input
    try:
        return validate(model, document, kind)
    except ConfigError as error:
        field_name = error.parameter.removeprefix(f"{kind}: ")
        return Problem("InvalidSpec", f"{field_name}: {error.problem}")


def _deleting(body: Mapping[str, Any]) -> bool:
    """Being deleted (a finalizer still holds it): gone, as far as the plan goes, so that the
    objects the garbage collector removes are not made again."""
    return bool(body.get("metadata", {}).get("deletionTimestamp"))


def _age(body: Mapping[str, Any]) -> tuple[str, str]:
    metadata = body.get("metadata", {})
    return (str(metadata.get("creationTimestamp") or ""), str(metadata.get("name") or ""))
