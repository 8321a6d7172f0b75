"""Hard per-tenant limits enforced on arrival.

`RequestRateLimiter` is the request-per-minute limit: VTC's RPM baseline (Sheng et al.,
OSDI'24, §5.1 — its artifact rejects a request when the client already has `limit`
requests in the trailing 60 seconds) and the gateway's RPM limit.
"""

from __future__ import annotations

from collections import defaultdict, deque

from fairpool.sched.errors import require_count, require_positive


class RequestRateLimiter:
    """At most `requests_per_minute` accepted requests per tenant in any trailing window."""

    def __init__(self, requests_per_minute: int, window: float = 60.0) -> None:
        self.limit = require_count("requests_per_minute", requests_per_minute, minimum=1)
        self.window = require_positive("window", window)
        self._accepted: dict[str, deque[float]] = defaultdict(deque)

    def allow(self, tenant: str, now: float) -> bool:
        """Accept (and count) a request of `tenant` at time `now`, or refuse it."""
        accepted = self._accepted[tenant]
        while accepted and accepted[0] <= now - self.window:
            accepted.popleft()
        if len(accepted) >= self.limit:
            return False
        accepted.append(now)
        return True
