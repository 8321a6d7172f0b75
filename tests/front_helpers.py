"""Pool fronts for tests of a gateway's replicas: several fronts over the same workers."""

from __future__ import annotations

from fairpool.api.inference_pool import Saturation
from fairpool.front import FairQueue, PoolFront, TenantLimiter
from fairpool.front.replicas import share_among
from fairpool.sched import CostModel, TenantWeights
from fairpool.sched.registry import make_router

COST = CostModel()
WORKERS = ("w0", "w1")
WEIGHTS = TenantWeights({"gold": 4.0, "silver": 2.0, "bronze": 1.0})


def replicas(
    count: int, cap: int, queue_policy: str = "vtc", share: bool = True
) -> list[PoolFront]:
    """`count` fronts over the same two workers, each capped at `cap` requests (only the
    cap binds: the engines' queues and KV are never reported full)."""
    limiter = TenantLimiter(clock=lambda: 0.0)  # the replicas' shared limits
    fronts = [
        PoolFront(
            "main",
            make_router("least_load", WORKERS, cost=COST, weights=WEIGHTS),
            FairQueue(COST, WEIGHTS, policy=queue_policy, clock=lambda: 0.0),
            limiter,
            COST,
            saturation=Saturation(maxOutstanding=cap, maxWaiting=10_000),
            clock=lambda: 0.0,
        )
        for _ in range(count)
    ]
    if share:
        share_among(fronts)
    return fronts


def in_flight(fronts: list[PoolFront], worker: str) -> int:
    return sum(front.router.workers[worker].outstanding for front in fronts)
