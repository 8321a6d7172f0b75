"""What a simulation measures: per-tenant service over time, backlog, latency, fairness.

The service gap is the quantity the fairness theorems bound: over every pair of tenants
f, g and every interval in which both were continuously backlogged, the largest
|W_f/w_f − W_g/w_g| of the service they received in it (VTC Definition 4.2, DLPM §3).
Within one joint backlog interval that is max − min of D(t) = W_f(t)/w_f − W_g(t)/w_g
over the interval. Two readings of "backlogged" are measured:

- `max_backlogged_service_gap`: a tenant is backlogged while one of its requests waits
  (arrived or preempted, not admitted) anywhere in the fleet — in the front's queue or at
  any worker. On one engine this is the papers' backlog (VTC Thm 4.4, DLPM Thm 4.1).
- `max_fully_backlogged_service_gap`: a tenant is backlogged while one of its requests
  waits at *every* worker of the pool. This is the backlog DLPM's Theorem 5.1 speaks of
  (seed 000, Definition 3.1 and Appendix A.2: "if a client is backlogged, it will have a
  request and hence be backlogged in all workers"): its bound 2·|W|·(U + Q) sums the
  local bound 2(U + Q) over workers where both tenants are backlogged throughout. A tenant
  waiting at some workers only is outside that theorem, and the first measure has no
  bound independent of time on several workers (see `tests/test_fleet.py`).

Service is recorded when the step that delivered it ends, in time order across engines
(an engine's step may end after another engine's later-starting step is recorded).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairpool.sched.cost import TenantWeights
from fairpool.sched.requests import Request
from fairpool.sim.engine import Completion

#: Pairwise gaps are computed over at most this many tenants (those backlogged longest).
GAP_TENANT_LIMIT = 40


def jain_index(values: list[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one takes all."""
    total = sum(values)
    squares = sum(value * value for value in values)
    return total * total / (len(values) * squares) if squares else 1.0


