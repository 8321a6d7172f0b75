"""The kopf handlers: each is one call into `runtime.Operator`; the work is in `reconcile`.

- pools, tenants and tenant groups created, updated, resumed (operator start) or deleted:
  full reconcile;
- a Secret a tenant names changes (a key rotated): full reconcile — only Secrets labelled
  `fairpool.io/api-keys: "true"` are watched (server-side) or read;
- an engine Deployment or a chain's StatefulSet changes, or an engine pod (which also covers
  LeaderWorkerSets' stage pods, and the model's fetch step): its pool's status; one of the
  operator's Deployments, StatefulSets, Services, ConfigMaps or PodDisruptionBudgets deleted,
  or one of the last three changed: full reconcile (it is recreated, or someone's edit
  reverted);
- a timer on every tenant, every FAIRPOOL_SERVED_INTERVAL seconds (30): the gateway's served
  numbers (fetched once for all tenants, and written on the tenants and their groups);
- a Node's labels, allocatable resources or schedulability changing (with the chart's
  rbac.readNodes; `node_changed`): a full reconcile, when a placement pool discovers nodes;
- a thread of the operator's own (`runtime.Resync`), whatever exists: every 30 s, a full
  reconcile if none ran for 5 minutes or a refused object is due again (a safety net for
  lost events, and for edits nobody is told about: the gateway's Secret, the Nodes).

No handler raises for a bad spec — that is a status condition — so nothing loops on one;
API errors are retried by kopf after a delay. An object the API server refuses (a 422, an
admission policy, a ResourceQuota) stops neither the other pools nor the gateway's Secret:
its pool gets a Degraded condition (ApplyFailed) naming it and the server's answer, and the
object is tried again after a delay that doubles per refusal (10 s to 5 min), or at once
when the pool's spec changes it. kopf keeps its own bookkeeping in annotations
(`kopf.fairpool.io/…`), never in status, so the CRDs' status schemas need no room for it.
Pools carry no finalizer: nothing has to run before one goes (owner references delete its
objects; the reconcile its deletion triggers, or the next one, drops it from the gateway).
Tenants carry kopf's finalizer `fairpool.io/kopf-finalizer`, which kopf adds for the timer;
tenant groups carry none.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import kopf

from fairpool_operator import contract
from fairpool_operator.api import LEADERWORKERSET, Api, ApiError
from fairpool_operator.cache import CachedApi
from fairpool_operator.config import OperatorConfig, _seconds
from fairpool_operator.kube import KubernetesApi
from fairpool_operator.reconcile import Reconciler, Write
from fairpool_operator.runtime import Operator, Resync

POOLS = (contract.GROUP, contract.VERSION, contract.POOL_PLURAL)
TENANTS = (contract.GROUP, contract.VERSION, contract.TENANT_PLURAL)
GROUPS = (contract.GROUP, contract.VERSION, contract.GROUP_PLURAL)
SERVED_INTERVAL = _seconds(os.environ, contract.SERVED_INTERVAL_ENV, 30.0)
RETRY_DELAY = 10.0
RESYNC_INTERVAL = 300.0
RESYNC_PERIOD = 30.0
ANNOTATIONS = "kopf.fairpool.io"
FINALIZER = "fairpool.io/kopf-finalizer"
OWN = {contract.MANAGED_BY_LABEL: contract.MANAGED_BY}
#: Objects of the operator whose every change is worth a reconcile (they change rarely; a
#: Deployment's status changes all the time, and someone's edit of its spec waits for the
#: resync).
EDITABLE = ("ConfigMap", "Service", "PodDisruptionBudget")

log = logging.getLogger("fairpool.operator")


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's settings for a namespaced, least-privilege operator."""
    # No cluster-wide scans of namespaces and CRDs: the operator watches one namespace and
    # its CRDs are installed before it starts (the chart's crds/), so it needs no ClusterRole.
    settings.scanning.disabled = True
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATIONS)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATIONS, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.WARNING  # Kubernetes Events for warnings and errors only
    settings.peering.stealth = True  # no log line per keep-alive
    settings.watching.server_timeout = 300  # watches end and resume from their resourceVersion
    # Secrets: only the key Secrets, selected by the API server, so no other Secret of the
    # namespace ever reaches the operator through its watch.
    selector = ",".join(f"{key}={value}" for key, value in contract.API_KEYS_LABELS.items())
    settings.watching.label_selectors["", "v1", "secrets"] = selector


