"""The rules that share KV memory by weight (`fairpool.sched.kv_share`), checked by random
search over running sets, waiting tenants and weights:

- victims come from the tenants furthest above their share first, each tenant's youngest
  request first, and a request is preempted only after every request of each tenant
  further above its share;
- headroom: an admission is refused only for a tenant that would go above its share.

With priority bands (a tenant is then a flow, `tenant` or `tenant@band`):

- no request of a band is preempted while a request of a lower band runs, whatever the
  running set, for policies that share memory and for those that keep vLLM's order;
- inside each band the order is today's (the rules before bands, kept below as the
  reference), and on single-band inputs the whole order is;
- headroom never holds a request back for a lower band: its answer does not change when
  every lower band's request, running or waiting, is taken away (the free memory kept).

And on the simulator's engine, under memory far too small for the load: every request of
every tenant finishes (holding back and preempting by share never livelock), whatever the
weights; with bands, every preemption it makes takes a request of the lowest band running.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.sched import (
    EngineSnapshot,
    EngineView,
    Request,
    Running,
    TenantWeights,
    kv_share,
    make_policy,
)
from fairpool.sched.tree import BAND_NAMES, Shares
from fairpool.sim.engine import SimEngine, StepTime
from fairpool.sim.fleet import Fleet, FleetConfig
from fairpool.sim.trace import TraceRequest

pytestmark = pytest.mark.unit

TENANTS = ["a", "b", "c", "d"]

running_request = st.tuples(
    st.sampled_from(TENANTS), st.integers(1, 400), st.integers(0, 200)
)  # tenant, prompt, output so far
weight_table = st.fixed_dictionaries(
    {tenant: st.sampled_from([0.5, 1.0, 2.0, 3.0]) for tenant in TENANTS}
)


def running_set(shapes: list[tuple[str, int, int]]) -> list[Running]:
    """Running requests in admission order (the oldest first)."""
    return [
        Running(Request(f"r{index}", tenant, prompt, 256), output_tokens=output)
        for index, (tenant, prompt, output) in enumerate(shapes)
    ]


def excess_of(running: list[Running], extra: Request | None, active, weights) -> dict:
    held = kv_share.holdings(running)
    if extra is not None:
        held[extra.tenant] = held.get(extra.tenant, 0) + extra.prompt_tokens
    return kv_share.excess(held, active, weights)


@settings(max_examples=300)
@given(
    st.lists(running_request, min_size=1, max_size=20),
    st.sets(st.sampled_from(TENANTS)),
    weight_table,
)
def test_victims_come_from_the_tenants_furthest_above_their_share(shapes, waiting, table):
    running = running_set(shapes)
    weights = TenantWeights(table)
    order = kv_share.preemption_order(running, waiting, weights)
    assert sorted(id(r) for r in order) == sorted(id(r) for r in running)
    over = excess_of(running, None, waiting, weights)
    excesses = [over[r.tenant] for r in order]
    assert excesses == sorted(excesses, reverse=True)
    admitted = {id(r): position for position, r in enumerate(running)}
    for tenant in {r.tenant for r in running}:
        own = [admitted[id(r)] for r in order if r.tenant == tenant]
        assert own == sorted(own, reverse=True)  # the youngest first


@settings(max_examples=300)
@given(
    st.lists(running_request, min_size=0, max_size=20),
    st.sets(st.sampled_from(TENANTS)),
    st.sampled_from(TENANTS),
    st.integers(1, 400),
    st.integers(0, 8000),
    st.sampled_from([1, 16]),
    weight_table,
)
def test_headroom_refuses_only_a_tenant_going_above_its_share(
    shapes, waiting, tenant, prompt, free, block, table
):
    running = running_set(shapes)
    weights = TenantWeights(table)
    held = sum(r.held_tokens for r in running)
    memory = held + free + 1
    view = EngineSnapshot(
        memory_tokens=memory,
        running=running,
        memory_utilization=held / memory,
        block_size=block,
    )
    request = Request("new", tenant, prompt, 256)
    active = set(waiting) | {tenant}
    if kv_share.leaves_headroom(view, request, active, weights):
        return
    assert excess_of(running, request, active, weights)[tenant] > 0
    assert free + 1 - prompt < (len(running) + 1) * block


tenant_load = st.tuples(
    st.sampled_from(TENANTS[:3]), st.integers(2, 30), st.integers(16, 300), st.integers(4, 120)
)  # tenant, requests at once, prompt, output


@settings(max_examples=25, deadline=None)
@given(
    st.lists(tenant_load, min_size=2, max_size=4),
    st.sampled_from(["vtc", "dlpm"]),
    st.sampled_from([1, 16]),
    weight_table,
)
def test_every_request_finishes_when_memory_is_shared_under_pressure(loads, policy, block, table):
    trace = [
        TraceRequest(0.001 * index, tenant, ((None, prompt),), output, output)
        for tenant, count, prompt, output in loads
        for index in range(count)
    ]
    config = FleetConfig(
        workers=1,
        policy=policy,
        memory_tokens=512,
        block_size=block,
        token_budget=512,
        step_time=StepTime(base=0.01, per_prefill_token=0.0001, per_decode=0.0002),
        weights=TenantWeights(table),
    )
    recorder = Fleet(config).run(trace, duration=3600.0)  # virtual seconds
    assert len(recorder.completions) == len(trace)


# ---------------------------------------------------------------------- bands

#: The rules before bands, as they were (the reference for the order inside a band).


def old_preemption_order(
    running: Sequence[Running], waiting_tenants: Iterable[str], weights: TenantWeights
) -> list[Running]:
    over = kv_share.excess(kv_share.holdings(running), waiting_tenants, weights)
    youngest_first = list(reversed(running))
    return sorted(youngest_first, key=lambda request: -over[request.tenant])


def old_leaves_headroom(
    view: EngineView, request: Request, waiting_tenants: Iterable[str], weights: TenantWeights
) -> bool:
    if excess_of(view.running, request, set(waiting_tenants), weights)[request.tenant] <= 0:
        return True
    free = round((1.0 - view.memory_utilization) * view.memory_tokens)
    needs = request.prompt_tokens - view.cached_tokens(request)
    return free - needs >= (len(view.running) + 1) * view.block_size


#: Flows: the tenants in their own bands, and some of them in a band they asked.
FLOWS = [*TENANTS, "a@batch", "b@batch", "c@standard", "d@interactive"]
band_table = st.fixed_dictionaries({tenant: st.sampled_from(BAND_NAMES) for tenant in TENANTS})
flow_request = st.tuples(st.sampled_from(FLOWS), st.integers(1, 400), st.integers(0, 200))
#: Free KV tokens: often near a prompt plus a block per running request, where the headroom
#: decides.
free_tokens = st.one_of(st.integers(0, 800), st.integers(0, 8000))


def rank(shares: Shares, flow: str) -> int:
    """0 for the highest band, 2 for the lowest."""
    return BAND_NAMES.index(shares.band_of(flow))


def in_band(shares: Shares, band: str, flows: Iterable[str]) -> set[str]:
    return {flow for flow in flows if shares.band_of(flow) == band}


@settings(max_examples=300)
@given(
    st.lists(flow_request, min_size=1, max_size=20),
    st.sets(st.sampled_from(FLOWS)),
    weight_table,
    band_table,
)
def test_no_request_is_preempted_while_a_lower_band_runs(shapes, waiting, table, bands):
    shares = Shares(table, tenant_bands=bands)
    running = running_set(shapes)
    for policy in ("vtc", "dlpm", "fcfs", "lpm"):
        order = make_policy(policy, weights=shares).preemption_order(running)
        assert sorted(r.request_id for r in order) == sorted(r.request_id for r in running)
        ranks = [rank(shares, r.tenant) for r in order]
        assert ranks == sorted(ranks, reverse=True), policy  # the lowest band first
    order = kv_share.preemption_order(running, waiting, shares)
    for band in BAND_NAMES:  # inside a band: today's order, on the band's requests alone
        members = [r for r in running if shares.band_of(r.tenant) == band]
        expected = old_preemption_order(members, in_band(shares, band, waiting), shares)
        assert [r for r in order if shares.band_of(r.tenant) == band] == expected
    latest = kv_share.latest_first(running, shares)
    for band in BAND_NAMES:
        members = [r for r in running if shares.band_of(r.tenant) == band]
        assert [r for r in latest if shares.band_of(r.tenant) == band] == members[::-1]


@settings(max_examples=300)
@given(
    st.lists(running_request, min_size=1, max_size=20),
    st.sets(st.sampled_from(TENANTS)),
    weight_table,
    st.sampled_from([None, *BAND_NAMES]),
)
def test_on_one_band_the_victims_are_todays(shapes, waiting, table, band):
    """Every tenant in one band (none named: the default, as without `tenantBands`)."""
    weights = (
        TenantWeights(table)
        if band is None
        else Shares(table, tenant_bands=dict.fromkeys(TENANTS, band))
    )
    running = running_set(shapes)
    assert kv_share.preemption_order(running, waiting, weights) == old_preemption_order(
        running, waiting, weights
    )
    assert make_policy("fcfs", weights=weights).preemption_order(running) == running[::-1]


def headroom_case(shapes, free, block):
    running = running_set(shapes)
    held = sum(r.held_tokens for r in running)
    memory = held + free + 1
    view = EngineSnapshot(
        memory_tokens=memory, running=running, memory_utilization=held / memory, block_size=block
    )
    return running, view


@settings(max_examples=300)
@given(
    st.lists(flow_request, min_size=0, max_size=20),
    st.sets(st.sampled_from(FLOWS)),
    st.sampled_from(FLOWS),
    st.integers(1, 400),
    free_tokens,
    st.sampled_from([1, 16]),
    weight_table,
    band_table,
)
def test_headroom_never_holds_a_request_back_for_a_lower_band(
    shapes, waiting, flow, prompt, free, block, table, bands
):
    shares = Shares(table, tenant_bands=bands)
    running, view = headroom_case(shapes, free, block)
    request = Request("new", flow, prompt, 256)
    active = set(waiting) | {flow}
    answer = kv_share.leaves_headroom(view, request, active, shares)
    own = rank(shares, flow)
    kept = [(r.tenant, r.request.prompt_tokens, r.output_tokens) for r in running]
    without_lower = [shape for shape in kept if rank(shares, shape[0]) <= own]
    _, alone = headroom_case(without_lower, free, block)
    higher = {f for f in active if rank(shares, f) <= own}
    assert kv_share.leaves_headroom(alone, request, higher, shares) == answer
    if not answer:  # held back only above its share of its own band's memory
        members = [r for r in running if shares.band_of(r.tenant) == shares.band_of(flow)]
        band_active = in_band(shares, shares.band_of(flow), active)
        assert excess_of(members, request, band_active, shares)[flow] > 0


@settings(max_examples=300)
@given(
    st.lists(running_request, min_size=0, max_size=20),
    st.sets(st.sampled_from(TENANTS)),
    st.sampled_from(TENANTS),
    st.integers(1, 400),
    free_tokens,
    st.sampled_from([1, 16]),
    weight_table,
    st.sampled_from([None, *BAND_NAMES]),
)
def test_on_one_band_the_headroom_is_todays(
    shapes, waiting, tenant, prompt, free, block, table, band
):
    weights = (
        TenantWeights(table)
        if band is None
        else Shares(table, tenant_bands=dict.fromkeys(TENANTS, band))
    )
    _, view = headroom_case(shapes, free, block)
    request = Request("new", tenant, prompt, 256)
    active = set(waiting) | {tenant}
    assert kv_share.leaves_headroom(view, request, active, weights) == old_leaves_headroom(
        view, request, active, weights
    )


class PreemptionWatch:
    """A simulator engine's listener: at each preemption, the band of the victim and the
    bands still running."""

    def __init__(self, shares: Shares) -> None:
        self.shares = shares
        self.preemptions: list[tuple[int, set[int]]] = []
        self.completed = 0

    def admitted(self, engine: SimEngine, request: Request) -> None:
        pass

    def preempted(self, engine: SimEngine, request: Request) -> None:
        running = {rank(self.shares, r.tenant) for r in engine.running}
        self.preemptions.append((rank(self.shares, request.tenant), running))

    def finished(self, engine: SimEngine, completion: object) -> None:
        self.completed += 1

    def evicted(self, engine: SimEngine, tokens: object, keep: int) -> None:
        pass


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(FLOWS), st.integers(16, 200), st.integers(8, 120)),
        min_size=4,
        max_size=24,
    ),
    st.sampled_from(["vtc", "dlpm", "fcfs"]),
    band_table,
)
def test_the_simulators_engine_preempts_the_lowest_band_running(loads, policy, bands):
    shares = Shares(tenant_bands=bands)
    watch = PreemptionWatch(shares)
    engine = SimEngine(
        make_policy(policy, weights=shares), memory_tokens=600, block_size=16, listener=watch
    )
    for index, (flow, prompt, output) in enumerate(loads):
        request = Request(f"r{index}", flow, prompt, output)
        engine.submit(request, [index * 1000 + token for token in range(prompt)], output)
    for _ in range(20_000):
        if engine.idle():
            break
        engine.step()
    assert watch.completed == len(loads)
    for victim, still_running in watch.preemptions:
        assert all(victim >= other for other in still_running), (victim, still_running)
