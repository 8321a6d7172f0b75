"""The virtual-time engine model and the demo built on it."""

from __future__ import annotations

import pytest

from fairpool.sched import ConfigError, Request, make_policy
from fairpool.sim import demo
from fairpool.sim.engine import SimEngine
from fairpool.sim.metrics import jain_index

pytestmark = pytest.mark.unit


def run_until_idle(engine: SimEngine, limit: int = 100_000) -> None:
    for _ in range(limit):
        if engine.idle():
            return
        engine.step()
    raise AssertionError("engine did not drain")


def test_requests_sharing_a_prefix_hit_the_cache_and_pay_less():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=5000)
    shared = list(range(1000))
    engine.submit(Request("first", "a", 1010, 4), shared + [5000 + i for i in range(10)], 4)
    run_until_idle(engine)
    engine.submit(Request("second", "a", 1010, 4), shared + [6000 + i for i in range(10)], 4)
    run_until_idle(engine)
    first, second = engine.completions
    assert first.cached_tokens == 0
    assert second.cached_tokens == 1000
    assert engine.policy.served["a"] == pytest.approx((1010 + 10) + 2 * 8)


@pytest.mark.parametrize("known", [True, False])
def test_a_finished_requests_generated_tokens_are_cached_when_their_ids_are_known(known):
    """A child prompt that continues its parent's prompt with the parent's output (a tree
    of thoughts, a chat's next turn) hits the parent's generated tokens too, in full
    blocks of the KV the parent computed (all but its last token). Without the ids the
    hit stops at the parent's prompt."""
    engine = SimEngine(make_policy("fcfs"), memory_tokens=5000, block_size=16)
    prompt = list(range(100))
    thought = [10_000 + i for i in range(60)]
    engine.submit(Request("parent", "a", 100, 60), prompt, 60, thought if known else ())
    run_until_idle(engine)
    child = prompt + thought + [20_000 + i for i in range(8)]
    engine.submit(Request("child", "a", len(child), 4), child, 4)
    run_until_idle(engine)
    hit = engine.completions[-1].cached_tokens
    assert hit == ((100 + 60 - 1) // 16 * 16 if known else 100 // 16 * 16)
    assert engine.memory_used <= engine.memory_tokens


def test_output_ids_must_cover_the_output():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=5000)
    with pytest.raises(ConfigError) as error:
        engine.submit(Request("x", "a", 10, 8), list(range(10)), 8, [1, 2, 3])
    assert error.value.parameter == "output_ids"


def test_memory_is_never_overcommitted_and_everything_finishes():
    engine = SimEngine(make_policy("dlpm"), memory_tokens=2000, token_budget=256)
    for index in range(40):
        tokens = [index * 1000 + i for i in range(300)]
        engine.submit(Request(f"r{index}", "ab"[index % 2], 300, 50), tokens, 50)
    for _ in range(100_000):
        if engine.idle():
            break
        engine.step()
        assert engine.memory_used <= engine.memory_tokens
    assert len(engine.completions) == 40
    assert all(c.output_tokens == 50 for c in engine.completions)


def test_a_request_that_can_never_fit_is_refused_with_the_field_named():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=100)
    with pytest.raises(ConfigError) as error:
        engine.submit(Request("x", "a", 50, 60), list(range(50)), 10)
    assert error.value.parameter == "max_tokens"


def test_demo_fair_policies_split_overload_evenly_and_fcfs_does_not():
    shares = {
        name: {t.tenant: t.share for t in demo.run("overload", name, duration=40).tenants}
        for name in ("fcfs", "vtc", "dlpm")
    }
    assert shares["fcfs"]["a"] > 0.6
    assert abs(shares["vtc"]["a"] - 0.5) < 0.06
    assert abs(shares["dlpm"]["a"] - 0.5) < 0.06


def test_demo_dlpm_keeps_locality_that_vtc_loses():
    vtc = demo.run("shared-prefix", "vtc", duration=30)
    dlpm = demo.run("shared-prefix", "dlpm", duration=30)
    assert dlpm.cache_hit_rate > vtc.cache_hit_rate + 0.2
    assert dlpm.throughput > 2 * vtc.throughput
    assert dlpm.jain_index > 0.98


@pytest.mark.parametrize("seed", [0, 1])
def test_demo_priority_bands_cut_the_interactive_tail_under_a_batch_flood(seed):
    result = demo.run_priority("dlpm", duration=30, seed=seed)
    assert (result.scenario, result.policy) == ("priority", "dlpm")
    assert [run.label for run in result.runs] == ["on", "off", "alone"]
    on, off, alone = result.runs
    bands = {run.label: {t.tenant: t.band for t in run.tenants} for run in result.runs}
    assert bands == {
        "on": {"chat": "interactive", "bulk": "batch"},
        "off": {"chat": "standard", "bulk": "standard"},
        "alone": {"chat": "interactive"},
    }
    chat = {run.label: run.tenant("chat") for run in result.runs}
    bulk = {run.label: run.tenant("bulk") for run in result.runs}
    assert all(tenant is not None for tenant in (*chat.values(), bulk["on"], bulk["off"]))
    # the same arrivals in every run, far below chat's equal share
    assert len({tenant.sent for tenant in chat.values()}) == 1
    assert chat["off"].share < 0.25 and bulk["off"].throughput > 0
    for run in (on, off, alone):
        assert len(run.interactive_ttfts) == run.tenant("chat").finished
    # in virtual time, given the seed: bands put chat's waiting requests first
    assert alone.tenant("chat").ttft_p99 <= chat["on"].ttft_p99 <= chat["off"].ttft_p99
    # every sentence comes from the numbers
    p99 = (chat["off"].ttft_p99, chat["on"].ttft_p99, chat["alone"].ttft_p99)
    assert result.findings[0] == (
        f"priority cut chat's TTFT p99 from {demo.milliseconds(p99[0])} to "
        f"{demo.milliseconds(p99[1])} (alone: {demo.milliseconds(p99[2])})"
    )
    assert f"{bulk['on'].throughput:,.0f} tokens/s with priority" in result.findings[-1]


