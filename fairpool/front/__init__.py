"""fairpool.front: what stands in front of a pool's engines, for every front end.

- `limits`: hard per-tenant limits (requests and tokens per minute, concurrency).
- `queue`: the fair queue (VTC across tenants) that holds requests while the pool is full.
- `lifecycle`: `PoolFront`, the one request lifecycle — admit, hold, route, dispatch,
  observe, settle — that the gateway runs over HTTP and the simulator in virtual time.
- `peers`: what a front knows of the gateway's other replicas, when they share state.
"""

from fairpool.front.lifecycle import (
    CHARS_PER_TOKEN,
    CLIENT_CLOSED,
    Flight,
    FrontListener,
    FrontRequest,
    NoWorker,
    Outcome,
    PoolFront,
    Settlement,
    Usage,
    tokens_for_chars,
)
from fairpool.front.limits import Limiter, Rejection, TenantLimiter, Ticket
from fairpool.front.queue import FairQueue

__all__ = [
    "CHARS_PER_TOKEN",
    "CLIENT_CLOSED",
    "FairQueue",
    "Flight",
    "FrontListener",
    "FrontRequest",
    "Limiter",
    "NoWorker",
    "Outcome",
    "PoolFront",
    "Rejection",
    "Settlement",
    "TenantLimiter",
    "Ticket",
    "Usage",
    "tokens_for_chars",
]
