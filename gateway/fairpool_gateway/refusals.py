"""Refusal storms, damped.

A client that retries its refusals (429s, 401s, 400s) with no back-off turns each into the
next request at once: thousands a second on one core, each read, parsed, authenticated,
counted and logged, and every other tenant's requests wait behind them. A refusal that
read a 4 MB body first (a body of empty lists, say) costs the gateway milliseconds. So
refusals are counted per tenant (per client address for a request without a valid key) in
a token bucket of `clients.refusalBurst` refusals (20) refilled at `clients.refusalRate` a
second (5), each refusal costing one plus a token per MiB of body the gateway read for it;
past the bucket:

- each further refusal is answered only after `min(Retry-After, MAX_DELAY)` seconds — a
  wait that costs the gateway nothing — and with `Connection: close`, so a client that
  will not wait pays a new connection for each retry, and its retries count against its
  address's connections (`fairpool_gateway.connections`);
- a tenant still in the storm has its next requests refused on their headers, before a
  byte of their bodies is read (429, `code: refusals_damped`), until its bucket refills.

A client that honours Retry-After, and a tenant whose requests are sound, never see either.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import Response

#: A refusal costs one token, and one more for each of these many bytes read for it.
BYTES_PER_TOKEN = 1 << 20
#: The longest a damped refusal is held back, in seconds.
MAX_DELAY = 1.0
#: Buckets kept at most; the fullest (least damped) go first beyond it.
MAX_TRACKED = 10_000


@dataclass(frozen=True)
class Storms:
    """The bucket: refusals at once (`burst`), and a second for ever (`rate`)."""

    burst: float = 20.0
    rate: float = 5.0


@dataclass
class _Bucket:
    tokens: float
    at: float


class Refusals:
    """The damping of the module's docstring, and how many refusals it damped. `storms`
    is read at every refusal, so a reloaded configuration applies to the next one."""

    def __init__(
        self,
        storms: Callable[[], Storms] = Storms,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.storms = storms
        self.clock = clock
        self.damped = 0
        self._buckets: dict[str, _Bucket] = {}

    def delay(self, who: str, retry_after: float, body_bytes: int = 0) -> float:
        """Count a refusal of `who` that read `body_bytes`; seconds to hold its answer back
        (0: send it now)."""
        bucket = self._refilled(who)
        cost = 1.0 + body_bytes / BYTES_PER_TOKEN
        if bucket.tokens >= cost:
            bucket.tokens -= cost
            return 0.0
        bucket.tokens = max(bucket.tokens - cost, -self.storms().burst)  # a debt, repaid
        self.damped += 1
        return min(max(retry_after, 0.0), MAX_DELAY)

    def storming(self, who: str) -> bool:
        """Whether `who` is refused in a storm now: its next request is refused unread."""
        return who in self._buckets and self._refilled(who).tokens < 1

    async def damp(self, who: str, response: Response, body_bytes: int = 0) -> None:
        """Hold back `response` (a refusal of `who`, which read `body_bytes`) if `who` is
        refused in a storm, and close its connection after it."""
        delay = self.delay(who, _retry_after(response), body_bytes)
        if delay > 0:
            response.headers["connection"] = "close"
            await asyncio.sleep(delay)

    def _refilled(self, who: str) -> _Bucket:
        now, storms = self.clock(), self.storms()
        bucket = self._buckets.get(who)
        if bucket is None:
            self._forget_some()
            bucket = self._buckets[who] = _Bucket(storms.burst, now)
        bucket.tokens = min(storms.burst, bucket.tokens + (now - bucket.at) * storms.rate)
        bucket.at = now
        return bucket

    def _forget_some(self) -> None:
        if len(self._buckets) < MAX_TRACKED:
            return
        now, storms = self.clock(), self.storms()
        full = [
            who
            for who, b in self._buckets.items()
            if b.tokens + (now - b.at) * storms.rate >= storms.burst
        ]
        for who in full or list(self._buckets)[: MAX_TRACKED // 10]:
            del self._buckets[who]


def _retry_after(response: Response) -> float:
    try:
        return float(response.headers.get("retry-after", MAX_DELAY))
    except ValueError:
        return MAX_DELAY
