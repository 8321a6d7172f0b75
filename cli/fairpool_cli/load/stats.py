"""What a load run measured, per tenant and over time.

Service is the cost model's `w_e × (prompt − cached) + w_q × completion` of each answered
request, counted when the answer ends. The entitled share follows who was active: in
each sampling interval a tenant with a request outstanding is entitled to
weight / (sum of the weights of the tenants active then) of the service delivered in
that interval; a tenant's entitled share is its entitlement summed over the run,
divided by all service. A tenant that asks for less than that gets less, fairly;
a share below the entitled one is unfair only for a tenant that kept requests waiting.
Both shares count from the end of the run's warm-up on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fairpool.sched.cost import CostModel
from fairpool.sim.metrics import percentile
from fairpool_cli.load.request import RequestResult, now
from fairpool_cli.load.spec import LoadSpec


def sorted_percentile(values: list[float], fraction: float) -> float | None:
    """`fairpool.sim.metrics.percentile` (nearest rank) of `values`, sorted in place first:
    the order of latencies matters to nobody, and a list sorted up to a short new tail
    sorts in linear time (so does the copy `percentile` sorts), so a live table can ask
    four times a second."""
    values.sort()
    return percentile(values, fraction)


@dataclass
class TenantStats:
    name: str
    weight: float
    sent: int = 0
    done: int = 0
    cancelled: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    usage_missing: int = 0
    service: float = 0.0
    entitled_service: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    outstanding: int = 0
    active: bool = False  # had a request outstanding during the current interval
    sampled_service: float = 0.0  # service at the last sample
    warmup_service: float = 0.0  # service at the last sample within the warm-up

    def record(self, result: RequestResult, cost: CostModel) -> None:
        if not result.ok:
            self.errors[result.error or "stream"] += 1
            return
        self.done += 1
        self.prompt_tokens += result.prompt_tokens
        self.cached_tokens += result.cached_tokens
        self.completion_tokens += result.completion_tokens
        self.usage_missing += not result.usage_reported
        extend = max(result.prompt_tokens - result.cached_tokens, 0)
        self.service += cost.service(extend, result.completion_tokens)
        ttft, latency = result.ttft, result.latency
        if ttft is not None:
            self.ttfts.append(ttft)
        if latency is not None:
            self.latencies.append(latency)

    def ttft(self, fraction: float) -> float | None:
        """A percentile of the answered requests' times to first token (nearest rank)."""
        return sorted_percentile(self.ttfts, fraction)

    def latency(self, fraction: float) -> float | None:
        """A percentile of the answered requests' latencies (nearest rank)."""
        return sorted_percentile(self.latencies, fraction)

    def to_json(self, result: LoadResult) -> dict[str, Any]:
        return {
            "weight": self.weight,
            "sent": self.sent,
            "done": self.done,
            "cancelled": self.cancelled,
            "errors": dict(self.errors),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "usage_missing": self.usage_missing,
            "service": round(self.service, 3),
            "share": _rounded(result.share(self.name)),
            "entitled_share": _rounded(result.entitled_share(self.name)),
            "output_tokens_per_s": _rounded(self.completion_tokens / result.elapsed_or_one),
            "ttft_p50": _rounded(self.ttft(0.5)),
            "ttft_p99": _rounded(self.ttft(0.99)),
            "latency_p50": _rounded(self.latency(0.5)),
            "latency_p99": _rounded(self.latency(0.99)),
        }


@dataclass
class SeriesPoint:
    t: float
    service: dict[str, float]
    done: dict[str, int]


@dataclass
class LoadResult:
    """Filled in while the run goes (`progress` callbacks see it grow), final after."""

    spec: LoadSpec
    model: str
    tenants: dict[str, TenantStats]
    started: float = field(default_factory=now)
    elapsed: float = 0.0
    stopped_by: str = "running"
    series: list[SeriesPoint] = field(default_factory=list)

    @classmethod
    def begin(cls, spec: LoadSpec, model: str) -> LoadResult:
        tenants = {t.name: TenantStats(t.name, t.weight) for t in spec.tenants}
        return cls(spec, model, tenants)

    @property
    def elapsed_or_one(self) -> float:
        return self.elapsed if self.elapsed > 0 else 1.0

    @property
    def total_service(self) -> float:
        return sum(stats.service for stats in self.tenants.values())

    def share(self, tenant: str) -> float | None:
        """The tenant's part of the service delivered after the warm-up."""
        served = {
            name: stats.service - stats.warmup_service for name, stats in self.tenants.items()
        }
        total = sum(served.values())
        return served[tenant] / total if total else None

    def entitled_share(self, tenant: str) -> float | None:
        total = sum(stats.entitled_service for stats in self.tenants.values())
        return self.tenants[tenant].entitled_service / total if total else None

    def sample(self) -> None:
        """Close the current interval: split its service among the active tenants by
        weight, and append a point of the time series."""
        self.elapsed = now() - self.started
        warming_up = self.elapsed < self.spec.warmup
        active = {name for name, stats in self.tenants.items() if stats.active or stats.outstanding}
        delivered = sum(stats.service - stats.sampled_service for stats in self.tenants.values())
        weights = sum(self.tenants[name].weight for name in active)
        for name, stats in self.tenants.items():
            if name in active and weights and not warming_up:
                stats.entitled_service += delivered * stats.weight / weights
            stats.sampled_service = stats.service
            if warming_up:
                stats.warmup_service = stats.service
            stats.active = stats.outstanding > 0
        services = {name: stats.service for name, stats in self.tenants.items()}
        done = {name: stats.done for name, stats in self.tenants.items()}
        self.series.append(SeriesPoint(round(self.elapsed, 3), services, done))

    def to_json(self) -> dict[str, Any]:
        """Everything: the configuration, per-tenant numbers, totals and the time series."""
        tenants = self.tenants.values()
        return {
            "config": {**self.spec.to_json(), "model": self.model},
            "elapsed_s": round(self.elapsed, 3),
            "stopped_by": self.stopped_by,
            "sent": sum(stats.sent for stats in tenants),
            "done": sum(stats.done for stats in tenants),
            "errors": sum(sum(stats.errors.values()) for stats in tenants),
            "service": round(self.total_service, 3),
            "output_tokens_per_s": round(
                sum(stats.completion_tokens for stats in tenants) / self.elapsed_or_one, 3
            ),
            "tenants": {stats.name: stats.to_json(self) for stats in tenants},
            "series": {
                "t": [point.t for point in self.series],
                "service": {n: [p.service[n] for p in self.series] for n in self.tenants},
                "done": {n: [p.done[n] for p in self.series] for n in self.tenants},
            },
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
