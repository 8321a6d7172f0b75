"""Per-tenant Prometheus metrics from inside an engine.

Names (all labelled by `tenant`; those of a flow — a tenant in one band — by `band` too):

| metric | labels | type | meaning |
|---|---|---|---|
| `fairpool_engine_tenant_service_total` | tenant, band | counter | service charged |
| `fairpool_engine_tenant_requests_waiting` | tenant, band | gauge | requests in the fair queue |
| `fairpool_engine_tenant_requests_running` | tenant, band | gauge | requests being served |
| `fairpool_engine_tenant_scheduler_state` | tenant, band | gauge | VTC's counter, DLPM's deficit |
| `fairpool_engine_tenant_weight` | tenant | gauge | the tenant's weight now |

A tenant's requests run in its band (`tenantBands`, `standard` unless named) or in a lower
one they ask (`fairpool_band`): each band is a series of its own, so `sum by (tenant)`
gives what the metric gave before bands. A flow whose band changes with the configuration
moves to the new series; the old one's gauges stay at 0, as a tenant's do once it is idle.

plus `fairpool_engine_config_reloads_total{result="applied"|"rejected"}`,
`fairpool_engine_scheduler_info{policy}`, and, for policies that have them,
`fairpool_engine_scheduler_quantum{policy}` (DLPM's Q in force: `auto` grows with the
prompts admitted) and `fairpool_engine_scheduler_fairness_bound{policy}` (the bound the
policy's theorem gives on two backlogged tenants' weighted service gap, with the largest
prompt admitted, the engine's KV capacity and the quantum in force: VTC 2U, DLPM 2(U + Q)).

Inside vLLM the scheduler lives in the EngineCore process while `/metrics` is served by
the API server: with `PROMETHEUS_MULTIPROC_DIR` set (the launcher does it), prometheus
client writes these to shared files and vLLM's `/metrics` merges them with its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from fairpool.sched.cost import tenant_of
from fairpool.sched.policy import LocalPolicy
from fairpool_engine.live import LiveScheduler

#: Seconds between two exports while busy; engines export at once when they go idle.
EXPORT_INTERVAL = 0.25


#: A flow's labels: (tenant, band).
Labels = tuple[str, str]


class TenantMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        options = {"registry": registry} if registry is not None else {}
        gauge = {"multiprocess_mode": "mostrecent", **options}
        per_flow = ["tenant", "band"]
        self.service = Counter(
            "fairpool_engine_tenant_service",
            "Service charged to the tenant (w_e·uncached prompt + w_q·output tokens)",
            per_flow,
            **options,  # type: ignore[arg-type]
        )
        self.waiting = Gauge(
            "fairpool_engine_tenant_requests_waiting",
            "Requests of the tenant waiting in the fair queue",
            per_flow,
            **gauge,  # type: ignore[arg-type]
        )
        self.running = Gauge(
            "fairpool_engine_tenant_requests_running",
            "Requests of the tenant being served",
            per_flow,
            **gauge,  # type: ignore[arg-type]
        )
        self.state = Gauge(
            "fairpool_engine_tenant_scheduler_state",
            "The policy's per-tenant state (VTC counter, DLPM deficit)",
            per_flow,
            **gauge,  # type: ignore[arg-type]
        )
        self.weight = Gauge(
            "fairpool_engine_tenant_weight",
            "The tenant's weight in the scheduler configuration",
            ["tenant"],
            **gauge,  # type: ignore[arg-type]
        )
        self.reloads = Counter(
            "fairpool_engine_config_reloads",
            "Scheduler configuration changes applied or rejected",
            ["result"],
            **options,  # type: ignore[arg-type]
        )
        self.info = Gauge(
            "fairpool_engine_scheduler_info",
            "The policy the engine's fair scheduler runs (value 1)",
            ["policy"],
            **gauge,  # type: ignore[arg-type]
        )
        self.quantum = Gauge(
            "fairpool_engine_scheduler_quantum",
            "The deficit policy's quantum in force (DLPM's Q, auto or fixed)",
            ["policy"],
            **gauge,  # type: ignore[arg-type]
        )
        self.bound = Gauge(
            "fairpool_engine_scheduler_fairness_bound",
            "Bound on two backlogged tenants' weighted service gap, for the parameters in force",
            ["policy"],
            **gauge,  # type: ignore[arg-type]
        )
        self._clock = clock
        self._exported_at = float("-inf")
        self._service: dict[str, float] = {}  # by flow
        self._reloads = {"applied": 0, "rejected": 0}
        self._flows: set[str] = set()
        self._series: set[Labels] = set()  # every (tenant, band) a gauge was set for
        self._policy_name: str | None = None
        self._by_policy: list[Gauge] = []  # metrics set for the policy `_policy_name`

    def export(self, live: LiveScheduler, memory_tokens: int, force: bool = False) -> None:
        """Bring the metrics up to date with the scheduler of an engine whose KV cache
        holds `memory_tokens` (throttled unless `force`)."""
        now = self._clock()
        if not force and now - self._exported_at < EXPORT_INTERVAL:
            return
        self._exported_at = now
        policy = live.policy
        bands = policy.weights.band_of
        for flow, served in policy.served.items():
            delta = served - self._service.get(flow, 0.0)
            if delta > 0:
                self.service.labels(tenant_of(flow), bands(flow)).inc(delta)
                self._service[flow] = served
        self._export_flows(policy)
        for result, count in live.reloads.items():
            if count > self._reloads[result]:
                self.reloads.labels(result).inc(count - self._reloads[result])
                self._reloads[result] = count
        self._export_policy(live, memory_tokens)

    def _export_flows(self, policy: LocalPolicy) -> None:
        """The gauges of every flow seen so far, and every tenant's weight. Flows that
        fall under the same labels (a tenant's band changed while it had requests) add
        up; the scheduler state shown is the larger."""
        state = policy.tenant_state()
        self._flows.update(policy.served, state, policy.active_tenants())
        bands = policy.weights.band_of
        values: dict[Labels, tuple[int, int, float]] = {}
        for flow in self._flows:
            labels = (tenant_of(flow), bands(flow))
            waiting, running, value = policy.tenant_waiting(flow), policy.tenant_running(flow), 0.0
            if labels in values:
                earlier = values[labels]
                waiting, running = waiting + earlier[0], running + earlier[1]
                value = earlier[2]
            values[labels] = (waiting, running, max(value, state.get(flow, 0.0)))
        self._series.update(values)
        for labels in self._series:
            waiting, running, value = values.get(labels, (0, 0, 0.0))
            self.waiting.labels(*labels).set(waiting)
            self.running.labels(*labels).set(running)
            self.state.labels(*labels).set(value)
        for tenant in {tenant for tenant, _ in self._series}:
            self.weight.labels(tenant).set(policy.weights[tenant])

    def _export_policy(self, live: LiveScheduler, memory_tokens: int) -> None:
        """The policy running, and its quantum and bound where it has them."""
        policy = live.policy
        name = live.config.policy_name
        if name != self._policy_name:
            if self._policy_name is not None:
                for metric in self._by_policy:
                    metric.remove(self._policy_name)
            self.info.labels(name).set(1)
            self._policy_name = name
            self._by_policy = [self.info]
        for metric, value in (
            (self.quantum, policy.quantum),
            (self.bound, policy.service_bound(memory_tokens)),
        ):
            if value is not None:
                metric.labels(name).set(value)
                if metric not in self._by_policy:
                    self._by_policy.append(metric)
