"""fairpool's vLLM plugin (`fairpool_engine.vllm`) driven through a fake of vLLM 0.32's
scheduler (`tests/fake_vllm`): the events vLLM sends — add, schedule, model output,
abort, preemption, prefix-cache changes, configuration files that change — and the
order, charges and prefix hits that come out. Counted events only, no clocks."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import Plugin, installed
from fake_vllm.engine import FakeEngine
from fake_vllm.kv_cache import HybridKVCacheCoordinator
from fake_vllm.request import RequestStatus
from fake_vllm.scheduler import AsyncScheduler

from fairpool_engine.pooling_tenant import salt_for

pytestmark = pytest.mark.unit

BLOCK = 16


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Plugin]:
    for name in (
        "FAIRPOOL_SCHEDULER_CONFIG",
        "FAIRPOOL_SCHEDULER_POLICY",
        "FAIRPOOL_SCHEDULER_TRACE",
    ):
        monkeypatch.delenv(name, raising=False)
    with installed() as loaded:
        yield loaded


def use_config(monkeypatch: pytest.MonkeyPatch, path: Path, **fields: Any) -> Path:
    """Write the scheduler configuration (a new file each time, as a ConfigMap swaps it)."""
    scratch = path.with_suffix(".new")
    scratch.write_text(json.dumps(fields))
    os.replace(scratch, path)
    monkeypatch.setenv("FAIRPOOL_SCHEDULER_CONFIG", str(path))
    return path


def prompt(seed: int, length: int = 2 * BLOCK) -> list[int]:
    """A prompt that shares no block with another seed's."""
    return [seed * 10_000 + index for index in range(length)]


def admitted_tenants(engine: FakeEngine) -> str:
    return "".join(str(engine.tenants[request_id]) for request_id, _ in engine.admissions)


# ---------------------------------------------------------------------- order


@pytest.mark.parametrize(
    ("config", "order"),
    [
        ({"policy": "fcfs"}, "aaaabb"),
        # VTC: b's counter stays below a's, so b is admitted as soon as it waits.
        ({"policy": "vtc"}, "ababaa"),
        # Weight 2: b pays half per request, so it gets two admissions for a's one.
        ({"policy": "vtc", "tenants": {"b": 2}}, "abbabb"),
    ],
)
def test_admission_order_is_the_policys(plugin, monkeypatch, tmp_path, config, order):
    use_config(monkeypatch, tmp_path / "scheduler.json", **config)
    engine = FakeEngine(plugin, max_num_seqs=1)
    for seed in range(len(order) - order.count("b")):
        engine.add("a", prompt(seed))
    for seed in range(order.count("b")):
        engine.add("b", prompt(100 + seed))
    engine.run()
    assert admitted_tenants(engine) == order


def test_a_request_without_a_tenant_is_the_default_tenants(plugin):
    engine = FakeEngine(plugin)
    engine.add(None, prompt(1), max_tokens=2)
    engine.run()
    assert engine.served("default") == 2 * BLOCK + 2 * 2


# ---------------------------------------------------------------------- charging


def test_prefill_is_charged_for_the_prompt_the_cache_does_not_hold(plugin):
    engine = FakeEngine(plugin)
    first = engine.add("a", prompt(1, 40), max_tokens=3)
    second = engine.add("b", prompt(1, 40), max_tokens=3)  # same prompt: 2 blocks cached
    engine.run()
    assert engine.admissions == [(first, 0), (second, 2 * BLOCK)]
    assert engine.served("a") == 40 + 2 * 3  # extend weight 1, output weight 2
    assert engine.served("b") == (40 - 2 * BLOCK) + 2 * 3
    assert engine.outputs[second] == [900_000, 900_001, 900_002]


def test_output_is_charged_per_token_when_a_step_delivers_several(plugin):
    engine = FakeEngine(plugin, tokens_per_step=3)
    request_id = engine.add("a", prompt(1), max_tokens=7)
    assert engine.run() == 3  # 3 + 3 + 1 tokens (vLLM trims the last step at max_tokens)
    assert len(engine.outputs[request_id]) == 7
    assert engine.served("a") == 2 * BLOCK + 2 * 7


