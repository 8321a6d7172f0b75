"""One batching step (fairpool.sched.batch) and SLAI's decode deferral (seed 004 §6)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from helpers import request

from fairpool.sched import SLO, Request, Running, form_batch, make_policy
from fairpool.sched.errors import ConfigError
from fairpool.sched.policies import SLAI

pytestmark = pytest.mark.unit


@dataclass
class Engine:
    """A minimal BatchingEngine: memory = Σ (prompt + max_tokens) of running requests."""

    memory_tokens: int = 10_000
    running: list[Running] = field(default_factory=list)
    now: float = 0.0
    mean_batch_time: float = 0.02
    memory_utilization: float = 0.5
    hits: dict[str, int] = field(default_factory=dict)
    block_size: int = 1

    def cached_tokens(self, req: Request) -> int:
        return self.hits.get(req.request_id, 0)

    def hit_epoch(self, tenant: str) -> int | None:
        return None

    def try_admit(self, req: Request, cached_tokens: int) -> Running | None:
        used = sum(r.request.prompt_tokens + r.request.max_tokens for r in self.running)
        if used + req.prompt_tokens + req.max_tokens > self.memory_tokens:
            return None
        started = Running(req, prefill_remaining=max(req.prompt_tokens - cached_tokens, 1))
        self.running.append(started)
        return started


def decoding(tenant="a", tbt=None, last_end=0.0, rid=None):
    slo = SLO(tbt=tbt) if tbt else None
    req = Request(rid or f"d-{tenant}-{tbt}-{last_end}", tenant, 10, 10, slo=slo)
    return Running(req, output_tokens=1, last_step_end=last_end)


# ---------------------------------------------------------------- form_batch, any policy


def test_running_decodes_first_then_prefills_under_the_token_budget():
    engine = Engine(running=[decoding(rid="d1"), decoding(rid="d2")])
    policy = make_policy("fcfs")
    for rid in ("p1", "p2"):
        policy.add(request(prompt=60, max_tokens=5, request_id=rid))
    plan = form_batch(policy, engine, token_budget=100)
    assert [r.request_id for r in plan.decodes] == ["d1", "d2"]
    assert [(r.request_id, chunk) for r, chunk in plan.prefills] == [("p1", 60), ("p2", 38)]
    assert plan.tokens == 100
    assert policy.waiting_count == 0  # both admitted; p2 continues next step


def test_admission_stops_at_the_first_request_that_does_not_fit():
    engine = Engine(memory_tokens=100)
    policy = make_policy("fcfs")
    policy.add(request(prompt=80, max_tokens=10, request_id="big"))
    policy.add(request(prompt=80, max_tokens=10, request_id="blocked"))
    policy.add(request(prompt=1, max_tokens=1, request_id="small"))
    plan = form_batch(policy, engine, token_budget=1000)
    assert [r.request_id for r in plan.admitted] == ["big"]
    assert policy.waiting_count == 2  # head-of-line: "small" waits behind "blocked"


def test_continuing_prefill_chunks_come_before_new_admissions():
    started = Running(request(prompt=500, request_id="half"), prefill_remaining=300)
    engine = Engine(running=[started])
    policy = make_policy("fcfs")
    policy.add(request(prompt=50, request_id="new"))
    plan = form_batch(policy, engine, token_budget=320)
    assert [(r.request_id, c) for r, c in plan.prefills] == [("half", 300), ("new", 20)]


def test_prefix_hits_are_charged_only_for_uncached_tokens():
    engine = Engine(hits={"x": 70})
    policy = make_policy("vtc")
    policy.add(request("t", prompt=100, request_id="x"))
    plan = form_batch(policy, engine, token_budget=1000)
    assert plan.prefills[0][1] == 30
    assert policy.served["t"] == 30


# ---------------------------------------------------------------- SLAI


def test_slai_holds_back_decodes_until_their_tbt_deadline_nears():
    policy = SLAI(offset=10.0)
    paying = decoding("p", tbt=0.1, last_end=1.0, rid="paying")
    free = decoding("f", tbt=0.5, last_end=1.0, rid="free")
    engine = Engine(running=[free, paying], now=1.05, mean_batch_time=0.02)
    due, deferred = policy.split_decodes(engine)
    # paying: 1.0 + 0.1 - 10 * 0.02 = 0.9 <= 1.05 (due); free: 1.0 + 0.5 - 0.2 = 1.3 > 1.05
    assert [r.request_id for r in due] == ["paying"]
    assert [r.request_id for r in deferred] == ["free"]
    engine.now = 1.3
    due, _ = policy.split_decodes(engine)
    assert {r.request_id for r in due} == {"paying", "free"}


def test_slai_orders_due_decodes_by_deadline():
    policy = SLAI()
    late = decoding(tbt=0.5, last_end=0.0, rid="late")
    early = decoding(tbt=0.1, last_end=0.0, rid="early")
    engine = Engine(running=[late, early], now=10.0)
    due, _ = policy.split_decodes(engine)
    assert [r.request_id for r in due] == ["early", "late"]


def test_slai_dynamic_offset_follows_memory_utilisation():
    policy = SLAI(offset="dynamic")
    assert policy.current_offset(Engine(memory_utilization=0.5)) == 5.0
    assert policy.current_offset(Engine(memory_utilization=0.97)) == 10.0


def test_slai_requests_without_tbt_are_always_due_unless_a_default_is_set():
    engine = Engine(running=[decoding(rid="plain", last_end=5.0)], now=5.0)
    assert [r.request_id for r in SLAI().split_decodes(engine)[0]] == ["plain"]
    assert SLAI(default_tbt=1.0).split_decodes(engine)[0] == []


def test_slai_prefills_shortest_first_and_respects_the_active_cap():
    policy = SLAI(max_active=2)
    policy.add(request(prompt=300, request_id="long"))
    policy.add(request(prompt=20, request_id="short"))
    policy.add(request(prompt=100, request_id="mid"))
    engine = Engine()
    plan = form_batch(policy, engine, token_budget=10_000)
    assert [r.request_id for r in plan.admitted] == ["short", "mid"]
    assert SLAI(prefill_order="fcfs").name == "slai"


def test_slai_priority_variant_prefills_the_tightest_tier_first_then_shortest():
    """[RAD] App. F.2: paying users' prefills strictly first, SPF within a tier; without
    the variant the shortest prompt goes first whatever its tier."""

    def tiered(rid: str, prompt: int, tbt: float | None) -> Request:
        return Request(rid, "t", prompt, 8, slo=SLO(tbt=tbt) if tbt else None)

    arrivals = [
        tiered("free-short", 20, 0.5),
        tiered("paying-long", 300, 0.1),
        tiered("plain", 5, None),
        tiered("paying-short", 100, 0.1),
    ]
    orders = {}
    for variant in (False, True):
        policy = SLAI(tighter_slo_first=variant)
        for arrival in arrivals:
            policy.add(arrival)
        plan = form_batch(policy, Engine(), token_budget=10_000)
        orders[variant] = [r.request_id for r in plan.admitted]
    assert orders[False] == ["plain", "free-short", "paying-short", "paying-long"]
    assert orders[True] == ["paying-short", "paying-long", "free-short", "plain"]
    with pytest.raises(ConfigError, match="tighter_slo_first"):
        SLAI(tighter_slo_first="yes")  # type: ignore[arg-type]


def test_slai_fills_deferred_decodes_only_with_budget_left_and_under_the_decode_cap():
    policy = SLAI(token_budget=64, max_decodes=3)
    deferred = [decoding(tbt=5.0, last_end=0.0, rid=f"f{i}") for i in range(5)]
    engine = Engine(running=list(deferred), now=0.0)
    policy.add(request(prompt=62, request_id="p"))
    plan = form_batch(policy, engine, token_budget=10_000)  # SLAI's own τ = 64 applies
    assert [(r.request_id, chunk) for r, chunk in plan.prefills] == [("p", 62)]
    assert len(plan.decodes) == 2  # 62 prefill tokens leave room for two decodes
    policy2 = SLAI(token_budget=64, max_decodes=3)
    plan2 = form_batch(policy2, Engine(running=list(deferred)), token_budget=10_000)
    assert len(plan2.decodes) == 3  # the decode cap β


@pytest.mark.parametrize("name", ["fcfs", "lpm", "vtc", "dlpm", "mcsf", "slai"])
def test_every_policy_forms_batches_that_drain_the_queue(name):
    policy = make_policy(name)
    engine = Engine(memory_tokens=10_000)
    for index in range(20):
        policy.add(request("ab"[index % 2], prompt=40, max_tokens=8, request_id=f"{name}{index}"))
    for _ in range(200):
        plan = form_batch(policy, engine, token_budget=256)
        for running, chunk in plan.prefills:
            running.prefill_remaining -= chunk
        for running in plan.decodes:
            running.output_tokens += 1
            policy.record_output(running.request_id)
            if running.output_tokens >= running.request.max_tokens:
                policy.finish(running.request_id)
                engine.running.remove(running)
        engine.now += 0.02
    assert policy.waiting_count == 0 and policy.running_count == 0
