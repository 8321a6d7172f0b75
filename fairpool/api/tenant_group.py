"""TenantGroup: a group of tenants in the fair order's tree — an organisation, a team (API
group fairpool.io/v1alpha1, short name `tg`).

```yaml
apiVersion: fairpool.io/v1alpha1
kind: TenantGroup
metadata: {name: acme-support}
spec:
  parent: acme          # another TenantGroup; unset: directly under the band
  weight: 2             # share of service relative to its siblings
  description: Acme's support team
```

A TenantQuota joins a group with `spec.group`; its band is its `spec.slo.class`. Inside each
band, service is shared by weight among the top-level groups and the tenants of no group,
then inside each group among its member groups and tenants, at any depth
(`fairpool.sched.tree`).

This module also holds `fair_order`: the one place that turns tenants (TenantQuotas, or the
gateway's tenant table) and groups into the tree the schedulers run (`Shares`). The
engines' scheduler configuration, the gateway's `GatewayConfig.shares` and `fairpool sim`
all build theirs with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fairpool.api.common import Metadata, field_error
from fairpool.api.shares import Band, BandShare, GroupShare, default_bands, shares
from fairpool.api.status import TenantGroupStatus
from fairpool.sched.tree import DEFAULT_BAND, Shares


class TenantGroupSpec(GroupShare):
    description: str | None = Field(
        default=None,
        max_length=1024,
        description="What the group is, for people (kubectl get tg -o wide shows it).",
    )


class TenantGroup(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)  # status and the like
    api_version: Literal["fairpool.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["TenantGroup"]
    metadata: Metadata
    spec: TenantGroupSpec = Field(default_factory=TenantGroupSpec)
    status: TenantGroupStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @model_validator(mode="after")
    def _not_its_own_parent(self) -> TenantGroup:
        if self.spec.parent == self.metadata.name:
            raise field_error(
                "TenantGroup",
                ("spec", "parent"),
                self.spec.parent,
                "a group cannot be its own parent",
            )
        return self

    def share(self) -> GroupShare:
        return GroupShare(weight=self.spec.weight, parent=self.spec.parent)


#: The rule `_not_its_own_parent` says, as the CRD's CEL rule on the whole object.
OWN_PARENT_RULE = (
    "!has(self.spec) || !has(self.spec.parent) || self.spec.parent != self.metadata.name",
    "spec.parent: a group cannot be its own parent",
)


def group_shares(groups: Iterable[TenantGroup]) -> dict[str, GroupShare]:
    """The groups of TenantGroup resources, by name."""
    return {group.name: group.share() for group in groups}


def group_problems(
    groups: Mapping[str, GroupShare], noun: str = "group"
) -> dict[str, tuple[str, str]]:
    """Each group that is not in the tree as it says, with (reason, problem): its parent is
    not a group (`ParentNotFound`: "no {noun} 'x'"), or following parents leads back to it
    (`ParentCycle`)."""
    found: dict[str, tuple[str, str]] = {}
    for name in sorted(groups):
        parent = groups[name].parent
        if parent is None:
            continue
        if parent not in groups:
            found[name] = ("ParentNotFound", f"no {noun} {parent!r}")
            continue
        path = [name]
        current: str | None = parent
        while current is not None and current in groups and current not in path:
            path.append(current)
            current = groups[current].parent
        if current == name:
            cycle = " → ".join([*path, name])
            found[name] = ("ParentCycle", f"the groups {cycle} form a cycle")
    return found


def without_broken_parents(groups: Mapping[str, GroupShare]) -> dict[str, GroupShare]:
    """The groups, each one `group_problems` names placed at the top (its parent dropped):
    a tree whatever was given, for the operator, which must keep serving."""
    broken = group_problems(groups)
    return {
        name: group.model_copy(update={"parent": None}) if name in broken else group
        for name, group in groups.items()
    }


@dataclass(frozen=True)
class TenantPlace:
    """Where one tenant is in the tree: its weight, group and band."""

    tenant: str
    weight: float = 1.0
    group: str | None = None
    band: Band = "standard"
    ttft: float | None = None  # its slo.ttftSeconds: its requests' deadlines, if interactive


@dataclass(frozen=True)
class FairOrder:
    """The tree of a set of tenants, in the configuration files' terms: the tenants'
    weights, the groups on their paths, each tenant's group and band (only where not
    `standard`), and the bands' minimum shares."""

    weights: dict[str, float]
    groups: dict[str, GroupShare]
    tenant_groups: dict[str, str]
    tenant_bands: dict[str, Band]
    bands: dict[Band, BandShare]
    #: tenant → its slo.ttftSeconds, for the gateway's queue (deadlines in the interactive
    #: band); the engines' configuration leaves it out.
    ttft: dict[str, float] = field(default_factory=dict)

    def shares(self, default_weight: float = 1.0) -> Shares:
        """The tree the schedulers run (ConfigError naming the field if it is not one)."""
        bands: dict[str, BandShare] = dict(self.bands.items())
        return shares(
            self.weights,
            default_weight,
            self.groups,
            self.tenant_groups,
            self.tenant_bands,
            bands,
            self.ttft,
        )


def fair_order(
    tenants: Iterable[TenantPlace],
    groups: Mapping[str, GroupShare],
    bands: Mapping[Band, BandShare] | None = None,
) -> FairOrder:
    """The tree of `tenants` under `groups`, with the bands' minimum shares `bands` (None:
    the defaults). Every group is checked — a cycle, or a parent or a tenant's group that is
    no group, is a ConfigError naming the field (`groups[x].parent`, `tenants[t].group`) —
    and the result keeps only the groups on the tenants' paths."""
    placed = list(tenants)
    tenant_groups = {place.tenant: place.group for place in placed if place.group is not None}
    order = FairOrder(
        weights={place.tenant: place.weight for place in placed},
        groups=dict(groups),
        tenant_groups=tenant_groups,
        tenant_bands={place.tenant: place.band for place in placed if place.band != DEFAULT_BAND},
        bands=dict(default_bands() if bands is None else bands),
        ttft={place.tenant: place.ttft for place in placed if place.ttft is not None},
    )
    order.shares()  # the whole tree checked, unused groups included
    used: dict[str, GroupShare] = {}
    for group in set(tenant_groups.values()):
        current: str | None = group
        while current is not None and current not in used:
            used[current] = groups[current]
            current = groups[current].parent
    return replace(order, groups=dict(sorted(used.items())))
