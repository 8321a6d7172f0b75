"""TenantQuota: who may use a pool, with what weight (API group fairpool.io/v1alpha1).

This is the part of the resource that scheduling needs — the tenant and its weight. The
operator's issue adds keys, pools, limits and the SLO class to the same model; fields it
does not know yet are kept, not rejected, so newer manifests still load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from fairpool.api.validation import validate
from fairpool.sched.errors import ConfigError

API_VERSION = "fairpool.io/v1alpha1"


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)


class TenantQuotaSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    tenant: str | None = Field(default=None, min_length=1)
    weight: float = Field(default=1.0, gt=0)


class TenantQuota(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    api_version: Literal["fairpool.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["TenantQuota"]
    metadata: Metadata
    spec: TenantQuotaSpec = Field(default_factory=TenantQuotaSpec)

    @property
    def tenant(self) -> str:
        return self.spec.tenant or self.metadata.name


def load_tenant_quotas(path: str | Path) -> list[TenantQuota]:
    """Every TenantQuota in a (multi-document) YAML file; other kinds are skipped.

    Errors name the file, the document and the field: `tenants.yaml, document 2:
    spec.weight: Input should be greater than 0`.
    """
    source = Path(path)
    if not source.exists():
        raise ConfigError("--tenants", f"no such file: {source}")
    try:
        documents = list(yaml.safe_load_all(source.read_text()))
    except yaml.YAMLError as error:
        raise ConfigError(f"{source.name}", f"not valid YAML: {error}") from None
    quotas: list[TenantQuota] = []
    seen: dict[str, int] = {}
    for number, document in enumerate(documents, start=1):
        if document is None:
            continue
        where = f"{source.name}, document {number}"
        if not isinstance(document, dict):
            raise ConfigError(where, "must be a mapping")
        if document.get("kind") != "TenantQuota":
            continue
        quota = validate(TenantQuota, document, where)
        if quota.tenant in seen:
            raise ConfigError(
                f"{where}: spec.tenant",
                f"tenant {quota.tenant!r} is already defined in document {seen[quota.tenant]}",
            )
        seen[quota.tenant] = number
        quotas.append(quota)
    return quotas


def tenant_weights(quotas: list[TenantQuota]) -> dict[str, float]:
    return {quota.tenant: quota.spec.weight for quota in quotas}
