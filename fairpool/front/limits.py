"""Hard per-tenant limits, enforced on a request's arrival at a pool's front.

Three limits from the tenant's `TenantLimits`, each absent meaning unlimited:
requests per minute and tokens per minute over sliding 60-second windows
(`fairpool.sched.limits.SlidingWindow`), and requests in progress at once. A request that
breaks one is refused with a `Rejection` (HTTP 429) carrying its Retry-After and is counted
nowhere. An admitted request holds a `Ticket` until `settle`, which also replaces its token
estimate with the tokens the engine reported. The requests-per-minute limit is also VTC's
RPM baseline (Sheng et al., OSDI'24, §5.1: its artifact rejects a request when the client
already has `limit` requests in the trailing 60 seconds), which the simulator runs.

The limits are passed to every call rather than stored, so a reloaded tenant table applies
at once. Memory stays bounded: windows prune on every call, and tenants with nothing in
their windows and nothing in progress are forgotten.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from fairpool.api.tenant_quota import TenantLimits
from fairpool.sched.errors import require_count
from fairpool.sched.limits import SlidingWindow, WindowEntry

LimitReason = Literal[
    "requests_per_minute", "tokens_per_minute", "concurrent", "queued", "queue_timeout"
]
WINDOW_SECONDS = 60.0
#: The limits whose refusal holds for every request of the tenant until its Retry-After:
#: those a request's own size does not decide, which `TenantLimiter.check` checks before
#: the request is read. A tokens-per-minute refusal concerns its request alone: a smaller
#: one may fit, and one whose tokens alone exceed the limit must not lock its tenant out.
TENANT_WIDE: frozenset[LimitReason] = frozenset({"requests_per_minute", "concurrent"})
#: Retry-After for the concurrency limit: when a request ends is unknown, so a short wait.
CONCURRENT_RETRY_AFTER = 1.0


class Rejection(Exception):
    """A request refused by a limit: `reason` names the limit, `retry_after` (seconds, > 0)
    is when to try again, `message` is human text naming the limit and its value."""

    def __init__(self, reason: LimitReason, retry_after: float, message: str) -> None:
        if not retry_after > 0:
            raise ValueError(f"retry_after must be > 0, got {retry_after!r}")
        super().__init__(message)
        self.reason: LimitReason = reason
        self.retry_after = retry_after
        self.message = message


def requests_rejection(limit: int, wait: float) -> Rejection:
    return Rejection(
        "requests_per_minute",
        wait,
        f"rate limit of {limit} requests per minute reached; retry in {wait:.1f} s",
    )


def tokens_rejection(limit: int, wait: float) -> Rejection:
    return Rejection(
        "tokens_per_minute",
        wait,
        f"rate limit of {limit} tokens per minute reached; retry in {wait:.1f} s",
    )


def oversized_rejection(limit: int, tokens: int, window: float = WINDOW_SECONDS) -> Rejection:
    """A request whose tokens alone exceed the tokens-per-minute limit."""
    return Rejection(
        "tokens_per_minute",
        window,
        f"the request's {tokens} estimated tokens exceed the limit of {limit} tokens per "
        "minute on their own",
    )


def concurrent_rejection(limit: int) -> Rejection:
    return Rejection(
        "concurrent",
        CONCURRENT_RETRY_AFTER,
        f"limit of {limit} concurrent requests reached; retry when one has finished",
    )


@dataclass(eq=False)
class Ticket:
    """An admitted request's hold on its tenant's limits, released by `settle`."""

    tenant: str
    estimated_tokens: int
    tokens_entry: WindowEntry | None = field(repr=False)  # the in-memory limiter's
    settled: bool = False


def divided_limits(limits: TenantLimits, parts: int) -> TenantLimits:
    """`limits` for one of `parts` gateways that count apart, so that together they stay
    near the whole: each count divided (rounded down, at least 1)."""
    if parts == 1:
        return limits
    update = {
        name: max(1, value // parts)
        for name in ("requests_per_minute", "tokens_per_minute", "concurrent", "queued")
        if (value := getattr(limits, name)) is not None
    }
    return limits.model_copy(update=update)


class Limiter(Protocol):
    """What a pool's front needs of hard limits: `TenantLimiter` in memory, or a limiter
    whose counts the gateway's replicas share."""

    def admit(
        self, tenant: str, limits: TenantLimits, estimated_tokens: int, request_id: str = ""
    ) -> Ticket: ...

    def check(self, tenant: str, limits: TenantLimits) -> None: ...

    def settle(self, ticket: Ticket, actual_tokens: int | None = None) -> None: ...

    def state(self, tenant: str) -> dict[str, float]: ...


@dataclass(eq=False)
class _Usage:
    """One tenant's counted requests, tokens and requests in progress."""

    requests: SlidingWindow
    tokens: SlidingWindow
    concurrent: int = 0
    touched: float = 0.0  # when something was last added to its windows


