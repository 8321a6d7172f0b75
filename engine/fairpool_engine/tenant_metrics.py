"""Per-tenant Prometheus metrics from inside an engine.

Names (all labelled by `tenant`):

| metric | type | meaning |
|---|---|---|
| `fairpool_engine_tenant_service_total` | counter | service charged (cost model units) |
| `fairpool_engine_tenant_requests_waiting` | gauge | requests in the fair queue |
| `fairpool_engine_tenant_requests_running` | gauge | requests being served |
| `fairpool_engine_tenant_scheduler_state` | gauge | VTC's counter, DLPM's deficit |
| `fairpool_engine_tenant_weight` | gauge | the tenant's weight in the current configuration |

plus `fairpool_engine_config_reloads_total{result="applied"|"rejected"}` and
`fairpool_engine_scheduler_info{policy}`.

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
        self._clock = clock
        self._exported_at = float("-inf")
        self._service: dict[str, float] = {}
        self._reloads = {"applied": 0, "rejected": 0}
        self._tenants: set[str] = set()
        self._policy_name: str | None = None

    def export(self, live: LiveScheduler, force: bool = False) -> None:
        """Bring the metrics up to date with the scheduler (throttled unless `force`)."""
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
                self.info.remove(self._policy_name)
            self.info.labels(name).set(1)
            self._policy_name = name
