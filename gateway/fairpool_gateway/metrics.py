"""The gateway's Prometheus metrics, all named `fairpool_gateway_*` and labelled by tenant and
pool, and its per-request log lines. They are served on the admin port only: they name
every tenant, and the tenant API never shows one tenant another's data.

`RequestLedger` is how they learn of requests: it listens to every pool's front
(`fairpool.front.FrontListener`), so each settled request is recorded once, by the same
settlement that charges the tenant; refusals before a request reaches a pool (a bad key, an
unknown model) are recorded through the same `refused`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fairpool.api.tenant_quota import ServiceLevel
from fairpool.front import Flight, FrontListener, FrontRequest, Rejection, Settlement
from fairpool.runtime import LoopLag
from fairpool.sched.routers import RouteDecision

if TYPE_CHECKING:  # the guards import nothing of the metrics; only their types are named
    from fairpool_gateway.budget import BytesInFlight
    from fairpool_gateway.connections import Ports
    from fairpool_gateway.refusals import Refusals

log = logging.getLogger("fairpool.gateway")

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

#: (pool, tenant, worker) → deficit q, for the deficits gauge.
DeficitSource = Callable[[], Iterator[tuple[str, str, str, float]]]
#: (pool, tenant) → (queued, in flight, VTC counter), for the queue gauges.
QueueSource = Callable[[], Iterator[tuple[str, str, int, int, float]]]
#: (pool, worker) → (healthy, outstanding), for the worker gauges.
WorkerSource = Callable[[], Iterator[tuple[str, str, bool, int]]]
#: pool → its router's per-worker quantum in force (D2LPM's Q^w), for pools that have one.
QuantumSource = Callable[[], Iterator[tuple[str, float]]]


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("tenant", "pool")
        self.requests = Counter(
            "fairpool_gateway_requests",
            "Requests answered, by HTTP status.",
            (*labels, "status"),
            registry=self.registry,
        )
        self.tokens = Counter(
            "fairpool_gateway_tokens",
            "Tokens as the engines reported them: prompt, cached (of prompt), completion.",
            (*labels, "kind"),
            registry=self.registry,
        )
        self.service = Counter(
            "fairpool_gateway_service",
            "Service charged (extendWeight·uncached prompt + outputWeight·completion).",
            labels,
            registry=self.registry,
        )
        self.rejections = Counter(
            "fairpool_gateway_rejections",
            "Requests refused, by reason (a limit, auth, no worker, ...).",
            (*labels, "reason"),
            registry=self.registry,
        )
        self.ttft = Histogram(
            "fairpool_gateway_time_to_first_token_seconds",
            "From arrival to the first byte of the answer.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "fairpool_gateway_request_duration_seconds",
            "From arrival to the end of the answer.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_time = Histogram(
            "fairpool_gateway_queue_seconds",
            "Time spent in the gateway's fair queue.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.routing = Counter(
            "fairpool_gateway_routing_decisions",
            "Dispatches by worker and whether the prefix tree knew part of the prompt.",
            ("pool", "worker", "prefix"),
            registry=self.registry,
        )
        self.prefix_chars = Counter(
            "fairpool_gateway_prefix_chars",
            "Prompt characters routed (total) and found in the chosen worker's tree (matched).",
            ("pool", "kind"),
            registry=self.registry,
        )
        self.retries = Counter(
            "fairpool_gateway_retries",
            "Requests sent again to another worker after a failure before the first byte.",
            ("pool",),
            registry=self.registry,
        )
        self.bands = Counter(
            "fairpool_gateway_band_requests",
            "Requests answered, by the priority band they ran in (their tenant's, or a lower "
            "one they asked for) and HTTP status.",
            (*labels, "band", "status"),
            registry=self.registry,
        )
        self.ttft_missed = Counter(
            "fairpool_gateway_ttft_deadline_misses",
            "Answered requests whose first token came later than their tenant's "
            "slo.ttftSeconds (counted, never reordered past the fair order).",
            (*labels, "band"),
            registry=self.registry,
        )
        self.tbt_missed = Counter(
            "fairpool_gateway_tbt_target_misses",
            "Answered streams whose mean time between tokens (from the first token to the "
            "end, over the tokens after the first) was longer than their tenant's "
            "slo.tbtSeconds.",
            (*labels, "band"),
            registry=self.registry,
        )
        self.shared_state_ignored = Counter(
            "fairpool_gateway_shared_state_ignored",
            "Entries read from the shared state and ignored as no replica's (forged or "
            "corrupt), and writes the server refused, by kind (docs/gateway.md).",
            ("kind",),
            registry=self.registry,
        )

    def add_state(
        self,
        deficits: DeficitSource,
        queues: QueueSource,
        workers: WorkerSource,
        quanta: QuantumSource,
    ) -> None:
        self.registry.register(_StateCollector(deficits, queues, workers, quanta))

    def add_shared_state(self, up: Callable[[], bool]) -> None:
        self.registry.register(_SharedStateCollector(up))

    def add_guards(
        self, ports: Ports, held: BytesInFlight, refusals: Refusals, lag: LoopLag
    ) -> None:
        self.registry.register(_GuardsCollector(ports, held, refusals, lag))


class _GuardsCollector(Collector):
    """What clients hold of the gateway, and what it refused them, read at scrape time."""

    def __init__(self, ports: Ports, held: BytesInFlight, refusals: Refusals, lag: LoopLag) -> None:
        self.ports, self.held, self.refusals, self.lag = ports, held, refusals, lag

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        connections = GaugeMetricFamily(
            "fairpool_gateway_connections", "Open client connections.", labels=("port",)
        )
        reset = CounterMetricFamily(
            "fairpool_gateway_connections_refused",
            "Connections reset on arrival: over the port's total or per-address budget.",
            labels=("port", "reason"),
        )
        for budget in (self.ports.tenant, self.ports.admin):
            connections.add_metric((budget.port,), budget.open)
            for reason in ("total", "per_client"):
                reset.add_metric((budget.port, reason), budget.refused[reason])
        held = GaugeMetricFamily(
            "fairpool_gateway_bytes_in_flight",
            "Bytes of request bodies and answers held for clients, all tenants together.",
            value=self.held.total,
        )
        over = CounterMetricFamily(
            "fairpool_gateway_bytes_refused",
            "Request bodies refused for want of room in a tenant's or the total byte budget.",
            labels=("budget",),
        )
        for whose, count in self.held.refused.items():
            over.add_metric((whose,), count)
        damped = CounterMetricFamily(
            "fairpool_gateway_refusals_damped",
            "Refusals held back and closed because their tenant or address was refused in a storm.",
            value=self.refusals.damped,
        )
        lag = GaugeMetricFamily(
            "fairpool_gateway_event_loop_lag_seconds",
            "The longest the gateway's event loop ran late in the last second.",
            value=self.lag.recent(),
        )
        yield from (connections, reset, held, over, damped, lag)


class _SharedStateCollector(Collector):
    def __init__(self, up: Callable[[], bool]) -> None:
        self._up = up

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "fairpool_gateway_shared_state_up",
            "1 while hard limits are counted in the state the replicas share; 0 while this "
            "replica falls back to its own counts with limits divided by the replica count.",
            value=1.0 if self._up() else 0.0,
        )


class _StateCollector(Collector):
    """Gauges read from the gateway's state at scrape time."""

    def __init__(
        self,
        deficits: DeficitSource,
        queues: QueueSource,
        workers: WorkerSource,
        quanta: QuantumSource,
    ) -> None:
        self._deficits, self._queues, self._workers = deficits, queues, workers
        self._quanta = quanta

    def collect(self) -> Iterator[GaugeMetricFamily]:
        deficit = GaugeMetricFamily(
            "fairpool_gateway_deficit",
            "D2LPM deficit q[tenant, worker] in service units.",
            labels=("pool", "tenant", "worker"),
        )
        for pool, tenant, worker, value in self._deficits():
            deficit.add_metric((pool, tenant, worker), value)
        queued = GaugeMetricFamily(
            "fairpool_gateway_queued", "Requests in the fair queue.", labels=("tenant", "pool")
        )
        in_flight = GaugeMetricFamily(
            "fairpool_gateway_in_flight", "Requests dispatched.", labels=("tenant", "pool")
        )
        counter = GaugeMetricFamily(
            "fairpool_gateway_virtual_counter",
            "The fair queue's VTC counter (service / weight).",
            labels=("tenant", "pool"),
        )
        for pool, tenant, waiting, running, value in self._queues():
            queued.add_metric((tenant, pool), waiting)
            in_flight.add_metric((tenant, pool), running)
            counter.add_metric((tenant, pool), value)
        healthy = GaugeMetricFamily(
            "fairpool_gateway_worker_healthy", "1 if in rotation.", labels=("pool", "worker")
        )
        outstanding = GaugeMetricFamily(
            "fairpool_gateway_worker_outstanding",
            "Requests in flight on the worker.",
            labels=("pool", "worker"),
        )
        for pool, worker, up, count in self._workers():
            healthy.add_metric((pool, worker), 1.0 if up else 0.0)
            outstanding.add_metric((pool, worker), count)
        quantum = GaugeMetricFamily(
            "fairpool_gateway_worker_quantum",
            "D2LPM's per-worker quantum Q^w in force (auto or fixed), in service units.",
            labels=("pool",),
        )
        for pool, value in self._quanta():
            quantum.add_metric((pool,), value)
        yield from (deficit, queued, in_flight, counter, healthy, outstanding, quantum)


