"""Bringing a namespace to its plan through the `Api` interface, writing only what differs.

A reconcile reads the pools, tenants, tenant groups and the key Secrets the tenants name
(only Secrets labelled `fairpool.io/api-keys: "true"`, listed by that label), plans
(`plan.plan_namespace`),
and for every planned object creates it if it is missing, applies it if it differs from what
the API holds, and leaves it alone otherwise; then it writes the statuses that changed. So a
reconcile with nothing changed writes nothing, and a tenant's weight change rewrites exactly
the scheduler ConfigMaps of the pools the tenant may use and the gateway's Secret.

An object is up to date when it carries the digest of the current rendering
(`fairpool.io/rendered-hash`: a field removed from the rendering changes it) and still holds
every rendered field (someone's `kubectl edit` does not). Fields the API server adds
(defaults, status) and fields others own are not the operator's business.

Nothing here knows kopf: the handlers call in, tests call with a fake `Api`.
"""

from __future__ import annotations

import base64
import datetime
import logging
import string
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from secrets import choice as random_choice
from typing import Any

import yaml

from fairpool.api.gateway_config import GatewayConfig
from fairpool_operator import contract, events
from fairpool_operator.api import (
    BUDGET,
    DEPLOYMENT,
    LEADERWORKERSET,
    POD,
    POOL,
    SECRET,
    SERVICE,
    STATEFULSET,
    TENANT,
    TENANT_GROUP,
    Api,
    ApiError,
    Kind,
    kind_of,
)
from fairpool_operator.cache import fresh_get
from fairpool_operator.config import OperatorConfig
from fairpool_operator.model_status import credentials_problem
from fairpool_operator.plan import (
    DesiredPool,
    NamespacePlan,
    Problem,
    TenantPlan,
    group_plans,
    needs_nodes,
    plan_namespace,
    pool_plans,
    secret_names,
)
from fairpool_operator.render import Manifest
from fairpool_operator.served import Served, group_pools
from fairpool_operator.status import (
    carried_problem,
    group_status,
    pool_status,
    status_patch,
    tenant_status,
)
from fairpool_operator.status_chains import chains_pool_status

log = logging.getLogger("fairpool.operator")


@dataclass(frozen=True)
class Write:
    """One request that changed something: create, apply or status."""

    verb: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.verb} {self.kind}/{self.name}"


class Conflict(Exception):
    """An object of the planned name exists and someone else manages it."""


ALPHANUMERIC = string.ascii_letters + string.digits

#: Seconds before an object the API server refused is tried again: doubling from the
#: first to the last, per object.
RETRY_FIRST, RETRY_LAST = 10.0, 300.0


