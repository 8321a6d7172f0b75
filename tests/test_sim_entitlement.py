"""Backlog wherever demand waits, and each tenant's share against its entitlement.

A tenant is backlogged while demand of it waits anywhere: at a gateway replica's fair
queue, in an engine's queue, or at its own closed-loop client (`fairpool.sim.metrics`). Its
entitlement while backlogged follows the fair order's tree (`fairpool.sim.entitlement`):
the bands' minimum shares, then weights down the groups. Checked by random search: the
rule at one moment against a direct statement of it, its integral over a run against the
sum of its moments, and whole fleets in which a closed-loop tenant is held at the gateway.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.api.inference_pool import Saturation
from fairpool.sched import Request, TenantWeights
from fairpool.sched.tree import BAND_NAMES, Group, Shares
from fairpool.sim.entitlement import Entitlements, entitled_shares
from fairpool.sim.fleet import ClosedLoop, Fleet, FleetConfig
from fairpool.sim.metrics import Recorder
from fairpool.sim.profiles import get_profile

pytestmark = pytest.mark.unit

TENANTS = ["t0", "t1", "t2", "t3", "t4", "t5"]


@st.composite
def trees(draw: st.DrawFn) -> Shares:
    """Random trees: tenants with weights, bands and groups; groups nested any depth
    (a group's parent comes before it, so there is no cycle)."""
    names = [f"g{index}" for index in range(draw(st.integers(0, 4)))]
    groups = {
        name: Group(
            weight=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])),
            parent=draw(st.sampled_from([None, *names[:index]])),
        )
        for index, name in enumerate(names)
    }
    weight = st.sampled_from([0.5, 1.0, 2.0, 4.0])
    return Shares(
        {tenant: draw(weight) for tenant in TENANTS},
        groups=groups,
        tenant_groups={t: g for t in TENANTS if (g := draw(st.sampled_from([None, *names])))},
        tenant_bands={tenant: draw(st.sampled_from(BAND_NAMES)) for tenant in TENANTS},
    )


@st.composite
def flows(draw: st.DrawFn, shares: Shares) -> str:
    """A tenant, or the tenant in a band below its own (a request that asked lower)."""
    tenant = draw(st.sampled_from(TENANTS))
    below = BAND_NAMES[BAND_NAMES.index(shares.tenant_band(tenant)) + 1 :]
    band = draw(st.sampled_from([None, *below]))
    return tenant if band is None else f"{tenant}@{band}"


def stated_share(shares: Shares, backlogged: set[str], flow: str) -> float:
    """The rule as the docs state it: the flow's band's share (the highest busy band the
    rest, a lower one its minimum share), times weight / Σ weights of the siblings with a
    backlogged flow below them, at every node down the flow's path."""
    band = shares.band_of(flow)
    busy = [b for b in BAND_NAMES if any(shares.band_of(f) == b for f in backlogged)]
    lower = sum(shares.min_shares[b] for b in busy[1:])
    share = 1.0 - lower if band == busy[0] else shares.min_shares[band]
    in_band = [f for f in backlogged if shares.band_of(f) == band]
    path = shares.node_path(flow)
    for depth, node in enumerate(path):
        siblings = {
            shares.node_path(other)[depth]
            for other in in_band
            if shares.node_path(other)[:depth] == path[:depth]
            and len(shares.node_path(other)) > depth
        }
        share *= shares.node_weight(node) / sum(shares.node_weight(s) for s in siblings)
    return share


@given(st.data())
def test_the_rule_at_one_moment_is_the_stated_one_and_adds_up_to_one(data):
    shares = data.draw(trees())
    backlogged = set(data.draw(st.lists(flows(shares), min_size=1, max_size=8)))
    found = entitled_shares(shares, backlogged)
    assert set(found) == backlogged
    for flow in backlogged:
        assert found[flow] == pytest.approx(stated_share(shares, backlogged, flow))
    assert sum(found.values()) == pytest.approx(1.0)


@given(st.data())
def test_a_flow_alone_backlogged_is_entitled_to_everything(data):
    shares = data.draw(trees())
    flow = data.draw(flows(shares))
    assert entitled_shares(shares, [flow]) == {flow: pytest.approx(1.0)}


@given(st.dictionaries(st.sampled_from(TENANTS), st.sampled_from([0.5, 1.0, 3.0]), min_size=1))
def test_flat_weights_entitle_each_tenant_to_its_weight_over_the_backlogged_weights(weights):
    found = entitled_shares(Shares(weights), weights)
    total = sum(weights.values())
    assert found == {tenant: pytest.approx(weight / total) for tenant, weight in weights.items()}


@given(st.integers(1, 12))
def test_with_groups_a_tenant_has_its_share_of_its_groups_share(members):
    """Org A with `members` tenants and org B with one, equal weights: half each, and A's
    half split among its tenants (flat weights would give B 1 / (members + 1))."""
    tenants = [f"a{index}" for index in range(members)] + ["b0"]
    shares = Shares(
        {},
        groups={"a": Group(), "b": Group()},
        tenant_groups={tenant: tenant[0] for tenant in tenants},
    )
    found = entitled_shares(shares, tenants)
    assert found["b0"] == pytest.approx(0.5)
    assert all(found[f"a{index}"] == pytest.approx(0.5 / members) for index in range(members))