class RequestLedger(FrontListener):
    """Records every request's end in the metrics and the log."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        slo: Callable[[str], ServiceLevel | None] = lambda tenant: None,
    ) -> None:
        self.metrics = metrics
        self.refusal_log = SampledLog()
        self.slo = slo  # tenant → its slo (targets: ttftSeconds, tbtSeconds)

    def refused(
        self, request_id: str | None, tenant: str, pool: str, status: int, reason: str
    ) -> None:
        """A request refused before it was served (any status, any stage): always counted,
        logged as sampled (`SampledLog`)."""
        self.metrics.requests.labels(tenant, pool, str(status)).inc()
        self.metrics.rejections.labels(tenant, pool, reason).inc()
        suppressed = self.refusal_log.admit((tenant, pool, status, reason))
        if suppressed is None:
            return
        log.info(
            "request refused",
            extra={
                "request_id": request_id,
                "tenant": tenant,
                "pool": pool,
                "status": status,
                "reason": reason,
                "suppressed": suppressed,
            },
        )

    def _count_missed_targets(self, settlement: Settlement, ttft: float) -> None:
        """Count an answer that missed its tenant's slo.ttftSeconds or slo.tbtSeconds (the
        mean gap between its tokens after the first): counted, never acted on."""
        slo = self.slo(settlement.request.tenant)
        if slo is None:
            return
        labels = (settlement.request.tenant, settlement.pool, settlement.band)
        if slo.ttft_seconds is not None and ttft > slo.ttft_seconds:
            self.metrics.ttft_missed.labels(*labels).inc()
        gaps = settlement.completion_tokens - 1
        if slo.tbt_seconds is not None and gaps > 0 and settlement.first_token_at is not None:
            mean_gap = (settlement.finished_at - settlement.first_token_at) / gaps
            if mean_gap > slo.tbt_seconds:
                self.metrics.tbt_missed.labels(*labels).inc()

    def rejected(self, pool: str, request: FrontRequest, rejection: Rejection) -> None:
        self.refused(request.request_id, request.tenant, pool, 429, rejection.reason)

    def dispatched(self, flight: Flight, decision: RouteDecision) -> None:
        pool = flight.front.name
        prefix = "hit" if decision.matched else "miss"
        self.metrics.routing.labels(pool, decision.worker, prefix).inc()
        self.metrics.prefix_chars.labels(pool, "total").inc(len(flight.request.key))
        self.metrics.prefix_chars.labels(pool, "matched").inc(decision.matched)

    def settled(self, settlement: Settlement) -> None:
        tenant, pool, status = settlement.request.tenant, settlement.pool, settlement.status
        if status >= 400 and settlement.reason and status != 499:
            self.refused(settlement.request.request_id, tenant, pool, status, settlement.reason)
        else:
            self.metrics.requests.labels(tenant, pool, str(status)).inc()
        if settlement.dispatched_at is not None:
            waited = settlement.dispatched_at - settlement.arrival
            self.metrics.queue_time.labels(tenant, pool).observe(waited)
        if settlement.worker is not None:  # what the tenant was charged, however it ended
            tokens = self.metrics.tokens
            tokens.labels(tenant, pool, "prompt").inc(settlement.prompt_tokens)
            tokens.labels(tenant, pool, "cached").inc(settlement.cached_tokens)
            tokens.labels(tenant, pool, "completion").inc(settlement.completion_tokens)
            self.metrics.service.labels(tenant, pool).inc(settlement.service)
        self.metrics.bands.labels(tenant, pool, settlement.band, str(status)).inc()
        if settlement.worker is not None and status < 400:
            elapsed = settlement.finished_at - settlement.arrival
            self.metrics.latency.labels(tenant, pool).observe(elapsed)
            if settlement.first_token_at is not None:
                ttft = settlement.first_token_at - settlement.arrival
                self.metrics.ttft.labels(tenant, pool).observe(ttft)
                self._count_missed_targets(settlement, ttft)
        log.info(
            "request done",
            extra={
                "request_id": settlement.request.request_id,
                "tenant": tenant,
                "pool": pool,
                "worker": settlement.worker,
                "status": status,
                "prompt_tokens": settlement.prompt_tokens,
                "cached_tokens": settlement.cached_tokens,
                "completion_tokens": settlement.completion_tokens,
                "seconds": round(settlement.finished_at - settlement.arrival, 4),
            },
        )


class SampledLog:
    """At most one log line per kind of event and `interval` seconds: a storm of refusals
    (a client retrying without back-off) must not become a storm of log lines. The line
    that is written says how many of its kind were left out since the last."""

    def __init__(self, interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[object, tuple[float, int]] = {}  # kind → (written at, left out)

    def admit(self, kind: object) -> int | None:
        """None: leave this one out; else write it, saying this many were left out."""
        now = self.clock()
        written, left_out = self._last.get(kind, (-self.interval, 0))
        if now - written < self.interval:
            self._last[kind] = (written, left_out + 1)
            return None
        if len(self._last) >= 10_000:
            self._last.clear()  # kinds are tenants × reasons: bounded, but never trusted to be
        self._last[kind] = (now, 0)
        return left_out
