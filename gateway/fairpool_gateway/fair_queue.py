"""The gateway-side fair queue of one pool: VTC across tenants in front of the workers.

When every worker of the pool is saturated, requests wait here, each tenant's in arrival
order, and are released in VTC order across tenants as capacity frees — so fairness holds
even in front of stock engines. The order and the charging are the core VTC policy's
(`make_policy("vtc")`, Sheng et al., OSDI'24, Alg. 2), driven as an engine drives it: a
request is `add`ed on arrival and `admit`ted when released, paying its prompt as prefill
(the gateway does not know the engine's cache hit yet); output is charged as it streams and
corrected to the engine's reported usage at `finish`. Requests admitted at once go through
the policy too, so every tenant's counter reflects all of its service, and VTC's counter
lift for tenants that join applies unchanged.

Capacity contract: a released request reaches a worker only when its task next runs, so
`has_capacity` must count what this queue has admitted and not yet finished (`in_flight()`),
or it would see room for everyone still waiting and release them all at once.

All methods must be called from the event loop's thread.

Outcomes of `enter`: it returns (the request is admitted; the caller must call `finish`),
or it raises (`Rejection`, or `CancelledError` when the awaiting task was cancelled) and
the request is nowhere: neither queued nor in flight nor charged. A waiter released by
`wake` whose task is cancelled before it resumes is undone (its charge refunded, its place
given to the next waiter), since its caller never learned it was admitted. Release and
timeout both run on the loop, so whichever comes first wins and the other does nothing.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fairpool.sched import (
    ConfigError,
    CostModel,
    EngineSnapshot,
    Request,
    TenantWeights,
    make_policy,
)
from fairpool.sched.errors import require_count
from fairpool_gateway.limits import Rejection

#: Retry-After for a request refused by the queue limit or timed out in the queue: when
#: capacity frees is unknown, so a short wait.
QUEUE_RETRY_AFTER = 1.0


@dataclass(eq=False)
class _Waiter:
    """A queued request and the future its `enter` awaits."""

    request: Request
    future: asyncio.Future[None]
    since: float
    timer: asyncio.TimerHandle | None = None
    released: bool = False


@dataclass
class _Charged:
    """What an admitted request has been charged, in tokens, so `finish` can correct it."""

    prompt_tokens: int
    output_tokens: int = 0


@dataclass
class _Wake:
    """Re-entrancy guard of `wake`: a call during a pass asks the pass to look again."""

    running: bool = False
    again: bool = False


class FairQueue:
    """Per-tenant waiting queues of one pool, released in VTC order while there is capacity."""

    def __init__(
        self,
        has_capacity: Callable[[], bool],
        cost: CostModel,
        weights: TenantWeights | Mapping[str, float],
        clock: Callable[[], float] = time.monotonic,
        policy: str = "vtc",
    ) -> None:
        self._has_capacity = has_capacity
        self._cost = cost
        self._clock = clock
        # `fcfs` (arrival order, tenants ignored) is there for comparisons: fairness off.
        self._policy = make_policy(policy, cost=cost, weights=_weight_table(weights))
        # VTC reads no engine state; memory is unlimited so nothing is held back for it.
        self._view = EngineSnapshot(memory_tokens=sys.maxsize)
        self._waiters: dict[str, _Waiter] = {}
        self._charged: dict[str, _Charged] = {}
        self._wake = _Wake()

    # ------------------------------------------------------------------ requests

    async def enter(
        self,
        request_id: str,
        tenant: str,
        input_tokens: int,
        max_tokens: int,
        queued_limit: int | None,
        timeout: float,
    ) -> None:
        """Wait until the pool has room for this request, in fair order across tenants.

        Admitted at once when nobody is queued and there is capacity. Otherwise queued:
        raises `Rejection("queued")` at once if the tenant already has `queued_limit`
        requests queued (0: never queue), `Rejection("queue_timeout")` after `timeout`
        seconds (math.inf: no timeout) without a release.
        """
        request = Request(request_id, tenant, input_tokens, max_tokens)
        self._require_unknown(request_id)
        if math.isnan(timeout) or timeout < 0:
            raise ConfigError("timeout", f"must be >= 0, got {timeout!r}")
        if not self._policy.waiting_count and self._has_capacity():
            self._policy.add(request)
            self._admit(request)
            return
        self._refuse_beyond_queue_limit(tenant, queued_limit)
        waiter = self._enqueue(request, timeout)
        self.wake()
        try:
            await waiter.future
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        finally:
            _cancel_timer(waiter)

    def wake(self) -> None:
        """Capacity may have freed: release queued requests in VTC order while
        `has_capacity()` holds. Safe to call at any time, from within a pass too."""
        if self._wake.running:
            self._wake.again = True
            return
        self._wake.running = True
        try:
            self._wake.again = True
            while self._wake.again:
                self._wake.again = False
                self._release_while_capacity()
        finally:
            self._wake.running = False

    def record_output(self, request_id: str, tokens: int) -> None:
        """`tokens` more output tokens streamed for an admitted request (charged now).
        Requests the queue does not hold as admitted (finished, undone) are ignored."""
        require_count("tokens", tokens)
        charged = self._charged.get(request_id)
        if charged is None:
            return
        self._policy.record_output(request_id, tokens)
        charged.output_tokens += tokens

    def finish(
        self,
        request_id: str,
        prompt_tokens: int | None = None,
        cached_tokens: int = 0,
        completion_tokens: int | None = None,
    ) -> None:
        """The request is over (done, failed or cancelled).

        With usage, its charge is corrected so that the tenant paid exactly
        `cost.prefill(prompt_tokens, cached_tokens)` and `cost.decode(completion_tokens)`
        for it (each part only when given); without, what was charged stays. A request
        still queued is withdrawn and its `enter` raises `CancelledError`. Unknown or
        already finished requests are ignored. Capacity may have freed, so it wakes.
        """
        waiter = self._waiters.get(request_id)
        if waiter is not None:
            self._withdraw(waiter)
            waiter.future.cancel()
            return
        charged = self._charged.pop(request_id, None)
        if charged is None:
            return
        correction = self._correction(charged, prompt_tokens, cached_tokens, completion_tokens)
        if correction:
            self._policy.correct_charge(request_id, correction)
        self._policy.finish(request_id)
        self.wake()

    # ------------------------------------------------------------------ configuration and state

    def set_weights(self, weights: TenantWeights | Mapping[str, float]) -> None:
        """New tenant weights (a reloaded tenant table); counters keep their values."""
        self._policy.weights = _weight_table(weights)

    def queued(self, tenant: str | None = None) -> int:
        """Requests waiting, of `tenant` or of everyone."""
        if tenant is None:
            return self._policy.waiting_count
        return self._policy.tenant_waiting(tenant)

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
        if request_id in self._waiters or request_id in self._charged:
            raise ConfigError("request_id", f"{request_id!r} is already queued or in flight")

    def _refuse_beyond_queue_limit(self, tenant: str, queued_limit: int | None) -> None:
        if queued_limit is None or self._policy.tenant_waiting(tenant) < queued_limit:
            return
        if queued_limit == 0:
            message = "every worker is busy and this tenant may not queue (limit 0)"
        else:
            message = f"limit of {queued_limit} queued requests reached; every worker is busy"
        raise Rejection("queued", QUEUE_RETRY_AFTER, message)

    def _enqueue(self, request: Request, timeout: float) -> _Waiter:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(request, loop.create_future(), since=self._clock())
        self._policy.add(request)
        self._waiters[request.request_id] = waiter
        if math.isfinite(timeout):
            waiter.timer = loop.call_later(timeout, self._expire, waiter, timeout)
        return waiter

    def _release_while_capacity(self) -> None:
        while self._policy.waiting_count and self._has_capacity():
            request = self._policy.next_request(self._view)
            if request is None:  # VTC always offers one while any waits; defensive
                return
            waiter = self._waiters[request.request_id]
            if waiter.future.done():  # its task was cancelled and has not cleaned up yet
                self._withdraw(waiter)
                continue
            self._release(waiter)

    def _release(self, waiter: _Waiter) -> None:
        del self._waiters[waiter.request.request_id]
        _cancel_timer(waiter)
        self._admit(waiter.request)
        waiter.released = True
        waiter.future.set_result(None)

    def _admit(self, request: Request) -> None:
        self._policy.admit(request.request_id, cached_tokens=0)
        self._charged[request.request_id] = _Charged(request.prompt_tokens)

    def _expire(self, waiter: _Waiter, timeout: float) -> None:
        if self._waiters.get(waiter.request.request_id) is not waiter:
            return  # released or withdrawn first
        self._withdraw(waiter)
        if not waiter.future.done():
            message = f"no worker became free within the queue timeout of {timeout:g} s"
            waiter.future.set_exception(Rejection("queue_timeout", QUEUE_RETRY_AFTER, message))

    def _abandon(self, waiter: _Waiter) -> None:
        """The task awaiting `waiter` was cancelled: leave no trace of the request."""
        request_id = waiter.request.request_id
        if self._waiters.get(request_id) is waiter:
            self._withdraw(waiter)
        elif waiter.released and request_id in self._charged:
            self._undo_admission(request_id)
        if waiter.future.done() and not waiter.future.cancelled():
            waiter.future.exception()  # mark a timeout's Rejection as seen

    def _withdraw(self, waiter: _Waiter) -> None:
        """Take a queued request out of the queue, uncharged."""
        del self._waiters[waiter.request.request_id]
        _cancel_timer(waiter)
        self._policy.remove(waiter.request.request_id)

    def _undo_admission(self, request_id: str) -> None:
        """Refund a released request whose caller never resumed, and pass its place on."""
        charged = self._charged.pop(request_id)
        refund = self._cost.prefill(charged.prompt_tokens, 0) + self._cost.decode(
            charged.output_tokens
        )
        self._policy.correct_charge(request_id, -refund)
        self._policy.finish(request_id)
        self.wake()

    def _correction(
        self,
        charged: _Charged,
        prompt_tokens: int | None,
        cached_tokens: int,
        completion_tokens: int | None,
    ) -> float:
        """Service to add (negative: refund) so the charge matches the reported usage."""
        correction = 0.0
        if prompt_tokens is not None:
            require_count("prompt_tokens", prompt_tokens)
            require_count("cached_tokens", cached_tokens)
            correction += self._cost.prefill(prompt_tokens, cached_tokens)
            correction -= self._cost.prefill(charged.prompt_tokens, 0)
        if completion_tokens is not None:
            require_count("completion_tokens", completion_tokens)
            correction += self._cost.decode(completion_tokens)
            correction -= self._cost.decode(charged.output_tokens)
        return correction

    def _longest_waits(self) -> dict[str, float]:
        now = self._clock()
        waits: dict[str, float] = {}
        for waiter in self._waiters.values():
            tenant = waiter.request.tenant
            waits[tenant] = max(waits.get(tenant, 0.0), now - waiter.since)
        return waits


def _weight_table(weights: TenantWeights | Mapping[str, float]) -> TenantWeights:
    return weights if isinstance(weights, TenantWeights) else TenantWeights(weights)


def _cancel_timer(waiter: _Waiter) -> None:
    if waiter.timer is not None:
        waiter.timer.cancel()
        waiter.timer = None
