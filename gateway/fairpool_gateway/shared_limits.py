"""Hard limits shared by every replica of the gateway, kept in Redis (or Valkey).

One gateway keeps each tenant's requests and tokens per minute and its requests in
progress in memory (`fairpool.front.TenantLimiter`); N replicas doing so would let a tenant
through N times its limits. With `sharedState` configured, every replica counts in one
Redis server instead, through one Lua script (`shared_limits.lua`) that runs atomically on
the server, one round trip per request phase:

- **reserve**, before the request enters the pool's front: every limit checked and, if all
  pass, the request counted (its reserved tokens — prompt estimate plus output limit — in
  the current second's bucket of the 60-second window, and a lease on a concurrency slot).
  Replicas together therefore never admit past a limit: the check and the count are one
  step on the server, and what a request may add is bounded before it is counted.
- **settle**, when the front settles the request: the lease released and the tokens
  corrected to what the engine reported. It needs no answer, so the request does not
  wait for it, and the settlements of one turn of the event loop go in one pipeline.
- **renew**, every `leaseSeconds / 3` for the requests this replica still serves: leases
  that nobody renews (a replica killed mid-stream) expire and free their slots.
- **serve**, with the settlement: the service the request was charged, added to the
  tenant's fleet-wide record (in all, and per second of the window), which every replica
  reads for its `fairpool_gateway_fleet_*` metrics — one dashboard for the fleet.

The windows are 60 one-second buckets, so a request leaves the window up to a second
earlier than in the in-memory limiter, which slides by the exact arrival time.

What the server holds is not trusted (docs/gateway.md, "Shared state is not trusted"):
the script deletes the entries no replica writes before they count (a bucket of a second
to come, a count that is not a whole number, a lease longer than a lease lasts, a key of
another type) and says how many; its answers, the fleet's record and the usage read for
the admin API are checked here (`fairpool_gateway.heard`), and what fails is ignored,
logged and counted, never a tenant's refusal or a replica's fallback.

When Redis cannot be reached (an error, or no answer within `timeoutSeconds`, 0.25 s by
default), the replica
falls back to its in-memory limiter with every limit divided by `replicas` — the replicas
together then stay near the limits — and says so: the metric
`fairpool_gateway_shared_state_up` is 0, a warning is logged, `/readyz` names it. No
request fails because of it. Every second it tries again, and returns to shared counting
by itself. Requests admitted during the outage are settled locally; requests admitted by
Redis and settled during the outage keep their lease until it expires.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import redis.asyncio as redis
from redis.exceptions import RedisError, ResponseError

from fairpool.api.gateway_config import SharedStateSpec
from fairpool.api.tenant_quota import TenantLimits
from fairpool.front import FrontRequest, Rejection, TenantLimiter, Ticket
from fairpool.front.limits import (
    TENANT_WIDE,
    WINDOW_SECONDS,
    concurrent_rejection,
    divided_limits,
    oversized_rejection,
    requests_rejection,
    tokens_rejection,
)
from fairpool.runtime import cancel_and_wait, wait_at_most
from fairpool_gateway import heard
from fairpool_gateway.heard import Ignored, Untrusted

log = logging.getLogger("fairpool.gateway")

#: Adds one command to a pipeline (a script's call is a coroutine to await).
Queued = Callable[[Any], Any]

SCRIPT = resources.files("fairpool_gateway").joinpath("shared_limits.lua").read_text()
#: Seconds between two attempts to reach Redis again while it is down.
RETRY_INTERVAL = 1.0
#: The most tokens one request counts for in the server: a reservation (prompt estimate
#: plus the client's output limit, which nothing bounds) is counted as at most this, so
#: that the script's whole-number counts never overflow. Far above any context: a request
#: that large is refused by any tokens-per-minute limit below it.
MOST_RESERVED_TOKENS = 2**40
#: The most a bucket or a total of the server's records holds, counts and service alike
#: (the scripts' bound too): a double holds every whole number up to it exactly.
MOST_RECORDED = 2.0**53


@dataclass(eq=False)
class SharedTicket(Ticket):
    """A request counted in Redis: which second's bucket holds its tokens."""

    request_id: str = ""
    second: int = 0


