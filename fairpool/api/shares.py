"""The shape of the fair order in configuration: groups of tenants and the bands' minimum
shares, as the engines' scheduler configuration, the gateway's configuration and the
TenantGroup resource say them (`fairpool.sched.tree` runs them).

A group has a weight and, optionally, a parent group; a tenant names the group it belongs
to and its band (TenantQuota's `slo.class`); a band below the highest has a minimum share
of the service while other bands have work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from fairpool.api.common import DNS_LABEL, Spec
from fairpool.sched.tree import DEFAULT_MIN_SHARES, Group, Shares

Band = Literal["interactive", "standard", "batch"]


class GroupShare(Spec):
    """A group of tenants (an organisation, a team): its weight among its siblings, and
    the group it is part of."""

    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="Share of service relative to the group's siblings (the groups and "
        "tenants with the same parent).",
    )
    parent: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="The group this one is part of; none: a top-level group.",
    )


class BandShare(Spec):
    """What a band is guaranteed while higher bands have work too."""

    min_share: float = Field(
        ge=0,
        lt=1,
        alias="minShare",
        description="Fraction of the service the band gets, at least, while it and another "
        "band have requests waiting (the highest band's is ignored: it goes first).",
    )


def default_bands() -> dict[Band, BandShare]:
    return {
        band: BandShare.model_validate({"minShare": share})  # type: ignore[misc]
        for band, share in DEFAULT_MIN_SHARES.items()
    }


def shares(
    weights: Mapping[str, float],
    default_weight: float,
    groups: Mapping[str, GroupShare],
    tenant_groups: Mapping[str, str],
    tenant_bands: Mapping[str, str],
    bands: Mapping[Any, BandShare],
    ttft: Mapping[str, float] | None = None,
) -> Shares:
    """The tree these settings describe (ConfigError naming the field if it is not one)."""
    return Shares(
        weights,
        default_weight,
        groups={name: Group(group.weight, group.parent) for name, group in groups.items()},
        tenant_groups=tenant_groups,
        tenant_bands=tenant_bands,
        min_shares={band: share.min_share for band, share in bands.items()},
        ttft=ttft,
    )
