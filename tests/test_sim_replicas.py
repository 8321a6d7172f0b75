"""Gateway replicas in the simulator: N fronts of their own (queue, routing, saturation
counts) before one set of engines, in virtual time. With `fairEngines` the engines'
weights hold whatever the number of replicas and however the traffic reaches them; in
front of stock (first come, first served) engines the replicas' shared queues hold them
(`fairpool.front.peers`); with replicas that decide alone and each tenant through its own
replica, they do not — the collapse both exist for (docs/gateway.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.api.inference_pool import Saturation
from fairpool.sched import TenantWeights
from fairpool.sim.fleet import ClosedLoop, Fleet, FleetConfig
from fairpool.sim.profiles import get_profile
from fairpool.sim.workloads import lognormal_length, stream

pytestmark = pytest.mark.unit

WARMUP, END = 20.0, 80.0  # virtual seconds: the ratio is read between them


def ratio(
    replicas: int,
    traffic: str,
    fair_engines: bool,
    gold_weight: float,
    engines: str = "vtc",
    share_state: bool = True,
    memory_tokens: int = 2048,
    saturation: Saturation | None = None,
    clients: list[ClosedLoop] | None = None,
    end: float = END,
) -> float:
    """gold : bronze service between WARMUP and `end`, both flooding (24 streams each of
    the same lengths unless `clients` says otherwise), the gateway holding at most 8
    requests a worker unless `saturation` says otherwise."""
    weights = TenantWeights({"gold": gold_weight, "bronze": 1.0})
    config = FleetConfig.from_profile(
        get_profile("llama2-7b-a10g"),
        memory_tokens=memory_tokens,
        workers=2,
        policy=engines,
        router="d2lpm",
        weights=weights,
        saturation=saturation or Saturation(maxOutstanding=8),
        gateway_replicas=replicas,
        replica_traffic=traffic,  # type: ignore[arg-type]
        fair_engines=fair_engines,
        share_state=share_state,
    )
    if clients is None:
        clients = [ClosedLoop(tenant, 24, 100, 150, 64) for tenant in ("gold", "bronze")]
    recorder = Fleet(config).run([], duration=end, clients=clients)
    served = {
        tenant: recorder.service_at(tenant, end) - recorder.service_at(tenant, WARMUP)
        for tenant in ("gold", "bronze")
    }
    return served["gold"] / served["bronze"]


@settings(max_examples=8, deadline=None)
@given(
    replicas=st.integers(1, 4),
    traffic=st.sampled_from(["spread", "tenant"]),
    gold_weight=st.sampled_from([2.0, 4.0]),
)
def test_with_fair_engines_the_weights_hold_across_replicas(replicas, traffic, gold_weight):
    assert ratio(replicas, traffic, True, gold_weight) == pytest.approx(gold_weight, rel=0.1)


@settings(max_examples=8, deadline=None)
@given(
    replicas=st.integers(1, 4),
    traffic=st.sampled_from(["spread", "tenant"]),
    gold_weight=st.sampled_from([2.0, 4.0]),
)
def test_before_stock_engines_the_shared_queues_hold_the_weights_across_replicas(
    replicas, traffic, gold_weight
):
    measured = ratio(replicas, traffic, False, gold_weight, engines="fcfs")
    assert measured == pytest.approx(gold_weight, rel=0.1)


def test_replicas_deciding_alone_each_tenant_through_its_own_the_weights_collapse():
    assert ratio(1, "tenant", False, 4.0, engines="fcfs") == pytest.approx(4.0, rel=0.1)
    assert ratio(2, "tenant", False, 4.0, engines="fcfs", share_state=False) < 2.0


@pytest.mark.parametrize("gold_weight", [2.0, 4.0])
@pytest.mark.parametrize(("engines", "fair_engines"), [("vtc", True), ("fcfs", False)])
def test_with_room_in_the_engines_two_spread_replicas_keep_the_weights(
    engines, fair_engines, gold_weight
):
    """KV caches large enough that only the cap binds: the replicas' shared queues decide.
    A tenant joining one replica's queue while it waits at another is not lifted (it has
    been backlogged all along); lifting it there cost it its credit each time, and 4 : 1
    came out 2.92 : 1. (Three and four replicas still fall short: 2.5-3.3 : 1,
    docs/benchmarks.md.)"""
    measured = ratio(2, "spread", fair_engines, gold_weight, engines, memory_tokens=10_000)
    assert measured == pytest.approx(gold_weight, rel=0.05)


@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_dlpm_engines_that_decide_keep_the_weights_with_mixed_lengths(seed):
    """The engines hold queues (2,048 KV tokens, the default saturation) and run DLPM; each
    stream's lengths are drawn. Every tenant keeps up to `tenantWaiting` requests waiting
    in each engine that holds: when only a tenant below its share of the requests in
    flight could, the heavier tenant's last waiting request was often admitted within a
    step while it had credit, DLPM refilled the other without it, and 4 : 1 came out
    6.4-7.4 : 1 over this window. What is left is DLPM's granularity (Theorem 4.1's
    2(U + Q) per engine against the window's service), hence the long window."""
    rng = stream(seed, "flood")
    clients = [
        ClosedLoop(
            tenant,
            1,
            100,
            lognormal_length(rng, 150, 0.5, 1000),
            lognormal_length(rng, 64, 0.5, 512),
        )
        for tenant in ("gold", "bronze")
        for _ in range(24)
    ]
    measured = ratio(
        1, "spread", True, 4.0, "dlpm", saturation=Saturation(), clients=clients, end=300.0
    )
    assert measured == pytest.approx(4.0, rel=0.1)