@dataclass(frozen=True)
class FleetService:
    """A tenant's service in a pool from every replica: in all, and in the last window."""

    total: float
    recent: float


@dataclass
class _Down:
    since: float
    reason: str


@dataclass
class SharedLimiter:
    """The front's limiter when the replicas share state (see the module's docstring)."""

    spec: SharedStateSpec
    password: str | None = None
    local: TenantLimiter = field(default_factory=TenantLimiter)
    window: int = int(WINDOW_SECONDS)  # seconds; shorter only in tests, as TenantLimiter's
    #: Where what is read from the server and ignored is logged and counted.
    ignored: Ignored = field(default_factory=Ignored)

    def __post_init__(self) -> None:
        self._client: Any = redis.Redis.from_url(
            self.spec.url,
            username=self.spec.username,
            password=self.password,
            socket_timeout=self.spec.timeout_seconds,
            socket_connect_timeout=self.spec.timeout_seconds,
            retry_on_timeout=False,
        )
        self._script = self._client.register_script(SCRIPT)
        self._reserved: dict[str, SharedTicket] = {}  # request id → ticket, until admit
        self._held: dict[str, SharedTicket] = {}  # admitted, not settled: their leases
        self._refused: dict[str, tuple[float, Rejection]] = {}  # tenant → until, why
        self._down: _Down | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._outgoing: list[Queued] = []  # commands to send with this turn's others
        self._renewer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # set when the server goes away

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Begin renewing leases (and, while Redis is down, trying to reach it)."""
        self._renewer = asyncio.create_task(self._renew_forever())

    async def close(self) -> None:
        if self._renewer is not None:
            await cancel_and_wait([self._renewer])
        await self.sent()
        await self._client.aclose()

    async def sent(self) -> None:
        """Wait until every settlement handed to Redis so far has been applied (or failed)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def prefix(self) -> str:
        """The first part of every key and channel (`keyPrefix`)."""
        return self.spec.key_prefix

    @property
    def client(self) -> Any:
        """The server's client (redis-py asyncio), for others sharing this connection."""
        return self._client

    @property
    def up(self) -> bool:
        """Whether limits are counted in Redis now (False: the local fallback)."""
        return self._down is None

    def status(self) -> dict[str, object]:
        """What `/readyz` and the admin API show of the shared state."""
        if self._down is None:
            return {"sharedState": "up"}
        return {
            "sharedState": "down",
            "since": round(time.monotonic() - self._down.since, 1),
            "reason": self._down.reason,
            "fallback": f"local limits divided by {self.spec.replicas}",
        }

    # ------------------------------------------------------------------ reserve

    async def reserve(self, request: FrontRequest) -> None:
        """Count `request` in Redis, or raise the `Rejection` a limit gives. While Redis is
        down this counts nothing: `admit` then uses the local fallback."""
        if self._down is not None:
            return
        limits = request.limits
        tokens = min(request.reserved_tokens, MOST_RESERVED_TOKENS)
        arguments: list[str | int | float] = [
            "reserve",
            request.request_id,
            tokens,
            _limit(limits.requests_per_minute),
            _limit(limits.tokens_per_minute),
            _limit(limits.concurrent),
            self.spec.lease_seconds,
            self.window,
        ]
        try:
            answer = await self._script(keys=self._keys(request.tenant), args=arguments)
        except (TimeoutError, RedisError, OSError) as error:
            self._went_down(error)
            return
        try:
            admitted, second, rejection = self._answer(answer, limits, request.reserved_tokens)
        except Untrusted as error:  # counted by neither: the local fallback admits it
            self.ignored.untrusted(error)
            return
        if admitted:
            ticket = SharedTicket(
                request.tenant, tokens, None, request_id=request.request_id, second=second
            )
            self._reserved[request.request_id] = ticket
            return
        assert rejection is not None
        if rejection.reason in TENANT_WIDE:  # the tenant's next requests would be refused too
            self._refused[request.tenant] = (time.monotonic() + rejection.retry_after, rejection)
        raise rejection

    def _answer(
        self, answer: Any, limits: TenantLimits, tokens: int
    ) -> tuple[bool, int, Rejection | None]:
        """The reserve script's answer, checked: (admitted, the second its tokens are
        counted in, or the refusal), its wait bounded by the window; `Untrusted` if it is
        not one the script gives. Also tells `ignored` of the forged entries it removed."""
        if not isinstance(answer, list) or len(answer) not in (3, 4):
            raise Untrusted("limits", f"the script answered {answer!r:.80}")
        forged = heard.whole("limits", "forged entries", answer[-1], 0, 2**31)
        self.ignored("limits", f"the script removed {forged} forged entries", forged)
        if answer[0] == 1 and len(answer) == 3:
            return True, heard.whole("limits", "second", answer[1], 0, 2**40), None
        if answer[0] != 0 or len(answer) != 4:
            raise Untrusted("limits", f"the script answered {answer!r:.80}")
        wait = heard.number("limits", "wait", answer[2], 0.0, float(self.window))
        return False, 0, _rejection(_text(answer[1]), max(wait, 0.001), limits, tokens)

    # ------------------------------------------------------------------ the front's limiter

    def admit(
        self, tenant: str, limits: TenantLimits, estimated_tokens: int, request_id: str = ""
    ) -> Ticket:
        """The ticket `reserve` took for `request_id`, or (Redis down) the local fallback's
        admission under limits divided by the replica count."""
        ticket = self._reserved.pop(request_id, None)
        if ticket is not None:
            self._held[request_id] = ticket
            return ticket
        return self.local.admit(tenant, self._divided(limits), estimated_tokens)

    def check(self, tenant: str, limits: TenantLimits) -> None:
        """Before the body is read: refuse a tenant that Redis refused moments ago for a
        limit that holds for all its requests (`TENANT_WIDE`: the request rate,
        concurrency), until the Retry-After it was given; the fallback's own check while
        Redis is down."""
        if self._down is not None:
            self.local.check(tenant, self._divided(limits))
            return
        refused = self._refused.get(tenant)
        if refused is None:
            return
        until, rejection = refused
        left = until - time.monotonic()
        if left <= 0:
            del self._refused[tenant]
            return
        raise Rejection(rejection.reason, left, rejection.message)

    def settle(self, ticket: Ticket, actual_tokens: int | None = None) -> None:
        if not isinstance(ticket, SharedTicket):
            self.local.settle(ticket, actual_tokens)
            return
        if ticket.settled:
            return
        ticket.settled = True
        self._held.pop(ticket.request_id, None)
        self._reserved.pop(ticket.request_id, None)
        served = -1 if actual_tokens is None else min(actual_tokens, MOST_RESERVED_TOKENS)
        arguments: list[str | int | float] = [
            "settle",
            ticket.request_id,
            ticket.second,
            ticket.estimated_tokens,
            served,
        ]
        self._send_soon(self._keys(ticket.tenant), arguments)

    def record_service(self, pool: str, tenant: str, service: float) -> None:
        """Add what `tenant` was served in `pool` to the fleet's record that every replica
        reads (`fleet_service`); sent with this turn's settlements, and not kept while
        the server is down."""
        if self._down is None and 0 < service < math.inf:
            self._send_soon(self._service_keys(tenant, pool), ["serve", pool, service, self.window])

    async def fleet_service(
        self, pools: Mapping[str, Iterable[str]]
    ) -> dict[tuple[str, str], FleetService] | None:
        """What every replica together served each tenant of each pool (`pools`: pool →
        its tenants): in all, and in the last `window` seconds. One round trip; None
        while the server is down or does not answer."""
        pairs = [(pool, tenant) for pool, tenants in pools.items() for tenant in tenants]
        if self._down is not None:
            return None
        pipeline = self._client.pipeline(transaction=False)
        pipeline.time()
        for pool, tenant in pairs:
            totals_key, recent_key = self._service_keys(tenant, pool)
            pipeline.hget(totals_key, pool)
            pipeline.hgetall(recent_key)
        answers = await self._read(pipeline)
        if answers is None:
            return None
        seconds, _ = answers[0]
        oldest = int(seconds) - self.window + 1
        found = {}
        for index, pair in enumerate(pairs):
            total, buckets = answers[1 + 2 * index], answers[2 + 2 * index]
            found[pair] = FleetService(
                self._reading("service", total or 0, MOST_RECORDED),
                self._in_window("service", buckets, oldest, MOST_RECORDED),
            )
        return found

    def forget(self, request_id: str) -> None:
        """A reservation that never reached the front (the request failed in between)."""
        ticket = self._reserved.pop(request_id, None)
        if ticket is not None:
            self.settle(ticket, 0)

    def state(self, tenant: str) -> dict[str, float]:
        """The local fallback's counts (what this replica admitted while Redis was down)."""
        return self.local.state(tenant)

    async def shared_state(self, tenant: str) -> dict[str, float] | None:
        """What every replica together counts for `tenant` now, in the local fallback's
        form: requests and tokens in the window, and requests in progress (live leases).
        One round trip; None while the server is down or does not answer."""
        if self._down is not None:
            return None
        requests, tokens, leases = self._keys(tenant)
        pipeline = self._client.pipeline(transaction=False)
        pipeline.time()
        pipeline.hgetall(requests)
        pipeline.hgetall(tokens)
        pipeline.zrange(leases, 0, -1, withscores=True)
        answers = await self._read(pipeline)
        if answers is None:
            return None
        (seconds, micros), per_second, tokens_per_second, held = answers
        now = int(seconds) + int(micros) / 1e6
        oldest = int(seconds) - self.window + 1
        return {
            "requests": self._in_window("usage", per_second, oldest, MOST_RECORDED),
            "tokens": self._in_window("usage", tokens_per_second, oldest, MOST_RECORDED),
            "concurrent": float(self._live_leases(held, now)),
        }

    async def _read(self, pipeline: Any) -> list[Any] | None:
        """Run a pipeline of reads; None (and the local fallback) if the server cannot be
        reached. A read the server refuses (a key of another type, forged) comes back as
        its error in its place, and is ignored where it is used."""
        try:
            return list(await pipeline.execute(raise_on_error=False))
        except (TimeoutError, RedisError, OSError) as error:
            self._went_down(error)
            return None

    def _reading(self, kind: heard.Kind, value: Any, most: float) -> float:
        """A number read from the server, or 0 (ignored) if it is not one in [0, most]."""
        try:
            return heard.number(kind, "a recorded value", value, 0.0, most)
        except Untrusted as error:
            self.ignored.untrusted(error)
            return 0.0

    def _in_window(self, kind: heard.Kind, buckets: Any, oldest: int, most: float) -> float:
        """The sum of per-second `buckets` (HGETALL) from `oldest` on; a bucket that is not
        a second and a number in [0, most] is ignored."""
        if not isinstance(buckets, dict):
            self.ignored(kind, f"a record of buckets read as {buckets!r:.80}")
            return 0.0
        total = 0.0
        for at, value in buckets.items():
            try:
                second = heard.whole(kind, "a bucket's second", at, 0, 2**40)
            except Untrusted as error:
                self.ignored.untrusted(error)
                continue
            if second >= oldest:
                total += self._reading(kind, value, most)
        return total

    def _live_leases(self, held: Any, now: float) -> int:
        """Leases (ZRANGE WITHSCORES) that expire after `now`, and no later than a lease
        taken now could: a later one is forged."""
        if not isinstance(held, list):
            self.ignored("usage", f"the leases read as {held!r:.80}")
            return 0
        live = [expiry for _, expiry in held if expiry > now]
        forged = sum(1 for expiry in live if expiry > now + self.spec.lease_seconds + 1)
        self.ignored("usage", f"{forged} leases expire later than a lease can", forged)
        return len(live) - forged

    # ------------------------------------------------------------------ internals

    def _keys(self, tenant: str) -> list[str]:
        tag = f"{self.prefix}:{{{tenant}}}"
        return [f"{tag}:requests", f"{tag}:tokens", f"{tag}:leases"]

    def _service_keys(self, tenant: str, pool: str) -> list[str]:
        tag = f"{self.prefix}:{{{tenant}}}"
        return [f"{tag}:served", f"{tag}:recent:{pool}"]

    def _send_soon(self, keys: list[str], arguments: list[str | int | float]) -> None:
        """A script call that needs no answer, sent with the others of this turn of the
        event loop in one round trip."""
        self.send_soon(lambda pipeline: self._script(keys=keys, args=arguments, client=pipeline))

    def send_soon(self, queue: Queued) -> None:
        """A command that needs no answer (`queue` adds it to a pipeline), sent with the
        others of this turn of the event loop in one round trip; nothing while the
        server is down."""
        if self._down is not None:
            return
        self._outgoing.append(queue)
        if len(self._outgoing) == 1:  # the first since the last flush: flush them soon
            self._spawn(self._flush_outgoing())

    def _divided(self, limits: TenantLimits) -> TenantLimits:
        return divided_limits(limits, self.spec.replicas)

    async def _call(self, tenant: str, arguments: list[str | int | float]) -> None:
        try:
            await self._script(keys=self._keys(tenant), args=arguments)
        except (TimeoutError, RedisError, OSError) as error:
            self._went_down(error)

    async def _flush_outgoing(self) -> None:
        """Send the calls made until the event loop comes back here (settlements, service
        records) in one round trip (a pipeline): they need no answer, so many share one."""
        await asyncio.sleep(0)
        batch, self._outgoing = self._outgoing, []
        pipeline = self._client.pipeline(transaction=False)
        for queue in batch:
            queued = queue(pipeline)
            if inspect.isawaitable(queued):
                await queued
        try:
            answers = await pipeline.execute(raise_on_error=False)
        except (TimeoutError, RedisError, OSError) as error:
            self._went_down(error)
            return
        for answer in answers:  # the server answered: refusals are not an outage
            if isinstance(answer, ResponseError):
                self.ignored("refused", f"the server refused a write: {answer}")

    def _spawn(self, work: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work)
        except RuntimeError:  # no loop (shutting down): the lease expires by itself
            work.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _went_down(self, error: BaseException) -> None:
        if self._down is None:
            reason = f"{type(error).__name__}: {error}"
            log.warning(
                "shared state unreachable, limits are local and divided by %d: %s",
                self.spec.replicas,
                reason,
            )
            self._down = _Down(time.monotonic(), reason)
            self._wake.set()  # start trying again now, not after the renewal interval

    async def _renew_forever(self) -> None:
        while True:
            if self._down is None:
                await self._renew()
                self._wake.clear()
                await wait_at_most(self._wake, self.spec.lease_seconds / 3)
            else:
                await asyncio.sleep(RETRY_INTERVAL)
                await self._try_again()

    async def _renew(self) -> None:
        by_tenant: dict[str, list[str]] = {}
        for request_id, ticket in self._held.items():
            by_tenant.setdefault(ticket.tenant, []).append(request_id)
        for tenant, request_ids in by_tenant.items():
            await self._call(tenant, ["renew", self.spec.lease_seconds, *request_ids])

    async def _try_again(self) -> None:
        try:
            await self._client.ping()
        except (TimeoutError, RedisError, OSError):
            return
        down, self._down = self._down, None
        if down is not None:
            log.warning(
                "shared state reachable again after %.1f s: limits are shared",
                time.monotonic() - down.since,
            )


def read_password(path: str | None) -> str | None:
    """The server's password from `passwordFile` (a mounted Secret), if one is named."""
    if path is None:
        return None
    return Path(path).read_text().strip() or None


def _limit(value: int | None) -> int:
    return -1 if value is None else value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _rejection(reason: str, wait: float, limits: TenantLimits, tokens: int) -> Rejection:
    """The refusal the in-memory limiter gives for the same limit; `Untrusted` for a
    reason the script does not give (or for a limit not set)."""
    if reason == "requests_per_minute" and limits.requests_per_minute is not None:
        return requests_rejection(limits.requests_per_minute, wait)
    if reason == "tokens_alone" and limits.tokens_per_minute is not None:
        return oversized_rejection(limits.tokens_per_minute, tokens)
    if reason == "tokens_per_minute" and limits.tokens_per_minute is not None:
        return tokens_rejection(limits.tokens_per_minute, wait)
    if reason == "concurrent" and limits.concurrent is not None:
        return concurrent_rejection(limits.concurrent)
    raise Untrusted("limits", f"the script refused for {reason!r:.80}, a limit not set")
