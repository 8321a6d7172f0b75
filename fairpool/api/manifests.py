"""Reading the manifests users `kubectl apply`: InferencePools, TenantQuotas, TenantGroups
and the Secrets holding API keys, from multi-document YAML files.

Every error names the file, the document and the field: `local.yaml, document 2:
spec.weight: Input should be greater than 0`; so does a tenant's group or a group's parent
that none of the files defines, or groups that form a cycle (`tenants.yaml, document 3:
spec.group: no TenantGroup named 'acme'`). Documents of other kinds are skipped. A
resource is read as the API server would store it (`fairpool.api.stored`: the CRD's
defaults filled in), so `fairpool up`, `plan` and `render` see what the operator will.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from fairpool.api.common import Metadata
from fairpool.api.inference_pool import InferencePool
from fairpool.api.stored import pruned_fields, stored
from fairpool.api.tenant_group import TenantGroup, group_problems, group_shares
from fairpool.api.tenant_quota import TenantQuota
from fairpool.api.validation import validate
from fairpool.sched.errors import ConfigError


class Secret(BaseModel):
    """A core/v1 Secret: `stringData` as written, `data` base64-encoded."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    api_version: Literal["v1"] = Field(alias="apiVersion")
    kind: Literal["Secret"]
    metadata: Metadata
    string_data: dict[str, str] = Field(default_factory=dict, alias="stringData")
    data: dict[str, str] = Field(default_factory=dict)

    def values(self) -> dict[str, str]:
        """Every entry, decoded; `stringData` wins over `data`, as in Kubernetes."""
        decoded = {}
        for key, value in self.data.items():
            try:
                decoded[key] = base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise ConfigError(
                    f"Secret {self.metadata.name}: data.{key}", "not base64"
                ) from None
        return {**decoded, **self.string_data}


@dataclass
class Manifests:
    pools: list[InferencePool] = field(default_factory=list)
    quotas: list[TenantQuota] = field(default_factory=list)
    secrets: dict[str, Secret] = field(default_factory=dict)
    groups: list[TenantGroup] = field(default_factory=list)

    def pool(self, name: str) -> InferencePool | None:
        return next((pool for pool in self.pools if pool.name == name), None)


KINDS: dict[str, type[BaseModel]] = {
    "InferencePool": InferencePool,
    "TenantQuota": TenantQuota,
    "TenantGroup": TenantGroup,
    "Secret": Secret,
}


def load_manifests(*paths: str | Path, option: str = "-f") -> Manifests:
    """The pools, tenants and secrets of YAML files; duplicates are errors."""
    manifests = Manifests()
    seen: dict[tuple[str, str], str] = {}
    for path in paths:
        for where, document in read_documents(Path(path), option):
            kind = str(document.get("kind"))
            model = KINDS.get(kind)
            if model is None:
                continue
            unknown = pruned_fields(document)
            if unknown:  # as `kubectl apply` (strict field validation) refuses them
                raise ConfigError(f"{where}: {unknown[0]}", "unknown field")
            resource: Any = validate(model, stored(document), where)
            name = resource.tenant if kind == "TenantQuota" else resource.metadata.name
            if (kind, name) in seen:
                raise ConfigError(
                    f"{where}: {'spec.tenant' if kind == 'TenantQuota' else 'metadata.name'}",
                    f"{kind} {name!r} is already defined in {seen[kind, name]}",
                )
            seen[kind, name] = where
            if kind == "InferencePool":
                manifests.pools.append(resource)
            elif kind == "TenantQuota":
                manifests.quotas.append(resource)
            elif kind == "TenantGroup":
                manifests.groups.append(resource)
            else:
                manifests.secrets[name] = resource
    check_groups(manifests, seen)
    return manifests


def check_groups(manifests: Manifests, where: dict[tuple[str, str], str]) -> None:
    """Every tenant's group and every group's parent is a TenantGroup of the manifests, and
    no group is its own ancestor; else a ConfigError naming the document and field."""
    groups = group_shares(manifests.groups)
    problems = group_problems(groups, "TenantGroup named")
    if problems:
        name = min(problems)
        raise ConfigError(f"{where['TenantGroup', name]}: spec.parent", problems[name][1])
    for quota in manifests.quotas:
        if quota.spec.group is not None and quota.spec.group not in groups:
            raise ConfigError(
                f"{where['TenantQuota', quota.tenant]}: spec.group",
                f"no TenantGroup named {quota.spec.group!r}",
            )


def read_documents(source: Path, option: str = "-f") -> list[tuple[str, dict[str, Any]]]:
    """Every document of a multi-document YAML file, with where it is ("FILE, document
    N") for error messages; ConfigError if the file is missing, not YAML or a document
    is not a mapping."""
    if not source.is_file():
        raise ConfigError(option, f"no such file: {source}")
    try:
        documents = list(yaml.safe_load_all(source.read_text()))
    except yaml.YAMLError as error:
        raise ConfigError(source.name, f"not valid YAML: {error}") from None
    found = []
    for number, document in enumerate(documents, start=1):
        if document is None:
            continue
        where = f"{source.name}, document {number}"
        if not isinstance(document, dict):
            raise ConfigError(where, "must be a mapping")
        found.append((where, document))
    return found
