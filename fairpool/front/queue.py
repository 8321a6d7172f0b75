"""A pool's fair queue: VTC across tenants in front of the workers.

When every worker of the pool is saturated, requests wait here, each tenant's in arrival
order, and are released in VTC order across tenants as capacity frees — so fairness holds
even in front of stock engines. The order and the charging are the core VTC policy's
(`make_policy("vtc")`, Sheng et al., OSDI'24, Alg. 2), driven as an engine drives it: a
request is `add`ed on arrival and `admit`ted when released, paying its prompt as prefill
(the front does not know the engine's cache hit yet); output is charged as it is observed
and corrected to the engine's reported usage at `finish`. Requests admitted at once go
through the policy too, so every tenant's counter reflects all of its service, and VTC's
counter lift for tenants that join applies unchanged.

The queue decides order only; when to release (capacity), timeouts and waking waiters
belong to its owner, the pool's front (`fairpool.front.lifecycle`). It has no clock of its
own beyond the one that dates waits for `state()`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping

from fairpool.front.limits import Rejection
from fairpool.sched import CostModel, EngineSnapshot, Request, TenantWeights, make_policy
from fairpool.sched.cost import Tokens
from fairpool.sched.errors import ConfigError, require_count
from fairpool.sched.tree import Shares

#: Retry-After for a request refused by the queue limit or timed out in the queue: when
#: capacity frees is unknown, so a short wait.
QUEUE_RETRY_AFTER = 1.0


class FairQueue:
    """Per-tenant waiting queues of one pool, released in VTC (or FCFS) order."""

    def __init__(
        self,
        cost: CostModel,
        weights: TenantWeights | Mapping[str, float],
        policy: str = "vtc",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cost = cost
        self._clock = clock
        # `fcfs` (arrival order, tenants ignored) is there for comparisons: fairness off.
        self._policy = make_policy(
            policy, cost=cost, weights=_weight_table(weights), share_memory=False
        )
        # VTC reads no engine state; memory is unlimited so nothing is held back for it.
        self._view = EngineSnapshot(memory_tokens=sys.maxsize)
        self._since: dict[str, float] = {}  # queued request → when it was queued
        self._charged: dict[str, Tokens] = {}  # admitted request → what it was charged

    # ------------------------------------------------------------------ requests

    def admit_now(self, request: Request) -> None:
        """Admit `request` without queueing (the caller saw room and nobody waiting)."""
        self._require_unknown(request.request_id)
        self._policy.add(request)
        self._admit(request)

    def enqueue(self, request: Request, queued_limit: int | None) -> None:
        """Queue `request`; `Rejection("queued")` at once if its tenant already has
        `queued_limit` requests queued (0: the tenant may never queue)."""
        self._require_unknown(request.request_id)
        if queued_limit is not None and self._policy.tenant_waiting(request.tenant) >= queued_limit:
            if queued_limit == 0:
                message = "every worker is busy and this tenant may not queue (limit 0)"
            else:
                message = f"limit of {queued_limit} queued requests reached; every worker is busy"
            raise Rejection("queued", QUEUE_RETRY_AFTER, message)
        self._policy.add(request)
        self._since[request.request_id] = self._clock()

    def next_tenant(self) -> str | None:
        """The tenant whose request `release()` would admit next (None if nobody waits)."""
        if not self._policy.waiting_count:
            return None
        request = self._policy.next_request(self._view)
        return None if request is None else request.tenant

    def release(self, tenant: str | None = None) -> str | None:
        """Admit the queued request that is next in fair order — of `tenant` only, if
        given — and return its id (None if nobody waits). It is charged its prompt now,
        as `admit_now` charges."""
        if tenant is not None:
            request = self._policy.head_of(tenant)
        elif self._policy.waiting_count:
            request = self._policy.next_request(self._view)
        else:
            return None
        if request is None:  # VTC and FCFS offer one while any waits; defensive
            return None
        del self._since[request.request_id]
        self._admit(request)
        return request.request_id

    def withdraw(self, request_id: str) -> bool:
        """Take a queued request out, uncharged; False if it is not queued."""
        if self._since.pop(request_id, None) is None:
            return False
        self._policy.remove(request_id)
        return True

    def record_output(self, request_id: str, tokens: int) -> None:
        """`tokens` more output tokens observed for an admitted request (charged now).
        Requests the queue does not hold as admitted are ignored."""
        require_count("tokens", tokens)
        charged = self._charged.get(request_id)
        if charged is None:
            return
        self._policy.record_output(request_id, tokens)
        self._charged[request_id] = Tokens(charged.extend, (charged.output or 0) + tokens)

    def charge_elsewhere(self, tenant: str, service: float) -> None:
        """Another replica's queue served `tenant` `service` (`fairpool.front.peers`): it
        counts in this queue's order too."""
        self._policy.charge_elsewhere(tenant, service)

    def wait_with(
        self,
        counters: Callable[[], Iterable[float]],
        queued: Callable[[str], bool] = lambda tenant: False,
    ) -> None:
        """`counters` gives the counters of the tenants waiting at the other replicas: a
        tenant that starts waiting here is lifted to the smallest of all (VTC's lift) —
        unless `queued` says it waits at another replica: it has been backlogged all along."""
        self._policy.waiting_elsewhere = counters
        self._policy.queued_elsewhere = queued

    def finish(self, request_id: str, served: Tokens) -> None:
        """An admitted request is over: its charge is corrected to `served` (a part left
        None stays as charged; `Tokens(0, 0)` refunds everything, for a request no engine
        ever served). Requests the queue does not hold as admitted are ignored."""
        charged = self._charged.pop(request_id, None)
        if charged is None:
            return
        correction = self._cost.correction(charged, served)
        if correction:
            self._policy.correct_charge(request_id, correction)
        self._policy.finish(request_id)

    # ------------------------------------------------------------------ configuration and state

    def set_weights(self, weights: TenantWeights | Mapping[str, float]) -> None:
        """New tenant weights (a reloaded tenant table); counters keep their values."""
        self._policy.weights = _weight_table(weights)

    def is_queued(self, request_id: str) -> bool:
        return request_id in self._since

    def queued(self, tenant: str | None = None) -> int:
        """Requests waiting, of `tenant` or of everyone."""
        if tenant is None:
            return self._policy.waiting_count
        return self._policy.tenant_waiting(tenant)

    @property
    def weights(self) -> Shares:
        """The tenants' weights, with their bands and groups."""
        return self._policy.weights

    @property
    def weighs_tenants(self) -> bool:
        """Whether its order follows the tenants' weighted service (vtc; fcfs does not)."""
        return self._policy.weighs_tenants

    def queued_tenants(self) -> list[str]:
        return self._policy.waiting_tenants()

    def counter(self, tenant: str) -> float:
        """`tenant`'s VTC counter: its weighted service so far (0 under fcfs)."""
        return self._policy.tenant_state().get(tenant, 0.0)

    def below_share(self, tenant: str) -> float | None:
        """How far below its weighted share of the requests in flight `tenant` would be
        with one more (in requests; None if it would be at or above it). Tenants with a
        request queued or in flight in its band share, by the fair order's tree
        (`Shares.parts`); between bands the order's strict priority and minimum shares
        decide, wherever the requests wait."""
        policy = self._policy
        band = policy.weights.band_of(tenant)
        in_band = {f for f in policy.active_tenants() if policy.weights.band_of(f) == band}
        part = policy.weights.parts(in_band | {tenant})[tenant]
        share = (sum(policy.tenant_running(f) for f in in_band) + 1) * part
        below = share - (policy.tenant_running(tenant) + 1)
        return below if below >= 0 else None

    def in_flight(self, tenant: str | None = None) -> int:
        """Requests admitted and not finished, of `tenant` or of everyone."""
        if tenant is None:
            return self._policy.running_count
        return self._policy.tenant_running(tenant)

    def state(self) -> dict[str, dict[str, float]]:
        """Per tenant: VTC counter, service received, queued and in-flight requests, and
        how long its oldest queued request has waited (seconds)."""
        counters = self._policy.tenant_state()
        served = self._policy.served
        waits = self._longest_waits()
        tenants = set(counters) | set(served) | self._policy.active_tenants()
        return {
            tenant: {
                "counter": counters.get(tenant, 0.0),
                "served": served.get(tenant, 0.0),
                "queued": float(self._policy.tenant_waiting(tenant)),
                "in_flight": float(self._policy.tenant_running(tenant)),
                "longest_wait": waits.get(tenant, 0.0),
            }
            for tenant in sorted(tenants)
        }

    # ------------------------------------------------------------------ internals

    def _require_unknown(self, request_id: str) -> None:
        if request_id in self._since or request_id in self._charged:
            raise ConfigError("request_id", f"{request_id!r} is already queued or in flight")

    def _admit(self, request: Request) -> None:
        self._policy.admit(request.request_id, cached_tokens=0)
        self._charged[request.request_id] = Tokens(extend=request.prompt_tokens, output=0)

    def _longest_waits(self) -> dict[str, float]:
        now = self._clock()
        waits: dict[str, float] = {}
        for entry in self._policy.waiting():
            tenant = entry.request.tenant
            since = self._since[entry.request.request_id]
            waits[tenant] = max(waits.get(tenant, 0.0), now - since)
        return waits


def _weight_table(weights: TenantWeights | Mapping[str, float]) -> TenantWeights:
    return weights if isinstance(weights, TenantWeights) else TenantWeights(weights)
