"""Per-tenant Prometheus metrics from inside an engine.

Names (all labelled by `tenant`):

| metric | type | meaning |
|---|---|---|
| `fairpool_engine_tenant_service_total` | counter | service charged (cost model units) |
| `fairpool_engine_tenant_requests_waiting` | gauge | requests in the fair queue |
| `fairpool_engine_tenant_requests_running` | gauge | requests being served |
| `fairpool_engine_tenant_scheduler_state` | gauge | VTC's counter, DLPM's deficit |
| `fairpool_engine_tenant_weight` | gauge | the tenant's weight in the current configuration |

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

from fairpool_engine.live import LiveScheduler

#: Seconds between two exports while busy; engines export at once when they go idle.
EXPORT_INTERVAL = 0.25


class TenantMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        options = {"registry": registry} if registry is not None else {}
        gauge = {"multiprocess_mode": "mostrecent", **options}
        self.service = Counter(
            "fairpool_engine_tenant_service",
            "Service charged to the tenant (w_e·uncached prompt + w_q·output tokens)",
            ["tenant"],
            **options,  # type: ignore[arg-type]
        )
        self.waiting = Gauge(
            "fairpool_engine_tenant_requests_waiting",
            "Requests of the tenant waiting in the fair queue",
            ["tenant"],
            **gauge,  # type: ignore[arg-type]
        )
        self.running = Gauge(
            "fairpool_engine_tenant_requests_running",
            "Requests of the tenant being served",
            ["tenant"],
            **gauge,  # type: ignore[arg-type]
        )
        self.state = Gauge(
            "fairpool_engine_tenant_scheduler_state",
            "The policy's per-tenant state (VTC counter, DLPM deficit)",
            ["tenant"],
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
        self._service: dict[str, float] = {}
        self._reloads = {"applied": 0, "rejected": 0}
        self._tenants: set[str] = set()
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
        for tenant, served in policy.served.items():
            delta = served - self._service.get(tenant, 0.0)
            if delta > 0:
                self.service.labels(tenant).inc(delta)
                self._service[tenant] = served
        state = policy.tenant_state()
        self._tenants.update(policy.served, state, policy.active_tenants())
        for tenant in self._tenants:
            self.waiting.labels(tenant).set(policy.tenant_waiting(tenant))
            self.running.labels(tenant).set(policy.tenant_running(tenant))
            self.state.labels(tenant).set(state.get(tenant, 0.0))
            self.weight.labels(tenant).set(policy.weights[tenant])
        for result, count in live.reloads.items():
            if count > self._reloads[result]:
                self.reloads.labels(result).inc(count - self._reloads[result])
                self._reloads[result] = count
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