def percentile(values: Iterable[float], fraction: float) -> float | None:
    """The `fraction` (0 to 1) percentile of `values` by the nearest-rank method; None for
    no values. Every percentile fairpool reports comes from here: the simulator's, `fairpool
    load`'s, the reproductions' and the benchmarks', so that their p99s compare.

    Nearest rank: the smallest value v of the sample with at least a fraction `fraction` of
    the values ≤ v, i.e. the value of rank ⌈fraction·n⌉ in ascending order (rank 1, the
    minimum, for fraction 0); p50 of an even count is the lower middle value.

    Why nearest rank and not linear interpolation: the answer is always a value of the
    sample, a latency some request had rather than one between two requests that none had
    (p99 of 50 requests is the slowest one); and it leaves nothing to agree on, where
    interpolation comes in several schemes that differ in thin tails.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"a percentile's fraction is within [0, 1], got {fraction}")
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(math.ceil(fraction * len(ordered)), 1) - 1]


@dataclass
class _Tenant:
    requests: int = 0
    rejected: int = 0


@dataclass
class _Waiting:
    """Requests of one tenant waiting in one place, and since when some have been."""

    count: int = 0
    since: float | None = None

    def change(self, delta: int, time: float, intervals: list[tuple[float, float]]) -> None:
        before = self.count
        self.count += delta
        if before == 0 and self.count > 0:
            self.since = time
        elif before > 0 and self.count == 0 and self.since is not None:
            intervals.append((self.since, time))
            self.since = None

    def close(self, end: float, intervals: list[tuple[float, float]]) -> None:
        if self.since is not None:
            intervals.append((self.since, end))
            self.since = None


class Recorder:
    """Collects a run's events; `summary()` turns them into the `fairpool sim` JSON."""

    def __init__(self, weights: TenantWeights, workers: Iterable[str] = ()) -> None:
        self.weights = weights
        #: The pool's workers: "backlogged on every worker" is over these (and any worker
        #: a request was dispatched to).
        self.workers: list[str] = list(workers)
        self.tenants: dict[str, _Tenant] = defaultdict(_Tenant)
        #: Per tenant: the intervals in which one of its requests waited anywhere.
        self.backlog: dict[str, list[tuple[float, float]]] = defaultdict(list)
        #: Per tenant and worker: the intervals in which one of its requests waited there.
        self.worker_backlog: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self._waiting: dict[str, _Waiting] = defaultdict(_Waiting)
        self._waiting_at: dict[tuple[str, str], _Waiting] = defaultdict(_Waiting)
        # Cumulative service per tenant: parallel arrays of times and values (a point per
        # step that served the tenant, so doubles rather than float objects).
        self.service_times: dict[str, array[float]] = defaultdict(lambda: array("d"))
        self.service_values: dict[str, array[float]] = defaultdict(lambda: array("d"))
        self.completions: list[Completion] = []
        self.end = 0.0
        self.preemptions = 0
        self._engine_served: dict[str, dict[str, float]] = defaultdict(dict)
        self._total: dict[str, float] = defaultdict(float)

    # ------------------------------------------------------------------ events

    def arrived(self, request: Request) -> None:
        """Admitted by the front (dispatched, or waiting in its queue): backlogged."""
        tenant = self.tenants[request.tenant]
        tenant.requests += 1
        self._waiting_changed(request.tenant, +1, request.arrival)

    def rejected(self, request: Request) -> None:
        """Refused on arrival by a hard limit: counted, never served nor backlogged."""
        tenant = self.tenants[request.tenant]
        tenant.requests += 1
        tenant.rejected += 1

    def expired(self, request: Request, time: float) -> None:
        """Left the front's queue without being served (its queue timeout): refused."""
        self.tenants[request.tenant].rejected += 1
        self._waiting_changed(request.tenant, -1, time)

    def dispatched(self, request: Request, worker: str, time: float) -> None:
        """Handed to `worker`'s queue: backlogged there too, until admitted."""
        self._waiting_at_changed(request.tenant, worker, +1, time)

    def admitted(self, request: Request, time: float, worker: str | None = None) -> None:
        self._waiting_changed(request.tenant, -1, time)
        if worker is not None:
            self._waiting_at_changed(request.tenant, worker, -1, time)

    def preempted(self, request: Request, time: float, worker: str | None = None) -> None:
        """A preempted request waits again (for its recompute), at its worker."""
        self.preemptions += 1
        self._waiting_changed(request.tenant, +1, time)
        if worker is not None:
            self._waiting_at_changed(request.tenant, worker, +1, time)

    def finished(self, completion: Completion) -> None:
        self.completions.append(completion)

    def served_after_step(
        self,
        time: float,
        engine: str,
        served: Mapping[str, float],
        tenants: Iterable[str] | None = None,
    ) -> None:
        """`engine`'s cumulative service per tenant after a step ending at `time`;
        `tenants`: those the step may have charged (default: every tenant in `served`).

        Steps are reported in the order they start, so one engine's step may end before
        the step of another engine reported earlier: the service series stays in time
        order (the point goes in its place, and the later cumulative values grow by it)."""
        seen = self._engine_served[engine]
        for tenant in served if tenants is None else tenants:
            value = served.get(tenant, 0.0)
            delta = value - seen.get(tenant, 0.0)
            if delta:
                seen[tenant] = value
                self._total[tenant] += delta
                times = self.service_times[tenant]
                values = self.service_values[tenant]
                index = bisect.bisect_right(times, time)
                if index and times[index - 1] == time:
                    values[index - 1] += delta
                else:
                    times.insert(index, time)
                    values.insert(index, (values[index - 1] if index else 0.0) + delta)
                    index += 1
                for later in range(index, len(values)):
                    values[later] += delta

    def close(self, end: float) -> None:
        self.end = end
        for name, waiting in self._waiting.items():
            waiting.close(end, self.backlog[name])
        for (name, worker), waiting in self._waiting_at.items():
            waiting.close(end, self.worker_backlog[name][worker])

    def _waiting_changed(self, name: str, delta: int, time: float) -> None:
        self._waiting[name].change(delta, time, self.backlog[name])

    def _waiting_at_changed(self, name: str, worker: str, delta: int, time: float) -> None:
        if worker not in self.workers:
            self.workers.append(worker)
        self._waiting_at[name, worker].change(delta, time, self.worker_backlog[name][worker])

    # ------------------------------------------------------------------ results

    def service_at(self, tenant: str, time: float) -> float:
        times: Sequence[float] = self.service_times.get(tenant, ())
        index = bisect.bisect_right(times, time)
        return self.service_values[tenant][index - 1] if index else 0.0

    def fully_backlogged(self, tenant: str) -> list[tuple[float, float]]:
        """The intervals in which `tenant` had a request waiting at every worker."""
        workers = self.worker_backlog.get(tenant, {})
        if not self.workers or any(worker not in workers for worker in self.workers):
            return []
        joint = workers[self.workers[0]]
        for worker in self.workers[1:]:
            joint = _intersect(joint, workers[worker])
        return joint

    def max_backlogged_service_gap(self) -> float:
        """The largest gap between two tenants over an interval in which each had a
        request waiting somewhere (anywhere in the fleet)."""
        return self._max_gap(self.backlog)

    def max_fully_backlogged_service_gap(self) -> float:
        """The largest gap between two tenants over an interval in which each had a
        request waiting at every worker (DLPM Theorem 5.1's backlog)."""
        return self._max_gap({tenant: self.fully_backlogged(tenant) for tenant in self.tenants})

    def max_excess_over_fully_backlogged(self) -> float:
        """The largest W_g/w_g − W_f/w_f over an interval in which f had a request waiting at
        every worker and g is any other tenant, backlogged or not (DLPM Theorem 5.2)."""
        excess = 0.0
        for backlogged in self.tenants:
            for start, end in self.fully_backlogged(backlogged):
                for other in self.tenants:
                    if other != backlogged:
                        excess = max(excess, self._rise_within(other, backlogged, start, end))
        return excess

    def _max_gap(self, backlog: Mapping[str, list[tuple[float, float]]]) -> float:
        ranked = sorted(
            (name for name, intervals in backlog.items() if intervals),
            key=lambda name: -sum(end - start for start, end in backlog[name]),
        )[:GAP_TENANT_LIMIT]
        gap = 0.0
        for position, first in enumerate(ranked):
            for second in ranked[position + 1 :]:
                for start, end in _intersect(backlog[first], backlog[second]):
                    differences = self._differences(first, second, start, end)
                    gap = max(gap, max(differences) - min(differences))
        return gap

    def _rise_within(self, first: str, second: str, start: float, end: float) -> float:
        """max over start ≤ t1 ≤ t2 ≤ end of D(t2) − D(t1), D = W_first/w − W_second/w."""
        rise, lowest = 0.0, math.inf
        for difference in self._differences(first, second, start, end):
            lowest = min(lowest, difference)
            rise = max(rise, difference - lowest)
        return rise

    def _differences(self, first: str, second: str, start: float, end: float) -> list[float]:
        """D(t) = W_first(t)/w_first − W_second(t)/w_second at `start` and at every time
        in (start, end] where either's service changed, in time order."""
        weight_f, weight_g = self.weights[first], self.weights[second]
        times = {start}
        for tenant in (first, second):
            series: Sequence[float] = self.service_times.get(tenant, ())
            low = bisect.bisect_right(series, start)
            high = bisect.bisect_right(series, end)
            times.update(series[low:high])
        return [
            self.service_at(first, t) / weight_f - self.service_at(second, t) / weight_g
            for t in sorted(times)
        ]

    def summary(self, fairness_bound: float | None = None) -> dict[str, Any]:
        duration = self.end
        finished = self.completions
        prompt = sum(c.request.prompt_tokens for c in finished)
        output = sum(c.output_tokens for c in finished)
        cached = sum(c.cached_tokens for c in finished)
        by_tenant: dict[str, list[Completion]] = defaultdict(list)
        for completion in finished:
            by_tenant[completion.request.tenant].append(completion)
        tenants: dict[str, Any] = {}
        for name in sorted(self.tenants):
            done = by_tenant.get(name, [])
            ttfts = [c.first_token_at - c.request.arrival for c in done]
            latencies = [c.finished_at - c.request.arrival for c in done]
            gaps = [gap for c in done for gap in c.token_gaps]
            tenants[name] = {
                "requests": self.tenants[name].requests,
                "rejected": self.tenants[name].rejected,
                "finished": len(done),
                "service": round(self._total.get(name, 0.0), 3),
                "input_tokens": sum(c.request.prompt_tokens for c in done),
                "output_tokens": sum(c.output_tokens for c in done),
                "ttft_p50": _rounded(percentile(ttfts, 0.5)),
                "ttft_p99": _rounded(percentile(ttfts, 0.99)),
                "latency_p50": _rounded(percentile(latencies, 0.5)),
                "latency_p99": _rounded(percentile(latencies, 0.99)),
                "tbt_p50": _rounded(percentile(gaps, 0.5)),
                "tbt_p99": _rounded(percentile(gaps, 0.99)),
                "backlogged_s": round(sum(e - s for s, e in self.backlog.get(name, [])), 3),
            }
        weighted = [self._total.get(name, 0.0) / self.weights[name] for name in tenants]
        return {
            "duration_s": round(duration, 3),
            "throughput_tokens_per_s": round((prompt + output) / duration, 3) if duration else 0,
            "output_tokens_per_s": round(output / duration, 3) if duration else 0,
            "cache_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
            "jain_index": round(jain_index(weighted), 4) if weighted else 1.0,
            "fairness_bound": fairness_bound,
            "max_backlogged_service_gap": round(self.max_backlogged_service_gap(), 3),
            "max_fully_backlogged_service_gap": round(self.max_fully_backlogged_service_gap(), 3),
            "tenants": tenants,
        }


def _intersect(
    first: list[tuple[float, float]], second: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    joint = []
    i = j = 0
    while i < len(first) and j < len(second):
        start = max(first[i][0], second[j][0])
        end = min(first[i][1], second[j][1])
        if start < end:
            joint.append((start, end))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return joint


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
