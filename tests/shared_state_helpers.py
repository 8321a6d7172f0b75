"""Gateway replicas sharing state in a real Valkey server, without the HTTP around them:
`SharedLimiter`s standing for replicas, the requests they admit, and a pool's front that
only records the charges it hears."""

from __future__ import annotations

import itertools

from fairpool.api.gateway_config import SharedStateSpec
from fairpool.api.tenant_quota import TenantLimits
from fairpool.front import FrontRequest, Ticket
from fairpool.sched.cost import CostModel
from fairpool_cli.local.store import LocalStore
from fairpool_gateway.shared_limits import SharedLimiter

_ids = itertools.count()


def replicas(store: LocalStore, count: int = 2, **spec: object) -> list[SharedLimiter]:
    settings_ = SharedStateSpec.model_validate(
        {"url": store.url, "replicas": count, "timeoutSeconds": 10, **spec}
    )
    return [SharedLimiter(settings_) for _ in range(count)]


def request(
    tenant: str, limits: TenantLimits, tokens: int = 10, output_limit: int | None = None
) -> FrontRequest:
    return FrontRequest(f"r{next(_ids)}", tenant, "", tokens, output_limit, limits)


async def admit(limiter: SharedLimiter, front_request: FrontRequest) -> Ticket:
    """What the gateway does: reserve in the shared state, then the front's admission."""
    await limiter.reserve(front_request)
    return limiter.admit(
        front_request.tenant,
        front_request.limits,
        front_request.reserved_tokens,
        front_request.request_id,
    )


async def close(*limiters: SharedLimiter) -> None:
    for limiter in limiters:
        await limiter.close()


class HeardCharges:
    """Stands for a pool's front: records what the other replicas charged."""

    peers = None  # holds nothing the other replicas wait for
    cost = CostModel()  # what bounds the charges it hears

    def __init__(self) -> None:
        self.heard: list[tuple[str, str, float]] = []

    def charged_elsewhere(self, tenant: str, worker: str, service: float) -> None:
        self.heard.append((tenant, worker, service))