@dataclass(frozen=True)
class Refusal:
    """An object of a pool the API server refused, and when to try it again."""

    pool: str
    problem: Problem
    attempts: int
    retry_at: float
    digest: str  # of the rendering refused: a changed one is tried at once


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    """Reconciles one namespace; every method returns the writes it made."""

    def __init__(
        self,
        api: Api,
        config: OperatorConfig,
        clock: Callable[[], str] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.config = config
        self.clock = clock
        self.monotonic = monotonic
        #: The Secrets the tenants named at the last reconcile (whose changes matter).
        self.referenced_secrets: frozenset[str] = frozenset()
        #: Whether a pool discovers its nodes (so that a change of the Nodes matters).
        self.uses_nodes = False
        #: Objects the API server refused, by (kind, name): each pool's failure stays its
        #: own (a condition on it) while the others, and the gateway's Secret, go on.
        self.refusals: dict[tuple[str, str], Refusal] = {}

    def retry_in(self) -> float | None:
        """Seconds until the next refused object is due again; None when none is."""
        if not self.refusals:
            return None
        due = min(refusal.retry_at for refusal in self.refusals.values())
        return max(0.0, due - self.monotonic())

    def reconcile(self) -> list[Write]:
        """Everything: every pool's objects and status, the gateway's Secret, every tenant's
        status."""
        pools = self.api.list(POOL)
        quotas = self.api.list(TENANT)
        groups = self._groups()
        names = secret_names(quotas)
        self.referenced_secrets = frozenset(names)
        secrets = {}  # only key Secrets (labelled so) are read; others, never
        for body in self.api.list(SECRET, contract.API_KEYS_LABELS):
            name = str(body.get("metadata", {}).get("name"))
            if name in names:
                secrets[name] = body
        current_gateway = self.api.get(SECRET, self.config.gateway_secret)
        self.uses_nodes = needs_nodes(pools)
        nodes = self._nodes() if self.uses_nodes else None
        plan = plan_namespace(
            pools, quotas, secrets, self.config, gateway_of(current_gateway), nodes, groups
        )

        writes: list[Write] = []
        self._generate_missing_secrets(writes)
        planned = {(obj["kind"], obj["metadata"]["name"]) for obj in plan.objects}
        for key in [key for key in self.refusals if key not in planned]:
            del self.refusals[key]  # no longer wanted: nothing to retry
        failed: list[ApiError] = []
        for pool in plan.pools:
            pool.problem = pool.problem or self._credentials_problem(pool)
            try:
                self._reconcile_pool(pool, writes)
            except ApiError as error:  # reading its state, or writing its status
                log.warning("InferencePool %s: %s", pool.name, error)
                failed.append(error)
        self._prune(plan, writes)
        self._apply_to(plan.gateway_secret, current_gateway, writes, adopt=True)
        for tenant in plan.tenants:
            self._tell_tenant_table(tenant)
            self._write_status(TENANT, tenant.name, tenant.body, tenant_status(tenant), writes)
        for group in plan.groups:
            self._write_status(TENANT_GROUP, group.name, group.body, group_status(group), writes)
        if failed:  # the rest is done; the caller retries for these (kopf: after a delay)
            raise failed[0]
        return writes

    def refresh_pool_status(self, name: str) -> list[Write]:
        """The status of one pool, from its Deployment and pods (after their changes)."""
        body = self.api.get(POOL, name)
        if body is None:
            return []
        (plan,) = pool_plans([body])
        problem = (
            plan.problem
            or carried_problem(body.get("status"))
            or self._refused(name)
            or self._credentials_problem(plan)
        )
        writes: list[Write] = []
        if _has_placement(body):
            pods = self.api.list(POD, {contract.POOL_LABEL: name})
            status = chains_pool_status(
                replace(plan, problem=problem), self._chain_workloads(name), pods
            )
            self._write_status(POOL, name, body, status, writes)
            return writes
        deployment = self.api.get(DEPLOYMENT, contract.engine_name(name))
        if deployment is not None and not managed(deployment):
            deployment = None
        pods = self.api.list(POD, {contract.POOL_LABEL: name})
        desired = pool_status(replace(plan, problem=problem), deployment, pods)
        self._write_status(POOL, name, body, desired, writes)
        return writes

    def record_served(self, served: Mapping[str, Served]) -> list[Write]:
        """The gateway's served tokens and service on the tenants it reported, and each
        group's share of every pool (`served.group_pools`), where they changed."""
        writes: list[Write] = []
        tenant_groups: dict[str, str] = {}
        for body in self.api.list(TENANT):
            metadata = body.get("metadata", {})
            spec = body.get("spec") or {}
            tenant = str(spec.get("tenant") or metadata.get("name"))
            if spec.get("group"):
                tenant_groups[tenant] = str(spec["group"])
            numbers = served.get(tenant)
            if numbers is None:
                continue
            desired: dict[str, Any] = {
                "servedTokens": numbers.tokens,
                "servedService": numbers.service,
            }
            current = body.get("status") or {}
            if all(current.get(key) == value for key, value in desired.items()):
                continue
            desired["lastReported"] = self.clock()
            self._patch_status(TENANT, str(metadata.get("name")), desired, writes)
        bodies = self._groups()
        _, tree = group_plans(bodies)
        parents = {name: group.parent for name, group in tree.items()}
        shares = group_pools(served, tenant_groups, parents)
        for body in bodies:
            name = str(body.get("metadata", {}).get("name"))
            pools = shares.get(name)
            if pools is None or (body.get("status") or {}).get("pools") == pools:
                continue
            self._patch_status(
                TENANT_GROUP, name, {"pools": pools, "lastReported": self.clock()}, writes
            )
        return writes

    # ------------------------------------------------------------------ internals

    def _groups(self) -> list[dict[str, Any]]:
        """The TenantGroups; none while the API server does not serve them (their CRD not
        applied yet after an upgrade: the rest goes on as before groups existed)."""
        try:
            return self.api.list(TENANT_GROUP)
        except ApiError as error:
            if error.status != 404:
                raise
            log.warning("TenantGroups are not served (%s): apply the chart's CRDs", error)
            return []

    def _event(
        self, about: Mapping[str, Any], kind: str, reason: str, message: str, warning: bool = False
    ) -> None:
        events.post(self.api, events.event(about, kind, reason, message, self.clock(), warning))

    def _tell_tenant_table(self, tenant: TenantPlan) -> None:
        """An Event when the tenant enters or leaves the gateway's tenant table."""
        conditions = (tenant.body.get("status") or {}).get("conditions") or []
        was = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if tenant.in_gateway and not was:
            message = "Added to the gateway's tenant table: its keys are accepted"
            self._event(tenant.body, "TenantQuota", "InGatewayTable", message)
        elif was and not tenant.in_gateway:
            why = tenant.problem.message if tenant.problem else "not in the gateway's table"
            message = f"Removed from the gateway's tenant table: {why}"
            self._event(tenant.body, "TenantQuota", "RemovedFromGatewayTable", message, True)

    def _generate_missing_secrets(self, writes: list[Write]) -> None:
        """Makes each of the configuration's generated Secrets that does not exist (never
        touching one that does: a rotated token stays as written)."""
        for wanted in self.config.generated_secrets:
            if self.api.get(SECRET, wanted.name) is not None:
                continue
            value = "".join(random_choice(ALPHANUMERIC) for _ in range(wanted.length))
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {
                    "name": wanted.name,
                    "labels": {contract.MANAGED_BY_LABEL: contract.MANAGED_BY},
                },
                "stringData": {wanted.key: value},
            }
            try:
                self.api.create(body)
            except ApiError as error:
                if error.status != 409:  # made meanwhile (another operator pod): fine
                    raise
                continue
            writes.append(Write("create", "Secret", wanted.name))
            log.info("created Secret %s (a random %s)", wanted.name, wanted.key)

    def _credentials_problem(self, plan: DesiredPool) -> Problem | None:
        """What is wrong with the Secret the pool's model source names (read by name)."""
        if plan.pool is None or plan.pool.spec.model.secret_ref is None:
            return None
        secret = self.api.get(SECRET, plan.pool.spec.model.secret_ref.name)
        return credentials_problem(plan.pool, secret)

    def _refused(self, pool: str) -> Problem | None:
        """Why an object of `pool` is not as planned: the API server refused it."""
        for _, refusal in sorted(self.refusals.items()):
            if refusal.pool == pool:
                return refusal.problem
        return None

    def _apply_for(self, pool: str, obj: Manifest, writes: list[Write]) -> dict[str, Any] | None:
        """`obj` applied; None when the API server refuses it (then it is retried after a
        delay that doubles per refusal, and its pool says why)."""
        key = (str(obj["kind"]), str(obj["metadata"]["name"]))
        digest = str(obj["metadata"].get("annotations", {}).get(contract.HASH_ANNOTATION, ""))
        earlier = self.refusals.get(key)
        waiting = earlier is not None and self.monotonic() < earlier.retry_at
        if earlier is not None and waiting and earlier.digest == digest:
            return None
        try:
            result = self._apply(obj, writes)
        except ApiError as error:
            attempts = earlier.attempts + 1 if earlier is not None else 1
            delay = min(RETRY_FIRST * 2 ** (attempts - 1), RETRY_LAST)
            message = f"{key[0]} {key[1]}: the API server refused it ({error})"
            problem = Problem("ApplyFailed", message)
            retry_at = self.monotonic() + delay
            self.refusals[key] = Refusal(pool, problem, attempts, retry_at, digest)
            log.warning("InferencePool %s: %s; again in %.0f s", pool, message, delay)
            if attempts == 1:
                about = {"metadata": {"name": pool, "namespace": self.config.namespace}}
                self._event(about, "InferencePool", "ApplyFailed", message, warning=True)
            return None
        self.refusals.pop(key, None)
        return result

    def _reconcile_pool(self, plan: DesiredPool, writes: list[Write]) -> None:
        start = len(writes)
        try:
            self._reconcile_pool_objects(plan, writes)
        finally:
            for write in writes[start:]:
                if write.verb in events.VERBS:
                    message = f"{events.VERBS[write.verb]} {write.kind} {write.name}"
                    self._event(plan.body, "InferencePool", events.VERBS[write.verb], message)

    def _reconcile_pool_objects(self, plan: DesiredPool, writes: list[Write]) -> None:
        deployment: dict[str, Any] | None = None
        workloads: list[dict[str, Any]] = []
        problem = plan.problem
        for obj in plan.objects:
            try:
                result = self._apply_for(plan.name, obj, writes)
            except Conflict as conflict:
                problem = Problem("Conflict", str(conflict))
                continue
            if result is None:
                continue
            if obj["kind"] == "Deployment":
                deployment = result
            if obj["kind"] in WORKLOAD_KINDS:
                workloads.append(result)
        problem = problem or self._refused(plan.name)
        if _has_placement(plan.body):
            if not plan.objects:  # invalid or infeasible: show what runs
                workloads = self._chain_workloads(plan.name)
            pods = self.api.list(POD, {contract.POOL_LABEL: plan.name})
            status = chains_pool_status(replace(plan, problem=problem), workloads, pods)
            self._write_status(POOL, plan.name, plan.body, status, writes)
            return
        if not plan.objects or deployment is None:  # invalid, or not ours: show what runs
            deployment = self.api.get(DEPLOYMENT, contract.engine_name(plan.name))
            if deployment is not None and not managed(deployment):
                deployment = None
        pods = self.api.list(POD, {contract.POOL_LABEL: plan.name})
        desired = pool_status(replace(plan, problem=problem), deployment, pods)
        self._write_status(POOL, plan.name, plan.body, desired, writes)

    def _nodes(self) -> list[dict[str, Any]] | None:
        """The cluster's Nodes; None when the operator may not list them (no ClusterRole),
        which the pools that discover their nodes report."""
        try:
            return self.api.nodes()
        except ApiError as error:
            if error.status not in (401, 403, 404):
                raise
            log.warning("cannot list the cluster's Nodes: %s", error)
            return None

    def _workload_kinds(self) -> list[Kind]:
        kinds = [DEPLOYMENT, STATEFULSET]
        if self.config.leader_worker_set:
            kinds.append(LEADERWORKERSET)
        return kinds

    def _chain_workloads(self, pool: str) -> list[dict[str, Any]]:
        """The workloads of a placement pool's chains, as the API holds them."""
        found = []
        for kind in self._workload_kinds():
            for obj in self.api.list(kind, {contract.POOL_LABEL: pool}):
                labels = obj.get("metadata", {}).get("labels") or {}
                if managed(obj) and contract.CHAIN_LABEL in labels:
                    found.append(obj)
        return found

    def _prune(self, plan: NamespacePlan, writes: list[Write]) -> None:
        """Deletes the operator's workloads and Services of valid pools that the plan no
        longer has: chains a replan dropped, StatefulSets replaced by a LeaderWorkerSet, a
        pool's Deployment once it has placement, its chains once it has none."""
        valid = {pool.name for pool in plan.pools if pool.pool is not None}
        if not valid:
            return
        planned = {(obj["kind"], obj["metadata"]["name"]) for obj in plan.objects}
        for kind in [*self._workload_kinds(), SERVICE, BUDGET]:
            for obj in self.api.list(kind, {contract.MANAGED_BY_LABEL: contract.MANAGED_BY}):
                metadata = obj.get("metadata", {})
                pool = (metadata.get("labels") or {}).get(contract.POOL_LABEL)
                name = str(metadata.get("name"))
                if pool in valid and (kind.kind, name) not in planned:
                    self.api.delete(kind, name)
                    writes.append(Write("delete", kind.kind, name))
                    log.info("deleted %s %s (no longer planned)", kind.kind, name)

    def _apply(self, desired: Manifest, writes: list[Write]) -> dict[str, Any]:
        current = self.api.get(kind_of(desired), desired["metadata"]["name"])
        return self._apply_to(desired, current, writes)

    def _apply_to(
        self,
        desired: Manifest,
        current: Mapping[str, Any] | None,
        writes: list[Write],
        adopt: bool = False,
    ) -> dict[str, Any]:
        """Creates `desired`, or applies it over `current` if that differs."""
        kind = kind_of(desired)
        name = desired["metadata"]["name"]
        wire = wire_form(desired)
        if current is None:
            try:
                result = self.api.create(wire)
            except ApiError as error:
                if error.status != 409:
                    raise
                current = fresh_get(self.api, kind, name)  # created meanwhile (or not seen
                # yet by the watch the cache follows): compare as usual
            else:
                writes.append(Write("create", kind.kind, name))
                log.info("created %s %s", kind.kind, name)
                return result
        if current is None:
            raise ApiError(409, f"{kind.kind} {name} exists but cannot be read")
        if not adopt and not managed(current):
            raise Conflict(
                f"{kind.kind} {name} exists and is not managed by {contract.MANAGED_BY}; "
                "rename the pool or delete the object"
            )
        if up_to_date(current, wire) or kind.kind in CREATE_ONLY_KINDS:
            return dict(current)
        result = self.api.apply(wire)
        writes.append(Write("apply", kind.kind, name))
        log.info("updated %s %s", kind.kind, name)
        return result

    def _write_status(
        self,
        kind: Kind,
        name: str,
        body: Mapping[str, Any],
        desired: Mapping[str, Any],
        writes: list[Write],
    ) -> None:
        patch = status_patch(body.get("status"), desired, self.clock())
        if patch is not None:
            self._patch_status(kind, name, patch, writes)

    def _patch_status(
        self, kind: Kind, name: str, patch: Mapping[str, Any], writes: list[Write]
    ) -> None:
        try:
            self.api.patch_status(kind, name, patch)
        except ApiError as error:
            if error.status == 404:  # deleted meanwhile
                return
            raise
        writes.append(Write("status", kind.kind, name))