def test_cost_weights_come_from_the_configuration(plugin, monkeypatch, tmp_path):
    cost = {"extendWeight": 3, "outputWeight": 5}
    use_config(monkeypatch, tmp_path / "scheduler.json", policy="vtc", cost=cost)
    engine = FakeEngine(plugin)
    engine.add("a", prompt(1, 20), max_tokens=4)
    engine.run()
    assert engine.served("a") == 3 * 20 + 5 * 4


def test_preempted_requests_are_not_charged_again_and_come_back_first(
    plugin, monkeypatch, tmp_path
):
    use_config(monkeypatch, tmp_path / "scheduler.json", policy="fcfs")
    # 9 usable blocks of 16 tokens; three requests that each grow to 5 blocks.
    engine = FakeEngine(plugin, num_gpu_blocks=10, max_num_seqs=3)
    for seed, tenant in enumerate("aab"):
        engine.add(tenant, prompt(seed, 40), max_tokens=30)
    while not engine.scheduler.num_preemptions:
        engine.step()
    (preempted,) = [r for r in engine.tenants if engine.request(r).num_preemptions]
    late = engine.add(engine.tenants[preempted], prompt(9, 40), max_tokens=30)
    engine.run()
    # Back to the front of the queue: resumed before the request that came later.
    resumed = [index for index, started in enumerate(engine.started) if started == preempted][1]
    assert resumed < engine.started.index(late)
    assert engine.finish_reasons == dict.fromkeys(engine.tenants, "length")
    assert all(len(tokens) == 30 for tokens in engine.outputs.values())
    # Each prompt is charged once, whatever was recomputed; every output token once.
    served = {"a": 0, "b": 0}
    for tenant in engine.tenants.values():
        served[str(tenant)] += 40 + 2 * 30
    assert (engine.served("a"), engine.served("b")) == (served["a"], served["b"])


@pytest.mark.parametrize(("policy", "victim"), [("fcfs", "b"), ("vtc", "a"), ("dlpm", "a")])
def test_a_policy_that_shares_memory_chooses_vllms_victim(
    plugin, monkeypatch, tmp_path, policy, victim
):
    """Tenant a's two requests run, then b's; when they outgrow the memory, vLLM preempts
    the most recently admitted (b's, which leaves a with all of it), a policy that shares
    memory the youngest of the tenant above its share (a's)."""
    use_config(monkeypatch, tmp_path / "scheduler.json", policy=policy)
    engine = FakeEngine(plugin, num_gpu_blocks=10, max_num_seqs=3)
    for seed in range(2):
        engine.add("a", prompt(seed, 40), max_tokens=30)
    engine.step()
    engine.add("b", prompt(2, 40), max_tokens=30)
    while not engine.scheduler.num_preemptions:
        engine.step()
    (preempted,) = [r for r in engine.tenants if engine.request(r).num_preemptions]
    assert engine.tenants[preempted] == victim
    engine.run()
    assert engine.finish_reasons == dict.fromkeys(engine.tenants, "length")


# ---------------------------------------------------------------------- bands

BANDS = {"fast": "interactive", "bulk": "batch"}


def test_a_request_runs_in_its_flow_and_the_higher_band_is_admitted_first(
    plugin, monkeypatch, tmp_path
):
    """bulk (batch) runs; fast (interactive) arrives behind bulk's queue with a request of
    its own band twice and one it asks to run in batch (`fast@batch`): fast's own go
    first, its batch job among bulk's."""
    use_config(monkeypatch, tmp_path / "scheduler.json", policy="vtc", tenantBands=BANDS)
    engine = FakeEngine(plugin, max_num_seqs=1)
    for seed in range(3):
        engine.add("bulk", prompt(seed), max_tokens=8)
    engine.step()
    job = engine.add("fast", prompt(10), max_tokens=2, band="batch")
    own = [engine.add("fast", prompt(11 + seed), max_tokens=2) for seed in range(2)]
    engine.add("bulk", prompt(20), max_tokens=2, band="interactive")  # not above its own
    assert engine.scheduler.policy_requests[job].tenant == "fast@batch"
    engine.run()
    order = [request_id for request_id, _ in engine.admissions]
    assert order[1:3] == own
    assert set(engine.policy.served) == {"bulk", "fast", "fast@batch"}
    assert engine.served("fast@batch") == 2 * BLOCK + 2 * 2


