"""The service a request costs, and the weights that scale each tenant's share.

Service is `w_e · extend_tokens + w_q · output_tokens` (DLPM, arXiv 2501.14312, §3,
Table 1; VTC, OSDI'24, §3.1 names the same pair w_p and w_q). Extend tokens are the
prompt tokens not served from the prefix cache, so a cache hit is free to the tenant.
Both papers use w_e = 1 and w_q = 2. A tenant of weight w has its counters advance by
service / w (VTC §4.3), so it is entitled to w times the service of a weight-1 tenant.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from fairpool.sched.errors import (
    ConfigError,
    require_count,
    require_non_negative,
    require_positive,
)

#: Between a tenant and a band in the id of a flow that runs below its tenant's band
#: (`fairpool.sched.tree.flow`): tenant names are DNS labels, which never hold it.
BAND_SEPARATOR = "@"


def tenant_of(flow: str) -> str:
    """The tenant a flow (`tenant` or `tenant@band`) belongs to."""
    return flow.partition(BAND_SEPARATOR)[0]


#: More tokens than a prompt or an output can hold: past any model's context (the longest,
#: 10M tokens, is under 2^24). What bounds a charge heard from outside (`most_service`).
MOST_REQUEST_TOKENS = 1 << 24


@dataclass(frozen=True)
class CostModel:
    """Weights of extend (uncached prompt) tokens and output tokens."""

    extend_weight: float = 1.0
    output_weight: float = 2.0

    def __post_init__(self) -> None:
        require_non_negative("extend_weight", self.extend_weight)
        require_non_negative("output_weight", self.output_weight)
        if self.extend_weight == 0 and self.output_weight == 0:
            raise ConfigError("output_weight", "extend_weight and output_weight cannot both be 0")

    def service(self, extend_tokens: int, output_tokens: int) -> float:
        return self.extend_weight * extend_tokens + self.output_weight * output_tokens

    def most_service(self) -> float:
        """The most one request can be charged: a prompt and an output each as long as
        `MOST_REQUEST_TOKENS`. Another gateway replica's charge above it is not one."""
        return self.service(MOST_REQUEST_TOKENS, MOST_REQUEST_TOKENS)

    def prefill(self, prompt_tokens: int, cached_tokens: int) -> float:
        """Service of admitting a prompt whose first `cached_tokens` are cache hits."""
        return self.extend_weight * max(prompt_tokens - cached_tokens, 0)

    def decode(self, output_tokens: int = 1) -> float:
        return self.output_weight * output_tokens

    def correction(self, charged: Tokens, actual: Tokens) -> float:
        """Service to add (negative: refund) so that a request charged for `charged` has
        paid for `actual` instead: the one way every ledger corrects an estimate to what
        the engine reports. A part that `actual` leaves unknown (None) stays as charged."""
        correction = 0.0
        if actual.extend is not None:
            correction += self.extend_weight * (actual.extend - (charged.extend or 0))
        if actual.output is not None:
            correction += self.output_weight * (actual.output - (charged.output or 0))
        return correction


@dataclass(frozen=True, slots=True)
class Tokens:
    """A request's tokens as one ledger knows them: `extend` (prompt tokens computed, not
    served from a prefix cache) and `output`; None where not known."""

    extend: int | None = None
    output: int | None = None

    def __post_init__(self) -> None:
        for name in ("extend", "output"):
            value = getattr(self, name)
            if value is not None:
                require_count(name, value)


class TenantWeights(Mapping[str, float]):
    """Tenant → weight, with a default (1) for tenants nobody configured. A flow of a
    tenant in another band (`tenant@band`) has its tenant's weight."""

    def __init__(self, weights: Mapping[str, float] | None = None, default: float = 1.0) -> None:
        self.default = require_positive("default_weight", default)
        self._weights: dict[str, float] = {}
        for tenant, weight in (weights or {}).items():
            self._weights[tenant] = require_positive(f"weights[{tenant}]", weight)

    def __getitem__(self, tenant: str) -> float:
        weight = self._weights.get(tenant)
        if weight is None:
            weight = self._weights.get(tenant_of(tenant), self.default)
        return weight

    def __iter__(self) -> Iterator[str]:
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)

    def __repr__(self) -> str:
        return f"TenantWeights({self._weights!r}, default={self.default})"