@kopf.on.startup()
def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure(settings)
    config = memo.get("config") or OperatorConfig.from_environment()
    api = KubernetesApi(config.namespace)
    config = with_leader_worker_set(config, api)
    memo.operator = Operator.for_config(Reconciler(api, config))
    memo.resync = Resync(memo.operator, RESYNC_PERIOD, RESYNC_INTERVAL).start()
    log.info(
        "fairpool operator for namespace %s (chains as %s)",
        config.namespace,
        "LeaderWorkerSets" if config.leader_worker_set else "StatefulSets",
    )
    try:  # the gateway's Secret, even before any pool or tenant exists
        _log(memo.operator.reconcile())
    except ApiError as error:
        log.warning("first reconcile failed, the handlers will retry: %s", error)


@kopf.on.cleanup()
def stop(memo: kopf.Memo, **_: Any) -> None:
    if "resync" in memo:
        memo.resync.stop()


def with_leader_worker_set(config: OperatorConfig, api: Api) -> OperatorConfig:
    """The configuration with `leader_worker_set` settled: as set, or whether the API
    server serves LeaderWorkerSets now (the CRD installed later needs a restart)."""
    if config.leader_worker_set is not None:
        return config
    try:
        served = api.serves(LEADERWORKERSET)
    except ApiError as error:
        log.warning("cannot tell whether LeaderWorkerSets are served (%s): not using them", error)
        served = False
    return replace(config, leader_worker_set=served)


@kopf.on.resume(*POOLS)
@kopf.on.create(*POOLS)
@kopf.on.update(*POOLS)
def pool_changed(memo: kopf.Memo, **kwargs: Any) -> None:
    _reconcile(memo, kwargs)


@kopf.on.resume(*TENANTS)
@kopf.on.create(*TENANTS)
@kopf.on.update(*TENANTS)
def tenant_changed(memo: kopf.Memo, **kwargs: Any) -> None:
    _reconcile(memo, kwargs)


@kopf.on.resume(*GROUPS)
@kopf.on.create(*GROUPS)
@kopf.on.update(*GROUPS)
def group_changed(memo: kopf.Memo, **kwargs: Any) -> None:
    _reconcile(memo, kwargs)


@kopf.on.event(*POOLS)
@kopf.on.event(*TENANTS)
@kopf.on.event(*GROUPS)
def deleted(type: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """The reconcile recomputes the gateway's Secret and the trees from what exists."""
    if type == "DELETED":
        _reconcile(memo, kwargs)


def _referenced(name: str, memo: kopf.Memo, **_: Any) -> bool:
    operator = memo.get("operator")
    return operator is not None and name in operator.referenced_secrets


@kopf.on.event("", "v1", "secrets", labels=contract.API_KEYS_LABELS, when=_referenced)
def key_secret_changed(type: str, memo: kopf.Memo, **kwargs: Any) -> None:
    if type is not None:  # not the initial listing
        _reconcile(memo, kwargs)


@kopf.on.event("apps", "v1", "deployments", labels=OWN)
@kopf.on.event("apps", "v1", "statefulsets", labels=OWN)
@kopf.on.event("", "v1", "services", labels=OWN)
@kopf.on.event("", "v1", "configmaps", labels=OWN)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=OWN)
def child_changed(
    type: str, body: kopf.Body, labels: Mapping[str, str], memo: kopf.Memo, **kwargs: Any
) -> None:
    pool = labels.get(contract.POOL_LABEL)
    if pool is None or "operator" not in memo:
        return
    if type == "DELETED" or (type is not None and body.get("kind") in EDITABLE):
        _reconcile(memo, kwargs)  # recreated, or someone's edit reverted
    elif type is not None and body.get("kind") in ("Deployment", "StatefulSet"):
        _capture(memo, kwargs)
        _log(memo.operator.refresh_pool_status(pool))


@kopf.on.event("", "v1", "pods", labels=OWN)
def engine_pod_changed(
    type: str, labels: Mapping[str, str], memo: kopf.Memo, **kwargs: Any
) -> None:
    """An engine pod came, went or changed: its pool's status — readiness, the fetch
    step's progress or failure (ModelReady), and a chain's stages (whatever runs the chain,
    LeaderWorkerSets included, whose events the operator does not watch)."""
    pool = labels.get(contract.POOL_LABEL)
    if pool is not None and type is not None and "operator" in memo:
        _capture(memo, kwargs)
        _log(memo.operator.refresh_pool_status(pool))