@pytest.mark.parametrize(
    ("bands", "policy", "victim"),
    [
        (BANDS, "fcfs", "bulk"),
        (BANDS, "vtc", "bulk"),
        (BANDS, "dlpm", "bulk"),
        ({}, "fcfs", "fast"),  # vLLM's own: the most recently admitted
    ],
)
def test_victims_come_from_the_lowest_band_running(
    plugin, monkeypatch, tmp_path, bands, policy, victim
):
    """bulk's request runs, then fast's two; when they outgrow the memory, the victim is
    bulk's (the batch band) whatever the policy, where without bands vLLM would take
    fast's. The trace names the victim's band and those still running."""
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("FAIRPOOL_SCHEDULER_TRACE", str(trace))
    use_config(monkeypatch, tmp_path / "scheduler.json", policy=policy, tenantBands=bands)
    engine = FakeEngine(plugin, num_gpu_blocks=10, max_num_seqs=3)
    engine.add("bulk", prompt(0, 40), max_tokens=30)
    engine.step()
    for seed in (1, 2):
        engine.add("fast", prompt(seed, 40), max_tokens=30)
    while not engine.scheduler.num_preemptions:
        engine.step()
    (preempted,) = [r for r in engine.tenants if engine.request(r).num_preemptions]
    assert engine.tenants[preempted] == victim
    engine.run()
    assert engine.finish_reasons == dict.fromkeys(engine.tenants, "length")
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    preemptions = [event for event in events if event["event"] == "preempt"]
    assert preemptions[0]["tenant"] == victim
    if bands:
        for event in preemptions:  # never a request of a band while a lower one runs
            assert event["band"] == "batch" or "batch" not in event["running_bands"], event
        assert {e["band"] for e in events if e["event"] == "add"} == {"batch", "interactive"}


def test_a_pooling_request_runs_in_the_band_its_salt_carries(plugin, monkeypatch, tmp_path):
    use_config(monkeypatch, tmp_path / "scheduler.json", tenantBands={"acme": "interactive"})
    engine = FakeEngine(plugin, runner_type="pooling")
    engine.add(None, prompt(1, 40), pooling=True, cache_salt=salt_for("acme", band="batch"))
    engine.add(None, prompt(1, 40), pooling=True, cache_salt=salt_for("acme"))
    engine.run()
    # The band is part of the salt: the two share no cached prefix.
    assert engine.served("acme@batch") == 40 and engine.served("acme") == 40


def test_a_blocked_request_vllm_skips_is_charged_once_and_keeps_its_place(plugin):
    engine = FakeEngine(plugin, max_num_seqs=4)
    blocked = engine.add(
        "a", prompt(1), max_tokens=2, status=RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    )
    other = engine.add("b", prompt(2), max_tokens=2)
    for _ in range(3):  # skipped (popped and given back) every step
        engine.step()
    assert [request_id for request_id, _ in engine.admissions] == [other]
    assert engine.served("a") == 2 * BLOCK  # paid at the first skip, not at each
    later = engine.add("a", prompt(3), max_tokens=2)
    engine.request(blocked).status = RequestStatus.WAITING  # its grammar is ready
    engine.run()
    assert [request_id for request_id, _ in engine.admissions] == [other, blocked, later]
    assert engine.served("a") == 2 * (2 * BLOCK + 2 * 2)