#: The kinds that run a pool's engines.
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "LeaderWorkerSet"})
#: Kinds created once and then left as they are: a claim's class, mode and (mostly) size
#: cannot change, and the API server would refuse the apply.
CREATE_ONLY_KINDS = frozenset({"PersistentVolumeClaim"})


def _has_placement(body: Mapping[str, Any]) -> bool:
    return bool((body.get("spec") or {}).get("placement"))


def managed(obj: Mapping[str, Any]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return bool(labels.get(contract.MANAGED_BY_LABEL) == contract.MANAGED_BY)


def wire_form(manifest: Manifest) -> Manifest:
    """The object as sent to and returned by the API: a Secret's stringData base64-encoded
    into data (the API stores data only, so that is what compares)."""
    if "stringData" not in manifest:
        return manifest
    wire = {key: value for key, value in manifest.items() if key != "stringData"}
    encoded = {
        key: base64.b64encode(value.encode()).decode()
        for key, value in manifest["stringData"].items()
    }
    wire["data"] = {**manifest.get("data", {}), **encoded}
    return wire


def up_to_date(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether `current` carries the digest of `desired` and every field of it."""
    digest = desired["metadata"].get("annotations", {}).get(contract.HASH_ANNOTATION)
    annotations = current.get("metadata", {}).get("annotations") or {}
    if annotations.get(contract.HASH_ANNOTATION) != digest:
        return False
    wanted = {key: value for key, value in desired.items() if key not in ("apiVersion", "kind")}
    metadata = desired["metadata"]
    wanted["metadata"] = {
        key: metadata[key]
        for key in ("labels", "annotations", "ownerReferences")
        if key in metadata
    }
    return contains(current, wanted)


def contains(current: Any, desired: Any, path: Sequence[str] = ()) -> bool:
    """Whether `current` holds `desired`: every key of a mapping (others may be added),
    lists item by item, quantities under `resources` by value ("0.5" is "500m")."""
    if isinstance(desired, Mapping):
        return isinstance(current, Mapping) and all(
            key in current and contains(current[key], value, (*path, str(key)))
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(contains(c, d, path) for c, d in zip(current, desired, strict=True))
        )
    if current == desired:
        return True
    if "resources" in path:
        return _quantity(current) is not None and _quantity(current) == _quantity(desired)
    return False


def gateway_of(secret: Mapping[str, Any] | None) -> GatewayConfig | None:
    """The configuration in the gateway's Secret as the API holds it (None if unreadable)."""
    if secret is None:
        return None
    encoded = (secret.get("data") or {}).get(contract.GATEWAY_KEY)
    try:
        text = base64.b64decode(encoded).decode() if encoded else ""
        return GatewayConfig.model_validate(yaml.safe_load(text) or {})
    except Exception:  # whatever is there, the plan is written afresh
        return None


_SUFFIXES = {
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def _quantity(value: Any) -> float | None:
    """A Kubernetes quantity's value (None if it is not one)."""
    text = str(value).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if suffix and not text.endswith(suffix):
            continue
        number = text[: len(text) - len(suffix)] if suffix else text
        try:
            return float(number) * _SUFFIXES[suffix]
        except ValueError:
            return None
    return None
