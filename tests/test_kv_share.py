"""The rules that share KV memory by weight (`fairpool.sched.kv_share`), checked by random
search over running sets, waiting tenants and weights:

- victims come from the tenants furthest above their share first, each tenant's youngest
  request first, and a request is preempted only after every request of each tenant
  further above its share;
- headroom: an admission is refused only for a tenant that would go above its share.

And on the simulator's engine, under memory far too small for the load: every request of
every tenant finishes (holding back and preempting by share never livelock), whatever the
weights.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.sched import EngineSnapshot, Request, Running, TenantWeights, kv_share
from fairpool.sim.engine import StepTime
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