def test_a_pooling_request_is_charged_to_the_tenant_its_salt_carries_for_its_prompt_only(plugin):
    """An embedding through vLLM: no sampling parameters, the tenant in `cache_salt` (the
    middleware puts it there), no output token; the salt keeps tenants' caches apart."""
    engine = FakeEngine(plugin, runner_type="pooling")
    first = engine.add(None, prompt(1, 40), pooling=True, cache_salt=salt_for("acme"))
    engine.run()
    again = engine.add(None, prompt(1, 40), pooling=True, cache_salt=salt_for("acme"))
    other = engine.add(None, prompt(1, 40), pooling=True, cache_salt=salt_for("globex"))
    engine.run()
    assert engine.finish_reasons == dict.fromkeys((first, again, other), "stop")
    assert all(engine.outputs[r] == [] for r in (first, again, other))
    assert dict(engine.admissions) == {first: 0, again: 2 * BLOCK, other: 0}
    assert engine.served("acme") == 40 + (40 - 2 * BLOCK)
    assert engine.served("globex") == 40 and engine.served("default") == 0


# ---------------------------------------------------------------------- aborts


def test_aborted_requests_leave_the_policy_and_keep_what_they_were_charged(plugin):
    engine = FakeEngine(plugin, max_num_seqs=1)
    running = engine.add("a", prompt(1), max_tokens=50)
    waiting = engine.add("a", prompt(2), max_tokens=50)
    for _ in range(3):
        engine.step()
    policy = engine.policy
    assert (policy.tenant_running("a"), policy.tenant_waiting("a")) == (1, 1)
    engine.abort(waiting)
    assert (policy.tenant_running("a"), policy.tenant_waiting("a")) == (1, 0)
    engine.abort(running)
    assert (policy.running_count, policy.waiting_count) == (0, 0)
    assert engine.scheduler.policy_requests == {}
    assert engine.served("a") == 2 * BLOCK + 2 * 3  # its prefill and 3 tokens
    assert engine.run() == 0


# ---------------------------------------------------------------------- prefix hits


def test_longest_prefix_match_admits_the_request_the_cache_serves_first(
    plugin, monkeypatch, tmp_path
):
    use_config(monkeypatch, tmp_path / "scheduler.json", policy="lpm")
    engine = FakeEngine(plugin, max_num_seqs=1)
    shared = prompt(7, 4 * BLOCK)
    engine.add("a", shared, max_tokens=2)
    engine.run()  # the shared prefix is cached now
    engine.add("a", prompt(8, 4 * BLOCK), max_tokens=2)  # sent first, nothing cached
    hit = engine.add("b", [*shared, 1, 2, 3], max_tokens=2)
    engine.run()
    assert engine.admissions[1] == (hit, 4 * BLOCK)


