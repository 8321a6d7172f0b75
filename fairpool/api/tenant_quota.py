"""TenantQuota: who may use which pools, with what weight, group, band, keys, limits and SLO
(API group fairpool.io/v1alpha1, short name `tq`).

```yaml
apiVersion: fairpool.io/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec:
  tenant: acme                 # default: metadata.name
  weight: 2                    # share of service relative to its siblings
  group: acme-support          # a TenantGroup; default: directly under its band
  pools: [chat]                # default: every pool
  apiKeySecretRef: {name: acme-keys}   # every entry of the Secret is an API key
  limits: {requestsPerMinute: 600, tokensPerMinute: 200000, concurrent: 32, queued: 64}
  slo: {class: interactive, ttftSeconds: 0.5, tbtSeconds: 0.1}   # class: the band
```
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from fairpool.api.common import DNS_LABEL, Metadata, Spec
from fairpool.api.shares import Band, BandShare
from fairpool.api.status import TenantQuotaStatus
from fairpool.api.tenant_group import TenantGroup, TenantPlace, fair_order, group_shares
from fairpool.sched.errors import ConfigError
from fairpool.sched.tree import Shares

#: A tenant's SLO class is its priority band.
SloClass = Band

#: A tenant id: what a TenantQuota's `spec.tenant` (and its default, the resource's name)
#: may be, an RFC 1123 label. Every other place a tenant is named (the gateway's tenant
#: table, traces, the simulator's and the load generator's flags) takes it from here: the
#: gateway builds Redis keys as `prefix:{tenant}:...`, the braces a Redis Cluster hash tag,
#: so a `{`, `}` or `:` in a tenant would change which keys hold whose state.
TenantId = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
TENANT_ID_RULE = (
    "lowercase letters, digits and '-', starting and ending with a letter or digit, "
    "at most 63 characters"
)
_TENANT_ID: TypeAdapter[str] = TypeAdapter(TenantId)


def tenant_id(name: object, where: str, error: type[ConfigError] = ConfigError) -> str:
    """`name` if it is a tenant id, else `error` naming `where`: for the places that name
    tenants outside a pydantic model, with the rule the models use."""
    try:
        return _TENANT_ID.validate_python(name, strict=True)
    except ValidationError:
        problem = f"must be a tenant id, as a TenantQuota's spec.tenant ({TENANT_ID_RULE})"
        raise error(where, f"{problem}, got {name!r}") from None


class SecretKeyRef(Spec):
    """A Secret in the tenant's namespace, labelled fairpool.io/api-keys=true: its API keys."""

    name: str = Field(
        min_length=1, max_length=253, description="Name of the Secret holding the API keys."
    )
    key: str | None = Field(
        default=None,
        min_length=1,
        description="The one entry of the Secret that holds the key; by default every "
        "entry is an API key (so keys can be rotated by adding the new one first).",
    )


class TenantLimits(Spec):
    """Hard limits the gateway enforces with 429 and Retry-After; absent means unlimited."""

    requests_per_minute: int | None = Field(
        default=None, ge=1, alias="requestsPerMinute", description="Requests accepted per minute."
    )
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        alias="tokensPerMinute",
        description="Prompt plus completion tokens per minute (estimated on arrival, "
        "corrected with the engine's reported usage).",
    )
    concurrent: int | None = Field(
        default=None, ge=1, description="Requests in progress at once (queued ones included)."
    )
    queued: int | None = Field(
        default=None,
        ge=0,
        description="Requests waiting in the gateway's fair queue for a free worker.",
    )


class ServiceLevel(Spec):
    """The tenant's band, and its latency targets (deadlines and counted misses)."""

    slo_class: SloClass = Field(
        default="standard",
        alias="class",
        description="The tenant's priority band: interactive, standard or batch. A waiting "
        "request of a higher band goes before any of a lower one, except that each lower "
        "band keeps the minimum share of service its pool gives it "
        "(InferencePool spec.scheduler.bands) while it has requests waiting.",
    )
    ttft_seconds: float | None = Field(
        default=None,
        gt=0,
        alias="ttftSeconds",
        description="Target time to first token, in seconds. In the interactive band it is "
        "each request's deadline (its arrival plus this): the gateway's fair queue takes the "
        "request due first among tenants within one request's worth of service of the least "
        "served, never further. Answers that miss it are counted "
        "(fairpool_gateway_ttft_deadline_misses).",
    )
    tbt_seconds: float | None = Field(
        default=None,
        gt=0,
        alias="tbtSeconds",
        description="Target mean time between tokens of a streamed answer, in seconds: "
        "answers that miss it are counted (fairpool_gateway_tbt_target_misses); it does not "
        "change the order.",
    )


class TenantQuotaSpec(Spec):
    tenant: TenantId | None = Field(
        default=None,
        description="Tenant id used in metrics and by the engines' schedulers; "
        "default: the resource's name.",
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="Share of service relative to its siblings (the tenants and groups "
        "directly under the same group, or of no group, in the same band): weight 2 is "
        "entitled to twice the tokens of weight 1 when both are backlogged.",
    )
    group: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="The TenantGroup (in this namespace) the tenant belongs to; unset: "
        "directly under its band. A group that does not exist yet is ignored until it does.",
    )
    pools: list[str] = Field(
        default_factory=list,
        description="InferencePools this tenant may use; empty means every pool.",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        alias="apiKeySecretRef",
        description="Secret with the tenant's API keys (Authorization: Bearer KEY).",
    )
    limits: TenantLimits = Field(default_factory=TenantLimits, description="Hard limits.")
    slo: ServiceLevel = Field(
        default_factory=ServiceLevel, description="Priority band and latency targets."
    )

    def may_use(self, pool: str) -> bool:
        return not self.pools or pool in self.pools


class TenantQuota(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)  # status and the like
    api_version: Literal["fairpool.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["TenantQuota"]
    metadata: Metadata
    spec: TenantQuotaSpec = Field(default_factory=TenantQuotaSpec)
    status: TenantQuotaStatus | None = None

    @property
    def tenant(self) -> str:
        return self.spec.tenant or self.metadata.name

    def place(self) -> TenantPlace:
        """Where the tenant is in the fair order's tree."""
        spec = self.spec
        return TenantPlace(
            self.tenant, spec.weight, spec.group, spec.slo.slo_class, spec.slo.ttft_seconds
        )


def tenant_shares(
    quotas: Iterable[TenantQuota],
    groups: Iterable[TenantGroup] = (),
    bands: Mapping[Band, BandShare] | None = None,
) -> Shares:
    """The fair order's tree of TenantQuotas and TenantGroups (`fair_order`), with the
    bands' minimum shares `bands` (None: the defaults); ConfigError naming the field for a
    cycle or a group that does not exist."""
    places = [quota.place() for quota in quotas]
    return fair_order(places, group_shares(groups), bands).shares()
