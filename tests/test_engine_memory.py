"""KV memory in the engine model: paged admission with recompute-preemption, reserve
admission, memory-safe policies (seed 002) that never need preemption, and the
α-protection baselines."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.sched import Request, make_policy
from fairpool.sim.engine import SimEngine

pytestmark = pytest.mark.unit


def unique_tokens(index: int, length: int) -> list[int]:
    return [index * 100_000 + i for i in range(length)]


def serve(engine: SimEngine, specs, check_memory: bool = True, steps: int = 200_000):
    """Submit (tenant, prompt, output) requests at once and run until done."""
    for index, (tenant, prompt, output) in enumerate(specs):
        engine.submit(
            Request(f"r{index}", tenant, prompt, output), unique_tokens(index, prompt), output
        )
    for _ in range(steps):
        if engine.idle():
            return
        engine.step()
        if check_memory:
            assert engine.memory_used <= engine.memory_tokens
    raise AssertionError("did not drain")


def test_paged_engine_preempts_recomputes_and_never_double_charges():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=600, token_budget=256)
    specs = [("ab"[i % 2], 50, 150) for i in range(12)]
    serve(engine, specs)
    assert engine.preemptions > 0
    assert len(engine.completions) == 12
    assert all(c.output_tokens == 150 for c in engine.completions)
    assert any(c.preemptions for c in engine.completions)
    expected = sum(50 + 2 * 150 for _ in range(6))  # each prompt charged once, each token once
    assert engine.policy.served["a"] == expected
    assert engine.policy.served["b"] == expected
    assert engine.peak_memory <= 600


def test_reserve_admission_never_preempts():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=600, admission="reserve")
    serve(engine, [("a", 50, 150) for _ in range(12)])
    assert engine.preemptions == 0 and len(engine.completions) == 12


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(1, 120), st.integers(1, 150)),
        min_size=1,
        max_size=25,
    ),
    st.integers(300, 1200),
    st.sampled_from(["mcsf", "dlpm+memsafe", "vtc+memsafe", "fcfs+memsafe"]),
    st.sampled_from([1, 16]),  # tokens per KV block: vLLM allocates 16 at a time
)
def test_memory_safe_policies_never_exceed_memory_nor_preempt(specs, memory, name, block_size):
    engine = SimEngine(
        make_policy(name), memory_tokens=memory, token_budget=256, block_size=block_size
    )
    serve(engine, specs)
    assert engine.preemptions == 0
    assert engine.peak_memory <= memory
    assert len(engine.completions) == len(specs)


def test_alpha_protection_greedy_clears_everything_on_overflow():
    policy = make_policy("alpha_protection", alpha=0.1)
    engine = SimEngine(policy, memory_tokens=600, token_budget=256)
    cleared = []
    original = engine._preempt

    def record(running):
        cleared.append(len(engine.running))
        original(running)

    engine._preempt = record
    serve(engine, [("a", 40, 200) for _ in range(8)])
    assert cleared, "no overflow happened"
    assert len(engine.completions) == 8
    # each clearing pass empties the engine: the first victim saw everyone running
    assert max(cleared) >= 2


def test_alpha_protection_admits_only_below_the_watermark():
    policy = make_policy("alpha_protection", alpha=0.5)
    engine = SimEngine(policy, memory_tokens=1000, token_budget=4096)
    for index in range(5):
        engine.submit(Request(f"r{index}", "a", 200, 10), unique_tokens(index, 200), 10)
    engine.step()
    assert len(engine.running) == 2  # 2 × 200 ≤ 500 < 3 × 200


def test_alpha_protection_beta_clearing_drains():
    policy = make_policy("alpha_protection", alpha=0.1, beta=0.3, seed=1)
    engine = SimEngine(policy, memory_tokens=600, token_budget=256)
    serve(engine, [("a", 40, 200) for _ in range(8)])
    assert len(engine.completions) == 8


def test_sarathi_chunks_prefills_under_its_budget():
    engine = SimEngine(make_policy("sarathi"), memory_tokens=10_000, token_budget=4096)
    engine.submit(Request("long", "a", 2000, 5), unique_tokens(1, 2000), 5)
    plan = engine.step()
    assert plan.tokens == 512


def test_evictable_cache_counts_as_free_in_utilisation():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=1000)
    serve(engine, [("a", 400, 2)])
    assert engine.memory_used == 400  # the prompt stays cached after the request
    assert engine.memory_in_use == 0 and engine.memory_utilization == 0


def test_a_policy_that_refuses_an_empty_engine_stalls_instead_of_spinning():
    from fairpool.sim.fleet import Fleet, FleetConfig
    from fairpool.sim.trace import TraceRequest

    # alpha = 0.9 admits nothing whose prompt is over 10 % of memory: an empty engine
    # with requests waiting and nothing to do until something else arrives.
    config = FleetConfig(policy="alpha_protection", memory_tokens=1000)
    fleet = Fleet(config)
    fleet.engines[0].policy.alpha = 0.9
    trace = [
        TraceRequest(0.0, "a", ((None, 500),), 5, 5),
        TraceRequest(1.0, "a", ((None, 50),), 5, 5),
    ]
    summary = fleet.run(trace).summary()
    assert fleet.engines[0].stalled
    assert summary["tenants"]["a"]["finished"] == 0  # FCFS head-of-line blocks the small one


@settings(max_examples=25)
@given(
    st.lists(
        st.tuples(st.sampled_from("ab"), st.integers(1, 120), st.integers(1, 150)),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from([1, 4, 16]),
    st.sampled_from(["paged", "reserve"]),
)
def test_block_allocation_stays_within_memory_and_drains(specs, block_size, admission):
    engine = SimEngine(
        make_policy("fcfs"),
        memory_tokens=800,
        token_budget=256,
        admission=admission,
        block_size=block_size,
    )
    serve(engine, specs)
    assert len(engine.completions) == len(specs)
    assert engine.memory_in_use == 0
    assert engine.memory_used % block_size == 0  # only whole blocks stay cached


def test_private_tokens_occupy_whole_blocks():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=1000, block_size=16)
    engine.submit(Request("r", "a", 40, 3), unique_tokens(0, 40), 3)
    engine.step()  # prefill: 32 tokens (2 full blocks) cached, 8 in a private block
    assert len(engine.cache) == 32
    assert engine.memory_in_use == 32 + 16


def test_prefix_hits_count_whole_blocks_only():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=1000, block_size=16)
    shared = unique_tokens(0, 40)
    engine.submit(Request("first", "a", 40, 1), shared, 1)
    engine.step()
    follow_up = Request("second", "a", 45, 1)
    engine.submit(follow_up, shared + unique_tokens(1, 5), 1)
    assert engine.cached_tokens(follow_up) == 32  # 40 shared tokens, 2 full blocks


def test_a_full_block_aligned_prompt_recomputes_its_last_block():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=1000, block_size=16)
    prompt = unique_tokens(0, 32)
    engine.submit(Request("first", "a", 32, 1), prompt, 1)
    engine.step()
    again = Request("again", "a", 32, 1)
    engine.submit(again, prompt, 1)
    assert engine.cached_tokens(again) == 16
