"""The little of the Kubernetes API the reconciler uses, as an interface: a fake in memory
for unit tests, `kube.KubernetesApi` against a cluster (or kmock). Everything is in one
namespace but two reads: the cluster's Nodes (for placement pools that discover their
nodes) and whether an API (LeaderWorkerSet) is served."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fairpool_operator import contract


@dataclass(frozen=True)
class Kind:
    """A namespaced resource: its apiVersion, kind and plural (the URL's name)."""

    api_version: str
    kind: str
    plural: str

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        path = f"{root}/namespaces/{namespace}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
        return path


POOL = Kind(f"{contract.GROUP}/{contract.VERSION}", "InferencePool", contract.POOL_PLURAL)
TENANT = Kind(f"{contract.GROUP}/{contract.VERSION}", "TenantQuota", contract.TENANT_PLURAL)
TENANT_GROUP = Kind(f"{contract.GROUP}/{contract.VERSION}", "TenantGroup", contract.GROUP_PLURAL)
DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
SERVICE = Kind("v1", "Service", "services")
CONFIGMAP = Kind("v1", "ConfigMap", "configmaps")
SECRET = Kind("v1", "Secret", "secrets")
POD = Kind("v1", "Pod", "pods")
STATEFULSET = Kind("apps/v1", "StatefulSet", "statefulsets")
LEADERWORKERSET = Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets")
CLAIM = Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
BUDGET = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
KINDS = {
    kind.kind: kind
    for kind in (
        POOL,
        TENANT,
        TENANT_GROUP,
        DEPLOYMENT,
        SERVICE,
        CONFIGMAP,
        SECRET,
        POD,
        STATEFULSET,
        LEADERWORKERSET,
        CLAIM,
        BUDGET,
    )
}
#: The kinds of objects the operator creates for a pool and deletes when a new plan no
#: longer has them (a placement pool's chains, or its Deployment when it gains placement).
POOL_WORKLOADS = (DEPLOYMENT, STATEFULSET, LEADERWORKERSET, SERVICE, BUDGET)


#: Objects as the API serves them (an alias: inside `Api`, `list` is a method).
Objects = list[dict[str, Any]]


def kind_of(manifest: Mapping[str, Any]) -> Kind:
    return KINDS[str(manifest["kind"])]


class ApiError(Exception):
    """The API server refused a request (or could not be reached: status 0)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"API answered {status}: {message}" if status else message)


class Api(Protocol):
    """One namespace of the API. Bodies are plain dicts, as the API serves them."""

    namespace: str

    def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        """The object, or None if there is none."""

    def list(self, kind: Kind, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Every object of a kind (with all the given labels)."""

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Creates the object; ApiError 409 if it exists."""

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the operator's fields of the object (forcing conflicts)."""

    def patch_status(self, kind: Kind, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patches the object's status subresource with `status`."""

    def delete(self, kind: Kind, name: str) -> None:
        """Deletes the object (its dependents in the background); none: no error."""

    def nodes(self) -> Objects:
        """The cluster's Nodes (cluster-scoped: needs the chart's ClusterRole)."""

    def serves(self, kind: Kind) -> bool:
        """Whether the API server serves `kind` (its API group's discovery lists it)."""

    def record_event(self, event: Mapping[str, Any]) -> None:
        """Posts a core/v1 Event (`kubectl describe` shows it on its object)."""


def matches(obj: Mapping[str, Any], labels: Mapping[str, str] | None) -> bool:
    """Whether the object carries every one of `labels`."""
    own = obj.get("metadata", {}).get("labels") or {}
    return all(own.get(key) == value for key, value in (labels or {}).items())