class TenantLimiter:
    """Requests and tokens per minute and concurrency, per tenant."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, window: float = WINDOW_SECONDS
    ) -> None:
        self._clock = clock
        self._window = window
        # Least recently touched first, so forgetting idle tenants is a scan of the front.
        self._usage: OrderedDict[str, _Usage] = OrderedDict()

    def admit(
        self, tenant: str, limits: TenantLimits, estimated_tokens: int, request_id: str = ""
    ) -> Ticket:
        """Count a request of `tenant` under `limits`, or raise `Rejection` counting nothing
        (`request_id` names it, for limiters that keep requests apart; not this one).

        When several limits refuse it, the one with the longest Retry-After is reported:
        retrying any earlier would be refused again.
        """
        require_count("estimated_tokens", estimated_tokens)
        now = self._clock()
        self._forget_idle(now)
        usage = self._usage.get(tenant) or self._new_usage()
        refusals = [
            refusal
            for refusal in (
                self._check_requests(usage, limits.requests_per_minute, now),
                self._check_tokens(usage, limits.tokens_per_minute, estimated_tokens, now),
                self._check_concurrent(usage, limits.concurrent),
            )
            if refusal is not None
        ]
        if refusals:
            raise max(refusals, key=lambda refusal: refusal.retry_after)
        return self._count(tenant, usage, estimated_tokens, now)

    def check(self, tenant: str, limits: TenantLimits) -> None:
        """Raise the `Rejection` that `admit` would for the request-rate or concurrency
        limit (`TENANT_WIDE`), counting nothing: a front end checks it before it pays for
        reading and parsing a request whose size (for the token limit) it does not know."""
        now = self._clock()
        usage = self._usage.get(tenant)
        if usage is None:
            return
        refusals = [
            refusal
            for refusal in (
                self._check_requests(usage, limits.requests_per_minute, now),
                self._check_concurrent(usage, limits.concurrent),
            )
            if refusal is not None
        ]
        if refusals:
            raise max(refusals, key=lambda refusal: refusal.retry_after)

    def settle(self, ticket: Ticket, actual_tokens: int | None = None) -> None:
        """The request is over: it no longer counts as in progress and, with
        `actual_tokens`, its tokens-per-minute entry holds those instead of the estimate.
        A second call does nothing."""
        if ticket.settled:
            return
        ticket.settled = True
        now = self._clock()
        usage = self._usage.get(ticket.tenant)
        if usage is not None:  # always: a tenant with a request in progress is kept
            usage.concurrent -= 1
            if actual_tokens is not None and ticket.tokens_entry is not None:
                tokens = require_count("actual_tokens", actual_tokens)
                usage.tokens.amend(ticket.tokens_entry, tokens, now)
            if self._is_idle(usage, now):
                del self._usage[ticket.tenant]
        self._forget_idle(now)

    def state(self, tenant: str) -> dict[str, float]:
        """Requests and tokens in `tenant`'s current window, and its requests in progress."""
        now = self._clock()
        self._forget_idle(now)
        usage = self._usage.get(tenant)
        if usage is None:
            return {"requests": 0.0, "tokens": 0.0, "concurrent": 0.0}
        return {
            "requests": float(usage.requests.total(now)),
            "tokens": float(usage.tokens.total(now)),
            "concurrent": float(usage.concurrent),
        }

    def tenants(self) -> list[str]:
        """The tenants the limiter holds state for (recently active or in progress)."""
        self._forget_idle(self._clock())
        return list(self._usage)

    # ------------------------------------------------------------------ checks

    def _check_requests(self, usage: _Usage, limit: int | None, now: float) -> Rejection | None:
        if limit is None:
            return None
        wait = usage.requests.time_until_fits(now, 1, limit)
        if not wait:
            return None
        return requests_rejection(limit, wait)

    def _check_tokens(
        self, usage: _Usage, limit: int | None, tokens: int, now: float
    ) -> Rejection | None:
        if limit is None:
            return None
        wait = usage.tokens.time_until_fits(now, tokens, limit)
        if wait is None:
            return oversized_rejection(limit, tokens, self._window)
        if not wait:
            return None
        return tokens_rejection(limit, wait)

    def _check_concurrent(self, usage: _Usage, limit: int | None) -> Rejection | None:
        if limit is None or usage.concurrent < limit:
            return None
        return concurrent_rejection(limit)

    # ------------------------------------------------------------------ bookkeeping

    def _new_usage(self) -> _Usage:
        return _Usage(SlidingWindow(self._window), SlidingWindow(self._window))

    def _is_idle(self, usage: _Usage, now: float) -> bool:
        return not usage.concurrent and usage.requests.is_empty(now) and usage.tokens.is_empty(now)

    def _count(self, tenant: str, usage: _Usage, tokens: int, now: float) -> Ticket:
        usage.requests.add(now)
        entry = usage.tokens.add(now, tokens)
        usage.concurrent += 1
        usage.touched = now
        self._usage[tenant] = usage
        self._usage.move_to_end(tenant)
        return Ticket(tenant, tokens, entry)

    def _forget_idle(self, now: float) -> None:
        """Drop tenants whose windows have emptied and that have nothing in progress.

        Everything in a tenant's windows was added by `touched`, so once `touched` is a
        window old they are empty. A tenant still in progress is looked at again a window
        later, which keeps the scan to the front of the order.
        """
        cutoff = now - self._window
        while self._usage:
            tenant, usage = next(iter(self._usage.items()))
            if usage.touched > cutoff:
                break
            if usage.concurrent:
                usage.touched = now
                self._usage.move_to_end(tenant)
            else:
                del self._usage[tenant]