@kopf.timer(*TENANTS, interval=SERVED_INTERVAL, initial_delay=1.0)
def tenant_timer(memo: kopf.Memo, **_: Any) -> None:
    """The gateway's served numbers (fetched once for all tenants)."""
    _log(memo.operator.poll_served(max_age=SERVED_INTERVAL / 2))


def node_changed(type: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A Node came, went, or changed what placement reads of it (labels, allocatable GPUs
    and memory, schedulability): a full reconcile, when a pool discovers its nodes. The
    kubelet's heartbeats (status conditions) change nothing here."""
    operator = memo.get("operator")
    seen: dict[str, str] = memo.setdefault("node_shapes", {})
    name = str(body.get("metadata", {}).get("name"))
    shape = None if type == "DELETED" else node_shape(body)
    changed = seen.get(name) != shape
    if shape is None:
        seen.pop(name, None)
    else:
        seen[name] = shape
    if type is not None and changed and operator is not None and operator.reconciler.uses_nodes:
        _reconcile(memo, kwargs)


def node_shape(body: Mapping[str, Any]) -> str:
    """What of a Node placement reads, as a digest."""
    shape = {
        "labels": body.get("metadata", {}).get("labels") or {},
        "allocatable": (body.get("status") or {}).get("allocatable") or {},
        "unschedulable": bool((body.get("spec") or {}).get("unschedulable")),
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def watch_nodes() -> None:
    """Registers `node_changed` (only where the operator may read Nodes: a watch refused by
    RBAC would be retried, and logged, forever)."""
    kopf.on.event("", "v1", "nodes")(node_changed)


def _reconcile(memo: kopf.Memo, indexes: Mapping[str, Any] | None = None) -> None:
    _capture(memo, indexes or {})
    try:
        _log(memo.operator.reconcile())
    except ApiError as error:
        raise kopf.TemporaryError(str(error), delay=RETRY_DELAY) from None
    delay = memo.operator.reconciler.retry_in()
    if delay is not None:  # objects the API server refused: their pools say why
        count = len(memo.operator.reconciler.refusals)
        raise kopf.TemporaryError(f"{count} object(s) refused, retrying", delay=max(delay, 1.0))


# --- reads from the watches (`cache`) ------------------------------------------------------------

#: The resources whose objects the reconciler reads from kopf's indexes: by kind, the
#: resource and the labels its watch selects by (the operator's own objects only).
CACHED: dict[str, tuple[tuple[str, str, str], Mapping[str, str] | None]] = {
    "InferencePool": (POOLS, None),
    "TenantQuota": (TENANTS, None),
    "TenantGroup": (GROUPS, None),
    "Deployment": (("apps", "v1", "deployments"), OWN),
    "StatefulSet": (("apps", "v1", "statefulsets"), OWN),
    "Service": (("", "v1", "services"), OWN),
    "ConfigMap": (("", "v1", "configmaps"), OWN),
    "PodDisruptionBudget": (("policy", "v1", "poddisruptionbudgets"), OWN),
    "Pod": (("", "v1", "pods"), OWN),
}


def _index_of(kind: str) -> Any:
    """kopf's index of one kind: every object, under the key `kind` (`cache.Indexes`)."""

    def index(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
        return {kind: copy.deepcopy(dict(body))}

    index.__name__ = index.__qualname__ = f"cached_{CACHED[kind][0][2]}"
    return index


for _kind, (_resource, _labels) in CACHED.items():
    kopf.index(*_resource, labels=_labels)(_index_of(_kind))


def _capture(memo: kopf.Memo, kwargs: Mapping[str, Any]) -> None:
    """From the first handler that kopf hands its indexes to: the reconciler reads the
    cached kinds from them from then on (kopf fills them before it runs any handler)."""
    operator = memo.get("operator")
    if operator is None or getattr(operator.reconciler.api, "base", None) is not None:
        return
    indexes = {
        kind: kwargs[f"cached_{resource[2]}"]
        for kind, (resource, _) in CACHED.items()
        if f"cached_{resource[2]}" in kwargs
    }
    if len(indexes) == len(CACHED):
        operator.reconciler.api = CachedApi(operator.reconciler.api, indexes)


def _log(writes: list[Write] | None) -> None:
    if writes:
        log.info("wrote %s", ", ".join(str(write) for write in writes))