def test_demo_priority_findings_follow_the_numbers():
    def run(label, p99, share=0.1, throughput=100.0):
        chat = demo.BandTenant("chat", "standard", 10, 10, share, p99, p99, 1.0)
        bulk = demo.BandTenant("bulk", "standard", 10, 10, 1 - share, 1.0, 2.0, throughput)
        return demo.PriorityRun(label, [bulk, chat] if label != "alone" else [chat], [])

    same = demo.priority_findings([run("on", 0.5), run("off", 0.5), run("alone", 0.1)])
    assert same[0] == "priority left chat's TTFT p99 at 500 ms (alone: 100 ms)"
    worse = demo.priority_findings(
        [run("on", 2.0, throughput=90.0), run("off", 0.5), run("alone", 0.1)]
    )
    assert worse[0] == "priority raised chat's TTFT p99 from 500 ms to 2,000 ms (alone: 100 ms)"
    assert worse[-1] == "bulk's throughput: 90 tokens/s with priority, 100 without (-10.0%)"


def test_jain_index_bounds():
    assert jain_index([1, 1, 1]) == pytest.approx(1)
    assert jain_index([1, 0, 0]) == pytest.approx(1 / 3)


def test_abort_a_waiting_request_leaves_the_queue():
    engine = SimEngine(make_policy("vtc"), memory_tokens=1000)
    engine.submit(Request("big", "a", 900, 10), list(range(900)), 10)
    engine.submit(Request("queued", "b", 200, 10), list(range(1000, 1200)), 10)
    engine.step()  # "big" runs; "queued" does not fit yet
    assert engine.policy.waiting_count == 1
    assert engine.abort("queued")
    assert engine.policy.waiting_count == 0
    assert engine.policy.tenant_waiting("b") == 0
    run_until_idle(engine)
    assert [c.request.request_id for c in engine.completions] == ["big"]


def test_abort_a_running_request_releases_its_memory_and_keeps_its_charge():
    engine = SimEngine(make_policy("dlpm"), memory_tokens=2000, block_size=16)
    engine.submit(Request("gone", "a", 100, 50), list(range(100)), 50)
    engine.submit(Request("stays", "b", 100, 50), list(range(500, 600)), 50)
    for _ in range(5):
        engine.step()
    charged = engine.policy.served["a"]
    assert charged > 0
    assert engine.abort("gone")
    assert [r.request_id for r in engine.running] == ["stays"]
    assert not engine.policy.is_active("a")
    assert engine.policy.served["a"] == charged
    run_until_idle(engine)
    assert engine.memory_in_use == 0 and engine.cache.locked_tokens == 0
    assert engine.policy.running_count == 0 and engine.policy.waiting_count == 0
    assert [c.request.request_id for c in engine.completions] == ["stays"]


def test_abort_of_an_unknown_or_finished_request_is_a_no_op():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=1000)
    assert not engine.abort("never")
    engine.submit(Request("done", "a", 10, 2), list(range(10)), 2)
    run_until_idle(engine)
    assert not engine.abort("done")
    assert engine.idle()


def test_abort_a_preempted_request():
    engine = SimEngine(make_policy("fcfs"), memory_tokens=300)
    for index in range(3):
        tokens = [index * 1000 + i for i in range(90)]
        engine.submit(Request(f"r{index}", "a", 90, 100), tokens, 100)
    while engine.preemptions == 0:
        engine.step()
    waiting = [entry.request.request_id for entry in engine.policy.waiting()]
    assert waiting
    for request_id in waiting:
        assert engine.abort(request_id)
    run_until_idle(engine)
    assert engine.memory_in_use == 0 and engine.policy.waiting_count == 0
    assert len(engine.completions) == 3 - len(waiting)


def test_a_prefill_only_request_finishes_at_its_prefill_charged_for_the_uncached_prompt():
    """An embedding: no output token, no decode step, the prefix cache serves a repeat."""
    engine = SimEngine(make_policy("vtc"), memory_tokens=5000, block_size=16)
    prompt = list(range(100))
    engine.submit(Request("first", "a", 100, 1), prompt, 0)
    run_until_idle(engine)
    steps = engine.steps
    engine.submit(Request("again", "a", 100, 1), prompt, 0)
    run_until_idle(engine)
    first, again = engine.completions
    assert (first.output_tokens, again.output_tokens) == (0, 0)
    assert again.cached_tokens == 96  # whole blocks
    assert engine.steps - steps == 1  # one prefill step, no decode
    assert engine.policy.served["a"] == pytest.approx(100 + (100 - 96))
    assert engine.memory_in_use == 0 and engine.policy.running_count == 0