def test_followed_hits_equal_fresh_lookups_through_cache_churn_and_a_reset(
    plugin, monkeypatch, tmp_path
):
    """Conversations whose turns extend each other, on a cache of 12 blocks: blocks are
    stored and evicted all the time, and every hit the plugin follows must equal what
    vLLM's own lookup says at every pick."""
    use_config(monkeypatch, tmp_path / "scheduler.json", policy="dlpm", quantum=64)
    engine = FakeEngine(plugin, num_gpu_blocks=13, max_num_seqs=3, max_num_batched_tokens=128)
    scheduler, counts = engine.scheduler, Counter[str]()
    manager = scheduler.kv_cache_manager

    def checked_next_request(view: Any, next_request: Any = engine.policy.next_request) -> Any:
        for request_id, followed in scheduler.view.followed_hits().items():
            fresh = manager.get_computed_blocks(scheduler.requests[request_id])[1]
            counts["checked"] += 1
            counts["nonzero"] += fresh > 0
            counts["mismatched"] += followed != fresh
        return next_request(view)

    engine.policy.next_request = checked_next_request
    block_map = plugin.compat.ObservedBlockMap
    insert, pop = block_map.insert, block_map.pop

    def counted_insert(self: Any, key: bytes, block: Any) -> None:
        counts["stored"] += 1
        insert(self, key, block)

    def counted_pop(self: Any, key: bytes, block_id: int) -> Any:
        counts["dropped"] += 1
        return pop(self, key, block_id)

    monkeypatch.setattr(block_map, "insert", counted_insert)
    monkeypatch.setattr(block_map, "pop", counted_pop)
    added = 0
    for step in range(160):
        while len(scheduler.waiting) < 8:
            tenant, turn = added % 4, (added // 4) % 3
            system = prompt(tenant, 2 * BLOCK)
            turns = [token for t in range(turn + 1) for token in prompt(50 + 10 * tenant + t, 16)]
            # Every other prompt is whole blocks: the same as an earlier one, all cached.
            unique = [99_000 + added] if added % 2 else []
            engine.add(f"t{tenant}", [*system, *turns, *unique], max_tokens=4)
            added += 1
        engine.step()
        if step == 80:
            engine.run()  # drain, then empty the cache: vLLM replaces its block map
            assert scheduler.reset_prefix_cache()
            counts["reset"] += 1
    assert counts["reset"] == 1 and counts["stored"] > 50 and counts["dropped"] > 20
    assert counts["checked"] > 200 and counts["nonzero"] > 50
    assert counts["mismatched"] == 0


def test_a_steady_queue_costs_no_prefix_lookups(plugin, monkeypatch, tmp_path):
    """Requests wait for KV memory behind a long one, and vLLM peeks at the queue at every
    step: their hits are looked up once, then followed (the blocks the running request
    stores are none of theirs)."""
    use_config(monkeypatch, tmp_path / "scheduler.json", policy="dlpm")
    counts = Counter[str]()
    lookup = plugin.scheduler.prefix_lookup

    def counted(*args: Any) -> Any:
        counts["lookups"] += 1
        return lookup(*args)

    monkeypatch.setattr(plugin.scheduler, "prefix_lookup", counted)
    engine = FakeEngine(plugin, num_gpu_blocks=8)  # 7 usable blocks
    first = engine.add("a", prompt(1, 64), max_tokens=40)  # grows to 7 blocks
    for seed in range(2, 7):  # 4 blocks each: none fits beside it
        engine.add(f"t{seed}", prompt(seed, 64), max_tokens=2)
    next_request = engine.policy.next_request

    def counted_pick(view: Any) -> Any:
        counts["picks"] += 1
        return next_request(view)

    engine.policy.next_request = counted_pick
    engine.step()
    assert counts["lookups"] == 6  # each request once, at the first pick
    for _ in range(30):
        engine.step()
    assert engine.admissions == [(first, 0)] and counts["picks"] > 30
    assert counts["lookups"] == 6


def test_where_the_cache_cannot_be_followed_hits_are_looked_up_again_periodically(
    plugin, monkeypatch, tmp_path
):
    use_config(monkeypatch, tmp_path / "scheduler.json", policy="lpm")
    refresh = plugin.scheduler.HIT_REFRESH_STEPS
    engine = FakeEngine(plugin, num_gpu_blocks=10, kv_cache_coordinator=HybridKVCacheCoordinator)
    shared = prompt(3, 3 * BLOCK)
    engine.add("a", [*shared, *prompt(4, BLOCK)], max_tokens=refresh + 8)  # grows to 7 blocks
    engine.step()
    waiting = engine.add("b", [*shared, *prompt(5, 5 * BLOCK)], max_tokens=2)  # waits for memory
    engine.step()
    view = engine.scheduler.view
    assert view.followed_hits() == {waiting: 3 * BLOCK}
    # The cache changes in a way the plugin cannot see: the hit stays as looked up ...
    engine.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block._cache.clear()
    while engine.steps + 1 < refresh:
        engine.step()
        assert view.followed_hits() == {waiting: 3 * BLOCK}
    engine.step()  # ... until the refresh looks it up again
    assert view.followed_hits() == {waiting: 0}
    engine.run()
    assert engine.admissions[-1] == (waiting, 0)
    assert engine.served("b") == 8 * BLOCK + 2 * 2


# ---------------------------------------------------------------------- memory-safe admission


@pytest.mark.parametrize(("policy", "preempts"), [("vtc", True), ("vtc+memsafe", False)])
def test_memory_safe_admission_keeps_vllm_from_preempting(
    plugin, monkeypatch, tmp_path, policy, preempts
):
    """Four requests that each grow to 70 tokens on 9 blocks of 16 (144 tokens): two fit in
    tokens (140) but not in blocks (2 × 5); memory-safe admission must count blocks."""
    use_config(monkeypatch, tmp_path / "scheduler.json", policy=policy)
    engine = FakeEngine(plugin, num_gpu_blocks=10, max_num_seqs=4)
    for seed, tenant in enumerate("abab"):
        engine.add(tenant, prompt(seed, 40), max_tokens=30)
    engine.run()
    assert (engine.scheduler.num_preemptions > 0) is preempts
    assert engine.finish_reasons == dict.fromkeys(engine.tenants, "length")


# ---------------------------------------------------------------------- configuration


def test_a_new_configuration_file_takes_effect_between_steps(plugin, monkeypatch, tmp_path):
    config = use_config(monkeypatch, tmp_path / "scheduler.json", policy="fcfs")
    engine = FakeEngine(plugin, max_num_seqs=1)
    engine.scheduler.live.check_interval = 0.0  # look at the file at every step
    shared = prompt(4, 3 * BLOCK)
    engine.add("a", shared, max_tokens=2)
    engine.run()
    engine.add("a", prompt(5), max_tokens=6)  # runs while the file changes
    engine.step()
    cold = engine.add("a", prompt(6), max_tokens=2)
    warm = engine.add("b", [*shared, 1], max_tokens=2)
    policy = engine.policy
    use_config(monkeypatch, config, policy="fcfs", tenants={"b": 3})  # weights only
    engine.step()
    assert engine.policy is policy and policy.weights["b"] == 3
    (tmp_path / "bad.json").write_text('{"policy": "nope"}')
    os.replace(tmp_path / "bad.json", config)  # refused: the last good one stays
    engine.step()
    assert engine.scheduler.live.reloads == {"applied": 1, "rejected": 1}
    use_config(monkeypatch, config, policy="lpm")  # a new policy takes the queue over
    engine.run()
    assert engine.scheduler.live.config.policy_name == "lpm"
    assert [request_id for request_id, _ in engine.admissions[-2:]] == [warm, cold]
    assert engine.served("b") == 1 + 2 * 2  # its 3 cached blocks were free


def test_the_plugin_refuses_a_vllm_it_was_not_written_for(monkeypatch):
    monkeypatch.delenv("FAIRPOOL_ALLOW_UNTESTED_VLLM", raising=False)
    with installed(version="0.33.0") as plugin:
        with pytest.raises(RuntimeError, match=r"supports vLLM .*0\.33.*found 0\.33\.0"):
            FakeEngine(plugin)
        monkeypatch.setenv("FAIRPOOL_ALLOW_UNTESTED_VLLM", "1")
        assert FakeEngine(plugin).scheduler.vllm_version == "0.33.0"


@pytest.mark.parametrize(
    ("version", "starts"),
    [("0.32.0", True), ("0.32.4", True), ("0.32.1+cpu", True), ("0.31.9", False),
     ("0.33.0rc1", False), ("1.0.0", False), ("unknown", False)],
)  # fmt: skip
def test_the_plugin_starts_on_the_patch_releases_of_its_vllm(monkeypatch, version, starts):
    monkeypatch.delenv("FAIRPOOL_ALLOW_UNTESTED_VLLM", raising=False)
    with installed(version=version) as plugin:
        if starts:
            assert FakeEngine(plugin).scheduler.vllm_version == version
        else:
            with pytest.raises(RuntimeError, match="allowUntestedVllm"):
                FakeEngine(plugin)


def test_the_plugin_refuses_a_scheduler_without_the_methods_it_overrides(plugin, monkeypatch):
    base = plugin.compat.Scheduler
    monkeypatch.delattr(base, "_get_local_prefix_cache_hit")
    with pytest.raises(RuntimeError, match="_get_local_prefix_cache_hit"):
        FakeEngine(plugin)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_fair_scheduler_takes_the_base_vllm_would_use(plugin, async_scheduling):
    engine = FakeEngine(plugin, async_scheduling=async_scheduling)
    assert isinstance(engine.scheduler, AsyncScheduler) is async_scheduling
    assert isinstance(engine.scheduler, plugin.scheduler.FairSchedulingMixin)
    assert isinstance(engine.scheduler.waiting, plugin.request_queue.PolicyRequestQueue)
