"""Each tenant's share of a pool's service across every gateway replica.

A replica's own metrics (`fairpool_gateway_service`) count what it served; with several
replicas, a dashboard would have to add them up and still could not say whether the
weights hold. With `sharedState`, every settlement also adds its service to the tenant's
fleet-wide record in the server (`SharedLimiter.record_service`, sent with the
settlement), and every replica reports the same fleet-wide figures, read from the server
when its metrics are scraped:

- `fairpool_gateway_fleet_service_total{pool,tenant}`: service by every replica, in all;
- `fairpool_gateway_fleet_share{pool,tenant}`: the tenant's share of the pool's service
  over the last minute;
- `fairpool_gateway_fleet_share_error{pool,tenant}`: that share minus its weighted share
  among the tenants served in that minute (w_t / Σ w). Zero when the weights hold; a
  tenant that asked for less than its share shows a negative error that is its own
  choice, so read it for tenants that kept requests waiting.

Every replica reports the same values: aggregate them with `max`, not `sum`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fairpool.front import FrontListener, Settlement
from fairpool_gateway.shared_limits import FleetService, SharedLimiter


@dataclass(frozen=True)
class Share:
    """One tenant's part of one pool's service, fleet-wide."""

    pool: str
    tenant: str
    total: float  # service, in all
    recent: float  # service in the last window
    share: float  # of the pool's service in the last window
    error: float | None  # share − weighted share; None if it was not served in the window


def shares(
    service: Mapping[tuple[str, str], FleetService], weights: Mapping[str, float]
) -> list[Share]:
    """Each (pool, tenant)'s share of its pool's recent service and its error against
    the weighted share among the pool's tenants served in the window."""
    recent_by_pool: dict[str, dict[str, float]] = {}
    for (pool, tenant), served in service.items():
        if served.recent > 0:
            recent_by_pool.setdefault(pool, {})[tenant] = served.recent
    totals = {pool: sum(recent.values()) for pool, recent in recent_by_pool.items()}
    weight_sums = {
        pool: sum(weights.get(tenant, 1.0) for tenant in recent)
        for pool, recent in recent_by_pool.items()
    }
    found = []
    for (pool, tenant), served in sorted(service.items()):
        share = served.recent / totals[pool] if pool in totals else 0.0
        error = None
        if served.recent > 0:
            error = share - weights.get(tenant, 1.0) / weight_sums[pool]
        found.append(Share(pool, tenant, served.total, served.recent, share, error))
    return found


class ServiceRecorder(FrontListener):
    """Adds every settlement's service to the fleet's record in the shared state."""

    def __init__(self, shared: SharedLimiter) -> None:
        self.shared = shared

    def settled(self, settlement: Settlement) -> None:
        self.shared.record_service(settlement.pool, settlement.request.tenant, settlement.service)


class FleetShares(Collector):
    """The `fairpool_gateway_fleet_*` metrics, as last read by `refresh` (the admin API
    calls it before each scrape)."""

    def __init__(
        self,
        shared: SharedLimiter,
        tenants_of_pools: Callable[[], Mapping[str, list[str]]],
        weights: Callable[[], Mapping[str, float]],
    ) -> None:
        self.shared = shared
        self.tenants_of_pools = tenants_of_pools
        self.weights = weights
        self.latest: list[Share] = []

    async def refresh(self) -> None:
        """Read the fleet's record (one round trip); while the server is down the metrics
        are absent rather than stale."""
        service = await self.shared.fleet_service(self.tenants_of_pools())
        self.latest = [] if service is None else shares(service, self.weights())

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        labels = ["pool", "tenant"]
        total = CounterMetricFamily(
            "fairpool_gateway_fleet_service",
            "Service charged by every replica of the gateway (from the shared state).",
            labels=labels,
        )
        share = GaugeMetricFamily(
            "fairpool_gateway_fleet_share",
            "The tenant's share of the pool's service over the last minute, every replica.",
            labels=labels,
        )
        error = GaugeMetricFamily(
            "fairpool_gateway_fleet_share_error",
            "Share minus weighted share among the tenants served in the last minute.",
            labels=labels,
        )
        for entry in self.latest:
            values = [entry.pool, entry.tenant]
            total.add_metric(values, entry.total)
            share.add_metric(values, entry.share)
            if entry.error is not None:
                error.add_metric(values, entry.error)
        yield from (total, share, error)
