"""`fairpool render -f FILE.yaml`: what the operator would create for the manifests in a
file, without a cluster — the same planning and rendering functions, printed.

Pools, tenants, tenant groups and key Secrets are read as the API would hold them: the
CRDs' defaults filled in and unknown fields dropped (and reported: `kubectl apply` refuses
them), no uid yet (owner references name the pool and show a placeholder uid). Problems
the operator would put in a status condition are reported on stderr, naming the object and
the field.
Placement pools render their chains as LeaderWorkerSets only when asked (`--lws`: there is
no cluster to ask), and those that discover their nodes read them from `--nodes FILE`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from fairpool.api.manifests import read_documents as manifest_documents
from fairpool.api.stored import pruned_fields, stored
from fairpool_operator.config import OperatorConfig
from fairpool_operator.plan import NamespacePlan, plan_namespace

KINDS = ("InferencePool", "TenantQuota", "TenantGroup", "Secret")


@dataclass(frozen=True)
class Rendering:
    objects: list[dict[str, Any]]
    problems: list[str]  # "InferencePool chat: spec.model.source: ..."


def render_files(
    paths: Sequence[str | Path],
    namespace: str | None = None,
    environ: dict[str, str] | None = None,
    leader_worker_set: bool | None = None,
    nodes: Sequence[Mapping[str, Any]] | None = None,
) -> Rendering:
    """The objects for the manifests in `paths`, in the order the operator writes them;
    chains as LeaderWorkerSets when `leader_worker_set` (else as FAIRPOOL_LEADER_WORKER_SET
    says, `auto` meaning no); `nodes` for placement pools that discover theirs."""
    config = OperatorConfig.from_environment(environ, namespace=namespace)
    if leader_worker_set is not None or config.leader_worker_set is None:
        config = replace(config, leader_worker_set=bool(leader_worker_set))
    documents = [document for path in paths for document in read_documents(Path(path))]
    pools = [doc for doc in documents if doc.get("kind") == "InferencePool"]
    quotas = [doc for doc in documents if doc.get("kind") == "TenantQuota"]
    groups = [doc for doc in documents if doc.get("kind") == "TenantGroup"]
    secrets = {
        str(doc.get("metadata", {}).get("name")): doc
        for doc in documents
        if doc.get("kind") == "Secret"
    }
    plan = plan_namespace(pools, quotas, secrets, config, nodes=nodes, groups=groups)
    return Rendering(plan.objects, unknown_fields(paths) + problems(plan))


def problems(plan: NamespacePlan) -> list[str]:
    found = [
        f"InferencePool {pool.name}: {pool.problem.message}" for pool in plan.pools if pool.problem
    ]
    found += [
        f"TenantQuota {tenant.name}: {tenant.problem.message}"
        for tenant in plan.tenants
        if tenant.problem
    ]
    found += [
        f"TenantGroup {group.name}: {group.problem.message}"
        for group in plan.groups
        if group.problem
    ]
    return found


def format_objects(objects: list[dict[str, Any]], output: str) -> str:
    """YAML documents (files embedded as block literals, readable), or a JSON List."""
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, explicit_start=True)


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (the embedded scheduler.yaml, gateway.yaml) as `|` blocks."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def read_documents(path: Path) -> list[dict[str, Any]]:
    """The InferencePool, TenantQuota, TenantGroup and Secret documents of a (multi-document)
    YAML file, as the API server would store them (`fairpool.api.stored`)."""
    return [
        stored(document)
        for _, document in manifest_documents(path)
        if document.get("kind") in KINDS
    ]


def unknown_fields(paths: Sequence[str | Path]) -> list[str]:
    """The fields of the files' resources their CRDs do not know: `kubectl apply` refuses
    them (strict field validation), or the API server drops them."""
    return [
        f"{document['kind']} {document.get('metadata', {}).get('name')}: {field}: unknown "
        "field (kubectl apply refuses it)"
        for path in paths
        for _, document in manifest_documents(Path(path))
        for field in pruned_fields(document)
    ]
