"""The engine's scheduler configuration: the file the operator renders into a ConfigMap and
both engines (the vLLM plugin and `fairpool engine-sim`) read.

```yaml
policy: dlpm            # any name `fairpool policies` lists, e.g. vtc, fcfs, lpm, dlpm+memsafe
memorySafe: false       # add memory-safe admission (seed 002) to the policy's order
quantum: 2048           # DLPM's Q, in service units (dlpm only; unset: auto)
shareMemory: true       # share KV memory by weight under pressure (unset: on for vtc, dlpm)
cost: {extendWeight: 1, outputWeight: 2}
defaultWeight: 1        # tenants not listed below
tenants: {acme: 2, globex: 1}
groups: {org-a: {weight: 1}, team-1: {weight: 2, parent: org-a}}   # the fair order's tree
tenantGroups: {acme: team-1}
tenantBands: {acme: interactive}          # standard unless named
bands: {standard: {minShare: 0.1}, batch: {minShare: 0.05}}
```

Every field is optional. Requests carry their tenant in the OpenAI request body as
`"vllm_xargs": {"fairpool_tenant": "acme"}` (vLLM copies `vllm_xargs` into
`SamplingParams.extra_args`); requests without it belong to the tenant `default`. A request
run below its tenant's band also carries `"fairpool_band": "batch"` (the gateway sets it; a
band above the tenant's is ignored, as the gateway never sends one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fairpool.api.shares import Band, BandShare, GroupShare, default_bands, shares
from fairpool.api.validation import validate
from fairpool.sched.cost import CostModel
from fairpool.sched.errors import ConfigError
from fairpool.sched.policy import LocalPolicy
from fairpool.sched.registry import MEMORY_SAFE_SUFFIX, make_policy, policy_parameters
from fairpool.sched.tree import Shares, flow

#: Environment variable holding the path of the scheduler configuration file.
CONFIG_ENV = "FAIRPOOL_SCHEDULER_CONFIG"
#: Environment variable naming a policy that replaces the file's (`--policy`).
POLICY_ENV = "FAIRPOOL_SCHEDULER_POLICY"
#: The key in `vllm_xargs` / `SamplingParams.extra_args` that names the tenant.
TENANT_XARG = "fairpool_tenant"
#: ... and the one that names a band below the tenant's, for a request asked to run there.
BAND_XARG = "fairpool_band"
#: Every key of ours in `vllm_xargs` starts with this; unknown ones are refused.
XARG_PREFIX = "fairpool_"
DEFAULT_TENANT = "default"


def known_policy(name: str) -> str:
    """`name` if the registry knows the policy (a pydantic validator's ValueError if not)."""
    try:
        policy_parameters(name)
    except ConfigError as error:
        raise ValueError(error.problem) from None
    return name


class CostWeights(BaseModel):
    """Service = extendWeight · uncached prompt tokens + outputWeight · output tokens."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    extend_weight: float = Field(
        default=1.0,
        ge=0,
        alias="extendWeight",
        description="Service per prompt token not served from the prefix cache.",
    )
    output_weight: float = Field(
        default=2.0, ge=0, alias="outputWeight", description="Service per generated token."
    )

    def model(self) -> CostModel:
        return CostModel(self.extend_weight, self.output_weight)


class SchedulerConfig(BaseModel):
    """What an engine's fair scheduler runs: policy, its parameters, costs and weights."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    policy: str = "dlpm"
    memory_safe: bool = Field(default=False, alias="memorySafe")
    quantum: float | None = Field(default=None, gt=0)
    share_memory: bool | None = Field(default=None, alias="shareMemory")
    cost: CostWeights = Field(default_factory=CostWeights)
    default_weight: float = Field(default=1.0, gt=0, alias="defaultWeight")
    tenants: dict[str, float] = Field(default_factory=dict)
    groups: dict[str, GroupShare] = Field(default_factory=dict)
    tenant_groups: dict[str, str] = Field(default_factory=dict, alias="tenantGroups")
    tenant_bands: dict[str, Band] = Field(default_factory=dict, alias="tenantBands")
    bands: dict[Band, BandShare] = Field(default_factory=default_bands)

    _known_policy = field_validator("policy")(lambda cls, name: known_policy(name))

    @field_validator("tenants")
    @classmethod
    def _positive_weights(cls, tenants: dict[str, float]) -> dict[str, float]:
        for tenant, weight in tenants.items():
            if not tenant:
                raise ValueError("tenant names must be non-empty")
            if not weight > 0:
                raise ValueError(f"weight of {tenant!r} must be > 0, got {weight}")
        return tenants

    @property
    def policy_name(self) -> str:
        """The registry name, with `+memsafe` when memory-safe admission is on."""
        if self.memory_safe and not self.policy.endswith(MEMORY_SAFE_SUFFIX):
            return self.policy + MEMORY_SAFE_SUFFIX
        return self.policy

    def weights(self) -> Shares:
        """The tenants' weights in the fair order's tree: their groups and bands."""
        return shares(
            self.tenants,
            self.default_weight,
            self.groups,
            self.tenant_groups,
            self.tenant_bands,
            self.bands,
        )

    def make_policy(self) -> LocalPolicy:
        params: dict[str, Any] = {}
        if self.quantum is not None:
            params["quantum"] = self.quantum
        if self.share_memory is not None:
            params["share_memory"] = self.share_memory
        try:
            return make_policy(
                self.policy_name, cost=self.cost.model(), weights=self.weights(), **params
            )
        except ConfigError as error:
            raise ConfigError(f"scheduler config: {error.parameter}", error.problem) from None

    def same_policy(self, other: SchedulerConfig) -> bool:
        """True when only tenant weights differ: the running policy can keep its state."""
        return (self.policy_name, self.quantum, self.share_memory, self.cost) == (
            other.policy_name,
            other.quantum,
            other.share_memory,
            other.cost,
        )


def parse_scheduler_config(data: object, source: str = "scheduler config") -> SchedulerConfig:
    """Validate a parsed document; errors name the source and the field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, "must be a mapping")
    config = validate(SchedulerConfig, data, source)
    try:
        config.weights()  # a tree that is not one (a cycle, an unknown group) fails here
    except ConfigError as error:
        raise ConfigError(f"{source}: {error.parameter}", error.problem) from None
    config.make_policy()  # parameters the policy refuses (quantum for vtc) fail here
    return config


def load_scheduler_config(path: str | Path) -> SchedulerConfig:
    """Read and validate a scheduler configuration file (YAML or JSON)."""
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as error:
        raise ConfigError(str(source), f"cannot read: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(str(source), f"not valid YAML: {error}") from None
    return parse_scheduler_config(data, source.name)


def tenant_of(extra_args: object) -> str:
    """The tenant a request's `vllm_xargs` names (the default tenant if none)."""
    if isinstance(extra_args, dict):
        tenant = extra_args.get(TENANT_XARG)
        if isinstance(tenant, str) and tenant:
            return tenant
    return DEFAULT_TENANT


def flow_of(extra_args: object, shares: Shares) -> str:
    """The flow a request runs in (`fairpool.sched.tree.flow`): its tenant, or
    `tenant@band` when its `vllm_xargs` ask a band below the tenant's. A band above the
    tenant's, or one that is not a band, runs in the tenant's own (the gateway never sends
    one; an engine reached directly must not let a request rise)."""
    tenant = tenant_of(extra_args)
    band = extra_args.get(BAND_XARG) if isinstance(extra_args, dict) else None
    try:
        return flow(tenant, band if isinstance(band, str) else None, shares.tenant_band(tenant))
    except ConfigError:
        return tenant


def check_xargs(xargs: object) -> None:
    """Refuse `vllm_xargs` of ours that are unknown or malformed; others are vLLM's."""
    if xargs is None:
        return
    if not isinstance(xargs, dict):
        raise ConfigError("vllm_xargs", f"must be an object, got {type(xargs).__name__}")
    for key, value in xargs.items():
        if not isinstance(key, str) or not key.startswith(XARG_PREFIX):
            continue
        if key == BAND_XARG:
            if value not in ("interactive", "standard", "batch"):
                raise ConfigError(
                    f"vllm_xargs.{key}", f"must be interactive, standard or batch, got {value!r}"
                )
            continue
        if key != TENANT_XARG:
            raise ConfigError(
                f"vllm_xargs.{key}", f"unknown key; fairpool reads {TENANT_XARG} and {BAND_XARG}"
            )
        if not isinstance(value, str) or not value or len(value) > 253:
            raise ConfigError(
                f"vllm_xargs.{key}", f"must be a tenant name of 1-253 characters, got {value!r}"
            )
