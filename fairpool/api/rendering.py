"""What a pool's engines and the gateway are configured with, derived from the manifests:
pure functions, shared by `fairpool up` (written to files) and the operator (rendered into
ConfigMaps), so local mode and Kubernetes run the same configuration."""

from __future__ import annotations

from collections.abc import Iterable

from fairpool.api.inference_pool import InferencePool
from fairpool.api.scheduler_config import SchedulerConfig
from fairpool.api.tenant_quota import TenantQuota


def scheduler_config(pool: InferencePool, quotas: Iterable[TenantQuota]) -> SchedulerConfig:
    """The engines' scheduler configuration: the pool's policy and the weights of every
    tenant that may use the pool (others get the default weight, 1)."""
    spec = pool.spec.scheduler
    return SchedulerConfig(
        policy=spec.policy,
        memorySafe=spec.memory_safe,
        quantum=spec.quantum,
        cost=spec.cost,
        tenants={
            quota.tenant: quota.spec.weight for quota in quotas if quota.spec.may_use(pool.name)
        },
    )


def scheduler_config_document(config: SchedulerConfig) -> dict[str, object]:
    """The file's content, in its YAML spelling (camelCase, defaults left out)."""
    return config.model_dump(by_alias=True, exclude_none=True)
