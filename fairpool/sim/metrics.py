"""What a simulation measures: per-tenant service over time, backlog, latency, fairness.

**Backlogged.** A tenant is backlogged while demand of it waits anywhere — what a fair
scheduler somewhere could serve now and does not:

- a request of it is queued at a gateway replica's front (its fair queue);
- a request of it waits in an engine's queue (arrived, or preempted, and not admitted);
- one of its closed-loop clients has a stream whose next request is due and not sent (its
  think time over, a Retry-After still holding it). A client with no think time always has
  its next request ready, so it is backlogged for as long as it runs: it would send more
  if its own concurrency let it.

Requests that run are not waiting: a tenant whose requests all run, and whose clients send
nothing more, is not backlogged. The backlog is kept per flow (a tenant in one band,
`fairpool.sched.tree.flow`); a tenant is backlogged while any of its flows is.

**The service gap** is the quantity the fairness theorems bound: over every pair of flows
f, g of one band and every interval in which both were continuously backlogged, the
largest |W_f/w_f − W_g/w_g| of the service they received in it (VTC Definition 4.2, DLPM
§3). Within one joint backlog interval that is max − min of D(t) = W_f(t)/w_f − W_g(t)/w_g
over the interval. Three readings of "backlogged" are measured:

- `max_backlogged_service_gap` (the headline): backlogged as above, anywhere. On one
  engine with demand waiting in the engine only (no gateway queue, no closed-loop
  clients) this is the papers' backlog (VTC Thm 4.4, DLPM Thm 4.1).
- `max_backlogged_at_some_worker_service_gap`: a flow is backlogged while one of its
  requests waits at *some* worker of the pool — DLPM's Definition 3.1 in a pool (seed
  000, §3: "a backlogged client may have requests in queues of certain workers or all
  workers"), the backlog Theorem 5.1 states its bound 2·|W|·(U + Q) for. Without a
  gateway queue or closed-loop clients, demand waits at the workers only and this equals
  the headline. **Theorem 5.1 as stated is false on this measure for a large finite
  Q^w**: a flood whose prompts share a prefix sticks to the worker caching it until it has
  spent Q^w there, and meanwhile a flood served on every worker pulls ahead with time
  (Q^w = 10^6, two workers, engines at Q = 2,048: 95,584 over 20 s against a bound of
  26,672). Nor is it bounded for a light tenant whose requests wait at one worker or
  another while it is served all it asks (`tests/test_fleet.py` keeps both cases).
- `max_fully_backlogged_service_gap`: a flow is backlogged while one of its requests
  waits at *every* worker of the pool. This is not the paper's definition but the
  premise of Theorem 5.1's proof (Appendix A.2: "if a client is backlogged, it will have
  a request and hence be backlogged in all workers"), which D2LPM guarantees only once a
  tenant has spent Q^w on the workers it prefers: under it the bound 2·|W|·(U + Q) holds
  for every Q^w, summing the local bound 2(U + Q) over workers where both tenants are
  backlogged throughout. A tenant waiting at some workers only, at the gateway or at its
  client is outside it: the sticky flood above measures 0 here.

**Share against entitlement.** While a flow is backlogged it is entitled to a share of
the service the fleet delivers, as the fair order splits it among the flows backlogged
with it (`fairpool.sim.entitlement`: w_i / Σ_{j backlogged} w_j with flat weights; with
groups a tenant's share of its group's share; a lower band its minimum share). Averaged
over the flow's backlogged time, weighted by the service delivered (the entitlement is a
share of service: a second in which nothing was served entitles nobody to anything):

    entitled share   = ∫_B e_i dS / ∫_B dS       backlogged share = ∫_B dS_i / ∫_B dS
    share ratio      = backlogged share / entitled share = ∫_B dS_i / ∫_B e_i dS

with B the flow's backlogged time, S the service delivered to everyone and e_i its
entitlement at each moment. A ratio below 1 is a tenant served below its weight while it
waited, above 1 one served above it. A tenant backlogged only in short waits (its requests
wait a moment, then run: it is served what it asks) has a ratio below 1 that says nothing
of its weight — its service comes after its waits — so the headline `worst_share_ratio`
is taken over the tenants backlogged for at least `RATIO_BACKLOG_FRACTION` of the run.

Service is recorded when the step that delivered it ends, in time order across engines
(an engine's step may end after another engine's later-starting step is recorded).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from fairpool.sched.cost import TenantWeights, tenant_of
from fairpool.sched.requests import Request
from fairpool.sched.tree import BAND_NAMES, Shares
from fairpool.sim.engine import Completion
from fairpool.sim.entitlement import Entitlements

#: Pairwise gaps are computed over at most this many tenants (those backlogged longest).
GAP_TENANT_LIMIT = 40
#: `worst_share_ratio` is over the tenants backlogged for at least this fraction of the run.
RATIO_BACKLOG_FRACTION = 0.5

Intervals = list[tuple[float, float]]


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
    hung_up: int = 0


@dataclass
class _Backlogged:
    """A flow's service while it was backlogged: what it received, what everyone
    received, and what it was entitled to (`Recorder`'s docstring)."""

    served: float = 0.0
    delivered: float = 0.0
    entitled: float = 0.0

    def __add__(self, other: _Backlogged) -> _Backlogged:
        return _Backlogged(
            self.served + other.served,
            self.delivered + other.delivered,
            self.entitled + other.entitled,
        )


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
    """Collects a run's events; `summary()` turns them into the `fairpool sim` JSON.

    A tenant is backlogged while demand of it waits anywhere — at a gateway replica's fair
    queue (`arrived` until `dispatched` and admitted), in an engine's queue (`dispatched`
    or `preempted` until `admitted`), or at its closed-loop client (`client_waiting`) —
    until it is admitted, refused (`expired`) or its client leaves (`hung_up`); the module
    docstring says why.

    Tenants are recorded by flow (`tenant`, or `tenant@band` for requests that asked a
    lower band): the scheduling entities whose backlog and service the theorems compare.
    The summary adds a tenant's flows up, with figures per band where it has several."""

    def __init__(self, weights: TenantWeights, workers: Iterable[str] = ()) -> None:
        self.weights = weights
        #: The tree the weights belong to (bands, groups): entitlements follow it.
        self.shares = Shares.of(weights)
        #: The pool's workers: "backlogged on every worker" is over these (and any worker
        #: a request was dispatched to).
        self.workers: list[str] = list(workers)
        #: The end of the run, when it has one: later events are not counted, and waits
        #: still open end there (a run's last completions and queue timeouts are delivered
        #: after it, so that the front's ledgers end consistent).
        self.horizon = math.inf
        self.tenants: dict[str, _Tenant] = defaultdict(_Tenant)
        #: Per flow: the intervals in which demand of it waited anywhere (module docstring).
        self.backlog: dict[str, Intervals] = defaultdict(list)
        #: Per flow and worker: the intervals in which one of its requests waited there.
        self.worker_backlog: dict[str, dict[str, Intervals]] = defaultdict(
            lambda: defaultdict(list)
        )
        self._waiting: dict[str, _Waiting] = defaultdict(_Waiting)
        self._waiting_at: dict[tuple[str, str], _Waiting] = defaultdict(_Waiting)
        self._where: dict[str, str | None] = {}  # a waiting request → its worker (None: front)
        # Cumulative service per flow: parallel arrays of times and values (a point per
        # step that served the flow, so doubles rather than float objects).
        self.service_times: dict[str, array[float]] = defaultdict(lambda: array("d"))
        self.service_values: dict[str, array[float]] = defaultdict(lambda: array("d"))
        # Service to everyone, by step end: times and increments (summed up at the end).
        self._delivered_times: array[float] = array("d")
        self._delivered: array[float] = array("d")
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
        self._where[request.request_id] = None
        self._waiting_changed(request.tenant, +1, request.arrival)

    def rejected(self, request: Request) -> None:
        """Refused on arrival by a hard limit: counted, never served nor backlogged."""
        tenant = self.tenants[request.tenant]
        tenant.requests += 1
        tenant.rejected += 1

    def expired(self, request: Request, time: float) -> None:
        """Left the front's queue without being served (its queue timeout, or no worker
        took it): refused, if that happened within the run."""
        if time <= self.horizon:
            self.tenants[request.tenant].rejected += 1
        self._stopped_waiting(request, time)

    def hung_up(self, request: Request, time: float) -> None:
        """Its client left before its answer ended (wherever it was): counted, if within
        the run, and no longer waiting."""
        if time <= self.horizon:
            self.tenants[request.tenant].hung_up += 1
        self._stopped_waiting(request, time)

    def dispatched(self, request: Request, worker: str, time: float) -> None:
        """Handed to `worker`'s queue: backlogged there too, until admitted."""
        self._where[request.request_id] = worker
        self._waiting_at_changed(request.tenant, worker, +1, time)

    def admitted(self, request: Request, time: float, worker: str | None = None) -> None:
        self._where.pop(request.request_id, None)
        self._waiting_changed(request.tenant, -1, time)
        if worker is not None:
            self._waiting_at_changed(request.tenant, worker, -1, time)

    def preempted(self, request: Request, time: float, worker: str | None = None) -> None:
        """A preempted request waits again (for its recompute), at its worker."""
        self.preemptions += 1
        self._where[request.request_id] = worker
        self._waiting_changed(request.tenant, +1, time)
        if worker is not None:
            self._waiting_at_changed(request.tenant, worker, +1, time)

    def client_waiting(self, flow: str, delta: int, time: float) -> None:
        """A closed-loop client of `flow` has `delta` more (or fewer) requests due that it
        has not sent: backlogged at the client."""
        self._waiting_changed(flow, delta, time)

    def finished(self, completion: Completion) -> None:
        self.completions.append(completion)

    def served_after_step(
        self,
        time: float,
        engine: str,
        served: Mapping[str, float],
        tenants: Iterable[str] | None = None,
    ) -> None:
        """`engine`'s cumulative service per flow after a step ending at `time`;
        `tenants`: the flows the step may have charged (default: every one in `served`).

        Steps are reported in the order they start, so one engine's step may end before
        the step of another engine reported earlier: the service series stays in time
        order (the point goes in its place, and the later cumulative values grow by it)."""
        seen = self._engine_served[engine]
        step = 0.0
        for tenant in served if tenants is None else tenants:
            value = served.get(tenant, 0.0)
            delta = value - seen.get(tenant, 0.0)
            if delta:
                seen[tenant] = value
                self._total[tenant] += delta
                step += delta
                _insert(self.service_times[tenant], self.service_values[tenant], time, delta)
        if step:
            _insert(self._delivered_times, self._delivered, time, step, cumulative=False)

    def close(self, end: float) -> None:
        self.end = end
        for name, waiting in self._waiting.items():
            waiting.close(end, self.backlog[name])
        for (name, worker), waiting in self._waiting_at.items():
            waiting.close(end, self.worker_backlog[name][worker])

    def _stopped_waiting(self, request: Request, time: float) -> None:
        """`request` left before it was admitted (if it was waiting at all)."""
        if request.request_id not in self._where:
            return
        worker = self._where.pop(request.request_id)
        self._waiting_changed(request.tenant, -1, time)
        if worker is not None:
            self._waiting_at_changed(request.tenant, worker, -1, time)

    def _waiting_changed(self, name: str, delta: int, time: float) -> None:
        self._waiting[name].change(delta, min(time, self.horizon), self.backlog[name])

    def _waiting_at_changed(self, name: str, worker: str, delta: int, time: float) -> None:
        if worker not in self.workers:
            self.workers.append(worker)
        intervals = self.worker_backlog[name][worker]
        self._waiting_at[name, worker].change(delta, min(time, self.horizon), intervals)

    # ------------------------------------------------------------------ results

    def service_at(self, tenant: str, time: float) -> float:
        times: Sequence[float] = self.service_times.get(tenant, ())
        index = bisect.bisect_right(times, time)
        return self.service_values[tenant][index - 1] if index else 0.0

    def fully_backlogged(self, tenant: str) -> Intervals:
        """The intervals in which `tenant` had a request waiting at every worker."""
        workers = self.worker_backlog.get(tenant, {})
        if not self.workers or any(worker not in workers for worker in self.workers):
            return []
        joint = workers[self.workers[0]]
        for worker in self.workers[1:]:
            joint = _intersect(joint, workers[worker])
        return joint

    def backlogged_at_some_worker(self, tenant: str) -> Intervals:
        """The intervals in which `tenant` had a request waiting at some worker (DLPM
        Definition 3.1's backlog in a pool: the module docstring)."""
        return _union(self.worker_backlog.get(tenant, {}).values())

    def max_backlogged_service_gap(self) -> float:
        """The largest gap between two flows of one band over an interval in which each
        was backlogged (demand of it waiting anywhere: the module docstring)."""
        return self._max_gap(self.backlog)

    def max_backlogged_at_some_worker_service_gap(self) -> float:
        """The largest gap between two flows of one band over an interval in which each had
        a request waiting at some worker (DLPM Definition 3.1: the backlog Theorem 5.1
        states its bound for)."""
        return self._max_gap(self._backlogs(self.backlogged_at_some_worker))

    def max_fully_backlogged_service_gap(self) -> float:
        """The largest gap between two flows of one band over an interval in which each had
        a request waiting at every worker (the premise of DLPM Theorem 5.1's proof)."""
        return self._max_gap(self._backlogs(self.fully_backlogged))

    def max_excess_over_fully_backlogged(self) -> float:
        """The largest W_g/w_g − W_f/w_f over an interval in which f had a request waiting at
        every worker and g is any other flow of its band, backlogged or not (DLPM
        Theorem 5.2, under its proof's premise)."""
        return self._max_excess(self._backlogs(self.fully_backlogged))

    def max_excess_over_backlogged_at_some_worker(self) -> float:
        """The same with f backlogged as DLPM Definition 3.1 has it: a request of it
        waiting at some worker (Theorem 5.2 as stated)."""
        return self._max_excess(self._backlogs(self.backlogged_at_some_worker))

    def _backlogs(self, of: Callable[[str], Intervals]) -> dict[str, Intervals]:
        return {tenant: of(tenant) for tenant in self.tenants}

    def _max_excess(self, backlog: Mapping[str, Intervals]) -> float:
        excess = 0.0
        for backlogged, intervals in backlog.items():
            for start, end in intervals:
                for other in self.tenants:
                    if other != backlogged and self._same_band(other, backlogged):
                        excess = max(excess, self._rise_within(other, backlogged, start, end))
        return excess

    def shares_while_backlogged(self) -> dict[str, _Backlogged]:
        """Per flow: its service while backlogged, everyone's in that time, and what it
        was entitled to then (the module docstring), from one sweep over the run."""
        delivered = self._delivered_at()
        changes = sorted(
            (time, joins, flow)
            for flow, intervals in self.backlog.items()
            for start, end in intervals
            if end > start
            for time, joins in ((start, True), (end, False))
        )
        entitlements = Entitlements(self.shares)
        before = 0.0
        for time, joins, flow in changes:  # at one time: service up to it, leaves, joins
            now = delivered(time)
            entitlements.serve(now - before)
            before = now
            if joins:
                entitlements.join(flow)
            else:
                entitlements.leave(flow)
        return {
            flow: _Backlogged(
                sum(
                    self.service_at(flow, end) - self.service_at(flow, start)
                    for start, end in spans
                ),
                sum(delivered(end) - delivered(start) for start, end in spans),
                entitlements.entitled(flow),
            )
            for flow, spans in self.backlog.items()
        }

    def _delivered_at(self) -> Callable[[float], float]:
        """time → the service delivered to everyone up to it."""
        times, totals = self._delivered_times, list(accumulate(self._delivered))

        def delivered(time: float) -> float:
            index = bisect.bisect_right(times, time)
            return totals[index - 1] if index else 0.0

        return delivered

    def _same_band(self, first: str, second: str) -> bool:
        return self.shares.band_of(first) == self.shares.band_of(second)

    def _max_gap(self, backlog: Mapping[str, Intervals]) -> float:
        ranked = sorted(
            (name for name, intervals in backlog.items() if intervals),
            key=lambda name: -_length(backlog[name]),
        )[:GAP_TENANT_LIMIT]
        gap = 0.0
        for position, first in enumerate(ranked):
            for second in ranked[position + 1 :]:
                if not self._same_band(first, second):  # bands are served by priority
                    continue
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
        """The `fairpool sim --json` summary (docs/simulator.md): the run's figures, and each
        tenant's — its flows added up, with figures per band where it has several."""
        duration = self.end
        finished = self.completions
        prompt = sum(c.request.prompt_tokens for c in finished)
        output = sum(c.output_tokens for c in finished)
        cached = sum(c.cached_tokens for c in finished)
        figures = _Figures(self)
        tenants: dict[str, Any] = {}
        for tenant, flows in sorted(figures.flows_of.items()):
            tenants[tenant] = figures.of(flows)
            bands = figures.by_band(flows)
            if len(bands) > 1:
                tenants[tenant]["bands"] = {band: figures.of(f) for band, f in bands.items()}
        weighted = [tenant["service"] / self.weights[name] for name, tenant in tenants.items()]
        worst = _worst_ratio(tenants, RATIO_BACKLOG_FRACTION * duration)
        return {
            "duration_s": round(duration, 3),
            "throughput_tokens_per_s": round((prompt + output) / duration, 3) if duration else 0,
            "output_tokens_per_s": round(output / duration, 3) if duration else 0,
            "cache_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
            "jain_index": round(jain_index(weighted), 4) if weighted else 1.0,
            "fairness_bound": fairness_bound,
            "max_backlogged_service_gap": round(self.max_backlogged_service_gap(), 3),
            "max_backlogged_at_some_worker_service_gap": round(
                self.max_backlogged_at_some_worker_service_gap(), 3
            ),
            "max_fully_backlogged_service_gap": round(self.max_fully_backlogged_service_gap(), 3),
            "worst_share_ratio": worst[1] if worst else None,
            "worst_share_ratio_tenant": worst[0] if worst else None,
            "hung_up": sum(tenant["hung_up"] for tenant in tenants.values()),
            "bands": {
                band: figures.counts(flows)
                for band, flows in figures.by_band(figures.flows).items()
            },
            "tenants": tenants,
        }


class _Figures:
    """A run's per-flow results, added up over any set of flows (a tenant's, a band's)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.flows = sorted(recorder.tenants)
        self.flows_of: dict[str, list[str]] = defaultdict(list)
        for flow in self.flows:
            self.flows_of[tenant_of(flow)].append(flow)
        self.done: dict[str, list[Completion]] = defaultdict(list)
        for completion in recorder.completions:
            self.done[completion.request.tenant].append(completion)
        self.backlogged = recorder.shares_while_backlogged()

    def by_band(self, flows: Iterable[str]) -> dict[str, list[str]]:
        """`flows` by the band each runs in, highest band first."""
        bands: dict[str, list[str]] = defaultdict(list)
        for flow in flows:
            bands[self.recorder.shares.band_of(flow)].append(flow)
        return {band: bands[band] for band in BAND_NAMES if band in bands}

    def counts(self, flows: list[str]) -> dict[str, Any]:
        """Requests and how they ended, service and TTFT: what every band reports."""
        tenants = self.recorder.tenants
        done = [c for flow in flows for c in self.done.get(flow, [])]
        ttfts = [c.first_token_at - c.request.arrival for c in done]
        return {
            "requests": sum(tenants[flow].requests for flow in flows),
            "rejected": sum(tenants[flow].rejected for flow in flows),
            "hung_up": sum(tenants[flow].hung_up for flow in flows),
            "finished": len(done),
            "service": round(sum(self.recorder._total.get(flow, 0.0) for flow in flows), 3),
            "ttft_p50": _rounded(percentile(ttfts, 0.5)),
            "ttft_p99": _rounded(percentile(ttfts, 0.99)),
        }

    def of(self, flows: list[str]) -> dict[str, Any]:
        """Everything a tenant reports (module docstring)."""
        recorder = self.recorder
        done = [c for flow in flows for c in self.done.get(flow, [])]
        latencies = [c.finished_at - c.request.arrival for c in done]
        gaps = [gap for c in done for gap in c.token_gaps]
        share = sum((self.backlogged.get(flow, _Backlogged()) for flow in flows), _Backlogged())
        fully = _union(recorder.fully_backlogged(flow) for flow in flows)
        return {
            **self.counts(flows),
            "input_tokens": sum(c.request.prompt_tokens for c in done),
            "output_tokens": sum(c.output_tokens for c in done),
            "latency_p50": _rounded(percentile(latencies, 0.5)),
            "latency_p99": _rounded(percentile(latencies, 0.99)),
            "tbt_p50": _rounded(percentile(gaps, 0.5)),
            "tbt_p99": _rounded(percentile(gaps, 0.99)),
            "backlogged_s": round(_length(_union(recorder.backlog.get(f, []) for f in flows)), 3),
            "fully_backlogged_s": round(_length(fully), 3),
            "backlogged_share": _ratio(share.served, share.delivered),
            "entitled_share": _ratio(share.entitled, share.delivered),
            "share_ratio": _ratio(share.served, share.entitled),
        }


def _worst_ratio(
    tenants: Mapping[str, Mapping[str, Any]], backlogged_s: float
) -> tuple[str, float] | None:
    """The tenant whose share ratio is farthest from 1 (by factor: 0.5 and 2 are as far),
    among those backlogged for at least `backlogged_s`; None if there is none."""
    ratios = [
        (name, tenant["share_ratio"])
        for name, tenant in tenants.items()
        if tenant["share_ratio"] is not None and tenant["backlogged_s"] >= backlogged_s
    ]
    if not ratios:
        return None
    return max(ratios, key=lambda item: abs(math.log(item[1])) if item[1] > 0 else math.inf)


def _insert(
    times: array[float], values: array[float], time: float, delta: float, cumulative: bool = True
) -> None:
    """Add `delta` at `time` to a series kept in time order: a point of its own, or the
    point already at `time`. A `cumulative` series holds running totals (the later values
    grow by `delta` too); otherwise, the increments themselves."""
    index = bisect.bisect_right(times, time)
    if index and times[index - 1] == time:
        values[index - 1] += delta
    else:
        times.insert(index, time)
        values.insert(index, (values[index - 1] if index and cumulative else 0.0) + delta)
        index += 1
    if cumulative:
        for later in range(index, len(values)):
            values[later] += delta


def _union(interval_lists: Iterable[Intervals]) -> Intervals:
    """The union of intervals, as sorted disjoint intervals."""
    merged: Intervals = []
    for start, end in sorted(span for spans in interval_lists for span in spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: Intervals) -> float:
    return sum(end - start for start, end in intervals)


def _intersect(first: Intervals, second: Intervals) -> Intervals:
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


def _ratio(part: float, whole: float) -> float | None:
    return _rounded(part / whole) if whole else None