@settings(max_examples=50)
@given(st.data())
def test_the_integral_over_a_run_is_the_sum_of_its_moments(data):
    """`Entitlements` integrates lazily; it must hand out exactly what the rule gives at
    each moment, whatever the order of joins, leaves and service."""
    shares = data.draw(trees())
    entitlements = Entitlements(shares)
    expected: dict[str, float] = {}
    active: set[str] = set()
    for _ in range(data.draw(st.integers(1, 40))):
        flow = data.draw(flows(shares))
        action = data.draw(st.sampled_from(["toggle", "serve"]))
        if action == "toggle" and flow in active:
            active.discard(flow)
            entitlements.leave(flow)
        elif action == "toggle":
            active.add(flow)
            entitlements.join(flow)
        else:
            amount = data.draw(st.floats(0.0, 1000.0))
            entitlements.serve(amount)
            for name, share in (entitled_shares(shares, active) if active else {}).items():
                expected[name] = expected.get(name, 0.0) + share * amount
    for flow in expected:
        assert entitlements.entitled(flow) == pytest.approx(expected[flow], abs=1e-6)


def test_the_summary_gives_a_tenant_alone_backlogged_an_entitled_share_of_one():
    """a waits throughout; b is served but never waits: a was entitled to all the service,
    and got 30 % of it (its ratio); b, never backlogged, has neither."""
    recorder = Recorder(TenantWeights({"a": 1.0, "b": 4.0}))
    recorder.arrived(Request("1", "a", 10, 10, arrival=0.0))
    recorder.arrived(Request("2", "b", 10, 10, arrival=0.0))
    recorder.admitted(Request("2", "b", 10, 10), 0.0)
    recorder.served_after_step(1.0, "w0", {"a": 30.0, "b": 70.0})
    recorder.served_after_step(2.0, "w0", {"a": 60.0, "b": 140.0})
    recorder.close(2.0)
    tenants = recorder.summary()["tenants"]
    assert tenants["a"]["entitled_share"] == 1.0
    assert tenants["a"]["backlogged_share"] == pytest.approx(0.3)
    assert tenants["a"]["share_ratio"] == pytest.approx(0.3)
    assert tenants["b"]["entitled_share"] is None and tenants["b"]["share_ratio"] is None


DURATION = 20.0


def held_at_the_gateway(gold_weight: float, streams: int, replicas: int) -> dict:
    """Two closed-loop tenants with equal streams behind a gateway that holds all but two
    requests a worker, serving first come first served everywhere: they are served alike
    whatever their weights, and each is held at the gateway while the other is served."""
    config = FleetConfig.from_profile(
        get_profile("llama2-7b-a10g"),
        memory_tokens=4096,
        workers=2,
        policy="fcfs",
        router="round_robin",
        weights=TenantWeights({"gold": gold_weight, "bronze": 1.0}),
        saturation=Saturation(maxOutstanding=2),
        queue_policy="fcfs",
        gateway_replicas=replicas,
    )
    clients = [ClosedLoop(tenant, streams, 64, 32, 32) for tenant in ("gold", "bronze")]
    fleet = Fleet(config)
    fleet.run([], duration=DURATION, clients=clients)
    return fleet.summary()


@settings(max_examples=6, deadline=None)
@given(
    gold_weight=st.sampled_from([2.0, 3.0, 4.0, 8.0]),
    streams=st.integers(4, 12),
    replicas=st.integers(1, 2),
)
def test_tenants_held_at_the_gateway_and_served_alike_show_the_gap_and_both_ratios(
    gold_weight, streams, replicas
):
    summary = held_at_the_gateway(gold_weight, streams, replicas)
    gold, bronze = summary["tenants"]["gold"], summary["tenants"]["bronze"]
    assert gold["service"] == pytest.approx(bronze["service"], rel=0.2)  # served alike
    assert summary["duration_s"] == DURATION
    for tenant in (gold, bronze):  # no think time: backlogged as long as the run
        assert tenant["backlogged_s"] == pytest.approx(DURATION)
        assert tenant["rejected"] == 0  # still queued at the end is not refused in the run
    # Both backlogged throughout: the gap is at least the final weighted difference.
    final = abs(gold["service"] / gold_weight - bronze["service"])
    assert summary["max_backlogged_service_gap"] >= final - 1e-6 > 0
    assert gold["entitled_share"] == pytest.approx(gold_weight / (gold_weight + 1), abs=1e-4)
    assert gold["share_ratio"] < 1 < bronze["share_ratio"]
    assert summary["worst_share_ratio_tenant"] == "bronze"
    assert summary["worst_share_ratio"] == bronze["share_ratio"]


def test_a_client_held_back_by_retry_after_is_backlogged_at_the_client():
    """A client with think time whose requests a rate limit refuses: nothing of it waits
    in a queue, but its next request is due and held — backlogged, until the window lets
    it go; the backlog ends with the run."""
    config = FleetConfig(rpm_limit=10, memory_tokens=2000)
    client = ClosedLoop("a", 1, 0, 10, 4, think_time=0.5)
    fleet = Fleet(config)
    fleet.run([], duration=120.0, clients=[client])
    tenant = fleet.summary()["tenants"]["a"]
    assert tenant["rejected"] > 0
    # 10 requests a minute, each done in well under a second: the rest of each minute is
    # a wait for the window, less the think time before each refused attempt.
    assert 100.0 < tenant["backlogged_s"] <= 120.0
