"""The fleet simulator: the recorder's measures, the CLI contract, and the papers' bounds.

Theorems checked by random search over bounded workloads (seed 000 is Cao et al.,
"Locality-aware Fair Scheduling in LLM Serving"): VTC Thm 4.4 (2U, one engine) and DLPM
Thm 4.1 (2(U+Q), one engine) on `max_backlogged_service_gap`; for DLPM engines behind
D2LPM (§5.2, Appendix A.2), with D2LPM's Q^w drawn from `auto` to 10^9, Thm 5.1
(2|W|(U+Q) between tenants backlogged on every worker, `max_fully_backlogged_service_gap`),
Thm 5.2 (2|W|(U+Q) for any tenant over one backlogged on every worker) and Thm A.3
(|Σ_w k_{i,w}·Q − W_i| ≤ max(Q, U)·|W|).

"Backlogged on every worker" is the premise of the proof of Thm 5.1 (Appendix A.2: "if a
client is backlogged, it will have a request and hence be backlogged in all workers"),
not the paper's definition: Definition 3.1 calls a client backlogged while it has
requests waiting at some worker ("a backlogged client may have requests in queues of
certain workers or all workers"), measured by `max_backlogged_at_some_worker_service_gap`.
D2LPM does not guarantee the premise: a tenant spreads over every worker only once it has
spent Q^w on its favourite, so with a large finite Q^w Thm 5.1 as stated (a bound without
Q^w) is false. Three counterexamples are kept as tests: a sticky flood with a large finite
Q^w, the backlogged-anywhere gap growing with time on several workers, and D2LPM with
Q^w = ∞ (Thm A.5).
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairpool.sched import Request, TenantWeights
from fairpool.sched.policies.dlpm import AUTO_QUANTUM_FLOOR
from fairpool.sched.routers.d2lpm import AUTO_WORKER_QUANTUM_FLOOR
from fairpool.sim.engine import StepTime
from fairpool.sim.fleet import Fleet, FleetConfig
from fairpool.sim.metrics import Recorder
from fairpool.sim.trace import TraceRequest, read_trace
from fairpool_cli.main import main

pytestmark = pytest.mark.unit

FAST = StepTime(base=0.01, per_prefill_token=0.0001, per_decode=0.0002)


def uniform(tenant, rate, duration, prompt, output, segments=None):
    requests, t = [], 0.0
    while t < duration:
        requests.append(TraceRequest(t, tenant, segments or ((None, prompt),), output, output))
        t += 1.0 / rate
    return requests


def run(
    trace,
    workers=1,
    policy="vtc",
    router="round_robin",
    memory=2000,
    weights=None,
    quantum=None,
    duration=None,
    worker_quantum=None,
):
    config = FleetConfig(
        workers=workers,
        policy=policy,
        router=router,
        memory_tokens=memory,
        token_budget=512,
        step_time=FAST,
        quantum=quantum,
        worker_quantum=worker_quantum,
        weights=TenantWeights(weights),
    )
    fleet = Fleet(config)
    fleet.run(trace, duration=duration)
    return fleet, fleet.summary()


# ---------------------------------------------------------------- recorder


def test_gap_is_measured_only_while_both_tenants_are_backlogged():
    recorder = Recorder(TenantWeights())
    for rid, tenant, t in (("1", "a", 0.0), ("2", "b", 1.0)):
        recorder.arrived(Request(rid, tenant, 10, 10, arrival=t))
    recorder.served_after_step(0.5, "w0", {"a": 100.0})  # before b is backlogged
    recorder.served_after_step(2.0, "w0", {"a": 130.0, "b": 10.0})
    recorder.served_after_step(3.0, "w0", {"a": 150.0, "b": 60.0})
    recorder.admitted(Request("1", "a", 10, 10), 4.0)
    recorder.served_after_step(5.0, "w0", {"a": 500.0, "b": 60.0})  # a no longer backlogged
    recorder.close(6.0)
    # joint backlog [1, 4]: D = a - b goes 100 → 120 → 90, so the gap is 30
    assert recorder.max_backlogged_service_gap() == pytest.approx(30)
    assert recorder.backlog["a"] == [(0.0, 4.0)]
    assert recorder.backlog["b"] == [(1.0, 6.0)]


def test_service_stays_in_time_order_when_engines_report_out_of_order():
    # Engines' steps are reported in the order they start: w0's step [1.0, 1.5] comes
    # before w1's [1.1, 1.2], so a point at 1.2 arrives after one at 1.5.
    recorder = Recorder(TenantWeights())
    recorder.served_after_step(1.5, "w0", {"a": 100.0})
    recorder.served_after_step(1.2, "w1", {"a": 10.0})
    recorder.served_after_step(1.5, "w1", {"a": 30.0})
    assert list(recorder.service_times["a"]) == [1.2, 1.5]
    assert list(recorder.service_values["a"]) == [10.0, 130.0]
    assert [recorder.service_at("a", t) for t in (1.0, 1.2, 1.4, 2.0)] == [0, 10, 10, 130]


def test_fully_backlogged_means_waiting_at_every_worker():
    recorder = Recorder(TenantWeights(), workers=["w0", "w1"])
    first, second, third = (Request(rid, "a", 10, 10) for rid in "123")
    for request, worker, t in ((first, "w0", 0.0), (second, "w1", 1.0), (third, "w1", 4.0)):
        recorder.arrived(request)
        recorder.dispatched(request, worker, t)
    recorder.admitted(first, 3.0, "w0")
    recorder.admitted(second, 5.0, "w1")
    recorder.preempted(first, 6.0, "w0")  # waits at w0 again, while w1 still holds one
    recorder.close(8.0)
    assert recorder.worker_backlog["a"]["w0"] == [(0.0, 3.0), (6.0, 8.0)]
    assert recorder.worker_backlog["a"]["w1"] == [(1.0, 8.0)]
    assert recorder.fully_backlogged("a") == [(1.0, 3.0), (6.0, 8.0)]
    assert recorder.backlog["a"] == [(0.0, 8.0)]  # anywhere: one interval
    assert recorder.fully_backlogged("never-dispatched") == []
    assert recorder.backlogged_at_some_worker("a") == [(0.0, 8.0)]


def test_backlogged_at_some_worker_leaves_out_the_gateway_queue():
    """Definition 3.1's backlog counts requests waiting at the workers: a request held in
    the gateway's queue makes its tenant backlogged anywhere, not at some worker."""
    recorder = Recorder(TenantWeights(), workers=["w0", "w1"])
    for rid, tenant in (("1", "a"), ("2", "b")):
        recorder.arrived(Request(rid, tenant, 10, 10, arrival=0.0))
    recorder.dispatched(Request("1", "a", 10, 10), "w0", 0.0)
    recorder.dispatched(Request("2", "b", 10, 10), "w1", 2.0)  # held at the front until 2
    recorder.served_after_step(1.0, "w0", {"a": 300.0})
    recorder.served_after_step(3.0, "w0", {"a": 350.0})
    recorder.served_after_step(3.0, "w1", {"b": 20.0})
    recorder.close(4.0)
    assert recorder.backlogged_at_some_worker("b") == [(2.0, 4.0)]
    assert recorder.max_backlogged_service_gap() == pytest.approx(330)  # over [0, 4]
    assert recorder.max_backlogged_at_some_worker_service_gap() == pytest.approx(30)  # [2, 4]
    assert recorder.max_fully_backlogged_service_gap() == 0  # nobody waits at both


def test_fully_backlogged_gap_counts_only_intervals_backlogged_everywhere():
    recorder = Recorder(TenantWeights(), workers=["w0", "w1"])
    for rid, tenant in (("1", "a"), ("2", "a"), ("3", "b"), ("4", "b")):
        recorder.arrived(Request(rid, tenant, 10, 10))
        recorder.dispatched(Request(rid, tenant, 10, 10), "w0" if rid in "13" else "w1", 0.0)
    recorder.served_after_step(1.0, "w0", {"a": 50.0, "b": 10.0})
    recorder.admitted(Request("4", "b", 10, 10), 2.0, "w1")  # b waits at w0 only from 2
    recorder.served_after_step(3.0, "w0", {"a": 500.0, "b": 10.0})
    recorder.close(4.0)
    assert recorder.max_fully_backlogged_service_gap() == pytest.approx(40)  # within [0, 2]
    assert recorder.max_backlogged_service_gap() == pytest.approx(490)  # [0, 4] anywhere
    # Thm 5.2's one-sided measure: a over b while b is backlogged everywhere ([0, 2]).
    assert recorder.max_excess_over_fully_backlogged() == pytest.approx(40)


def test_weights_divide_service_in_the_gap():
    recorder = Recorder(TenantWeights({"a": 2}))
    recorder.arrived(Request("1", "a", 10, 10))
    recorder.arrived(Request("2", "b", 10, 10))
    recorder.served_after_step(1.0, "w0", {"a": 200.0, "b": 100.0})
    recorder.close(2.0)
    assert recorder.max_backlogged_service_gap() == 0


# ---------------------------------------------------------------- fleet behaviour


def share(summary):
    tenants = summary["tenants"]
    return tenants["a"]["service"] / (tenants["a"]["service"] + tenants["b"]["service"])


def test_fcfs_serves_by_rate_and_vtc_evenly_in_overload():
    trace = uniform("a", 40, 30, 100, 50) + uniform("b", 20, 30, 100, 50)
    _, fcfs = run(trace, policy="fcfs", duration=30)
    _, vtc = run(trace, policy="vtc", duration=30)
    assert share(fcfs) > 0.6
    assert abs(share(vtc) - 0.5) < 0.05
    assert vtc["max_backlogged_service_gap"] <= vtc["fairness_bound"]


def test_weighted_tenants_get_service_in_proportion():
    trace = uniform("a", 40, 40, 100, 50) + uniform("b", 40, 40, 100, 50)
    _, summary = run(trace, policy="vtc", weights={"a": 2}, duration=40)
    ratio = summary["tenants"]["a"]["service"] / summary["tenants"]["b"]["service"]
    assert ratio == pytest.approx(2, rel=0.1)


def test_d2lpm_keeps_prefix_locality_and_hears_evictions():
    rng = random.Random(3)
    trace = []
    for index in range(240):
        document = f"doc-{rng.randrange(8)}"  # 8 documents, more than one engine can cache
        trace.append(
            TraceRequest(index / 12, "ab"[index % 2], ((document, 600), (None, 20)), 20, 20)
        )
    fleet, summary = run(trace, workers=4, policy="dlpm", router="d2lpm", memory=2000)
    _, spread = run(trace, workers=4, policy="dlpm", router="round_robin", memory=2000)
    assert summary["cache_hit_rate"] > spread["cache_hit_rate"] + 0.2
    evicted = sum(engine.cache.stats().evicted_tokens for engine in fleet.engines)
    assert evicted > 0  # memory pressure evicted cached prefixes, reported to the router
    assert all(t["finished"] == t["requests"] for t in summary["tenants"].values())


def test_a_childs_prompt_hits_its_parents_generated_thought():
    """A trace request's `output_segment` names its output: a later prompt continuing
    with that segment hits the parent's prompt *and* thought in the cache."""
    parent = TraceRequest(0.0, "a", (("q", 160),), 96, 96, output_segment="thought")
    child = TraceRequest(5.0, "a", (("q", 160), ("thought", 96), (None, 16)), 8, 8)
    unnamed = TraceRequest(0.0, "a", (("q", 160),), 96, 96)
    hits = {}
    for name, first in (("named", parent), ("unnamed", unnamed)):
        fleet, _ = run([first, child], policy="fcfs", memory=4000)
        (late,) = [c for c in fleet.engines[0].completions if c.request.arrival == 5.0]
        hits[name] = late.cached_tokens
        block = fleet.engines[0].block_size
    assert hits["unnamed"] == 160 // block * block
    assert hits["named"] == (160 + 96 - 1) // block * block  # the parent's computed KV


def test_runs_until_every_request_finished_without_a_duration():
    trace = uniform("a", 1, 5, 50, 10)
    _, summary = run(trace)
    assert summary["tenants"]["a"]["finished"] == summary["tenants"]["a"]["requests"] == 5


# ---------------------------------------------------------------- theorems


workload = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.floats(1.0, 12.0),  # requests per second
        st.integers(1, 300),  # prompt
        st.integers(1, 120),  # output
    ),
    min_size=2,
    max_size=4,
)


def random_trace(spec, duration=12.0):
    trace = []
    for tenant, rate, prompt, output in spec:
        trace += uniform(tenant, rate, duration, prompt, output)
    return trace


@settings(max_examples=15)
@given(workload, st.sampled_from(["vtc", "dlpm"]), st.sampled_from([50.0, 500.0, 5000.0]))
def test_one_engine_stays_within_its_theorem_bound(spec, policy, quantum):
    trace = random_trace(spec)
    _, summary = run(
        trace, policy=policy, quantum=quantum if policy == "dlpm" else None, duration=12.0
    )
    assert summary["max_backlogged_service_gap"] <= summary["fairness_bound"]


# DLPM engines behind D2LPM (seed 000, §5.2 and Appendix A.2). U = w_e·L_input + w_q·M
# (the longest prompt admitted, M the memory per engine) and Q the engines' quantum, the
# largest U + Q over the engines; |W| the number of workers; Q^w, D2LPM's quantum, appears
# in no bound. Tenants mix floods (30-80 requests/s: backlogged on every worker, the
# regime in which the bounds could fail) with light tenants (1-30/s: backlogged at some
# workers at times, or not at all); a tenant's prompts may all start with its own shared
# document, which holds it to the worker caching it until it has spent Q^w there.
fleet_workload = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.one_of(st.floats(30.0, 80.0), st.floats(1.0, 30.0)),  # requests per second
        st.integers(20, 300),  # prompt
        st.integers(10, 120),  # output
        st.sampled_from([0, 0, 400]),  # its shared document's tokens (0: none)
    ),
    min_size=2,
    max_size=4,
)
fleet_quantum = st.sampled_from([None, 500.0, 5000.0])  # None: `auto`
#: D2LPM's Q^w: `auto` (None), and fixed values from below one prompt to far beyond what
#: a tenant is served in a run (it then stays on the worker caching its document).
fleet_worker_quantum = st.sampled_from([None, 512.0, 8192.0, 65536.0, 1e6, 1e9])
fleet_duration = st.floats(4.0, 10.0)


def fleet_trace(spec, duration):
    trace = []
    for tenant, rate, prompt, output, document in spec:
        segments = ((f"{tenant}-document", document), (None, prompt)) if document else None
        trace += uniform(tenant, rate, duration, prompt, output, segments)
    return trace


def bounded_run(spec, workers, quantum, worker_quantum, duration):
    return run(
        fleet_trace(spec, duration),
        workers=workers,
        policy="dlpm",
        router="d2lpm",
        quantum=quantum,
        worker_quantum=worker_quantum,
        duration=duration,
    )


@settings(max_examples=10, deadline=None)
@given(fleet_workload, st.integers(2, 3), fleet_quantum, fleet_worker_quantum, fleet_duration)
def test_dlpm_behind_d2lpm_stays_within_the_fleet_bound(
    spec, workers, quantum, worker_quantum, duration
):
    """Theorem 5.1 under its proof's premise: over any interval in which tenants f and g
    both have a request waiting at *every* worker throughout, |W_f − W_g| ≤ 2·|W|·(U + Q)
    — the local bound 2(U + Q) of Theorem 4.1 added up over |W| workers where both are
    backlogged throughout. That holds for every Q^w, `auto` or fixed.

    The theorem as stated is about Definition 3.1's backlog, a request waiting at *some*
    worker (`max_backlogged_at_some_worker_service_gap`); the proof's step from there to
    every worker ("SelectWorker exhausts a tenant's credit on every worker before
    refilling") holds only once the tenant has spent Q^w on the workers it sticks to.
    What the Definition 3.1 measure shows on this family: over 36 random runs, 6 per
    value of Q^w, it stayed within the bound (at most 0.87 of it, at Q^w = 10^6; 0.45
    with `auto`), the every-worker gap at most 0.33 of it; with 600-token documents and
    the engines' earlier `auto` Q, 1 of 60 runs exceeded it (1.05 times, at Q^w = 10^9).
    Random workloads seldom hold a flood to one worker for long enough; the sticky flood
    below does, every time."""
    _, summary = bounded_run(spec, workers, quantum, worker_quantum, duration)
    assert summary["max_fully_backlogged_service_gap"] <= summary["fairness_bound"]


def sticky_flood(duration, rate=80.0):
    """Theorem A.5's two floods: f's prompts share a long document, so D2LPM sends them
    to the worker caching it while f has credit there; g's match nothing and are
    balanced over every worker (Algorithm 2, line 8)."""
    requests = []
    for index in range(int(duration * rate)):
        t = index / rate
        requests.append(TraceRequest(t, "f", (("manual", 600), (None, 20)), 20, 20))
        requests.append(TraceRequest(t, "g", ((None, 620),), 20, 20))
    return requests


def sticky_run(duration, worker_quantum, rate=80.0):
    """The sticky flood on two workers. The engines' Q is fixed at 2,048: with it the
    engine serving f keeps f's document cached, so f moves only when its credit there is
    spent. (With a larger Q, g's prompts evict the document at times, the router hears it
    and sends f's next request to the least loaded worker: f spreads through evictions,
    whatever Q^w.)"""
    return run(
        sticky_flood(duration, rate),
        workers=2,
        policy="dlpm",
        router="d2lpm",
        quantum=2048.0,
        duration=duration,
        worker_quantum=worker_quantum,
    )


@settings(max_examples=2, deadline=None)
@given(
    st.floats(6.0, 9.0).map(lambda exponent: 10**exponent),  # Q^w from 10^6 to 10^9
    st.sampled_from([8.0, 9.0]),  # seconds
    # requests per second, each tenant: a continuous draw found runs in which f ended up
    # on both workers (not examined; eviction moves f, as `sticky_run` says), so the
    # search draws Q^w over a wide range at rates and lengths checked to keep f in place
    st.sampled_from([75.0, 80.0, 85.0]),
)
@example(worker_quantum=1e6, duration=8.0, rate=80.0)
def test_a_large_finite_worker_quantum_breaks_theorem_5_1_as_stated(worker_quantum, duration, rate):
    """Counterexample: Theorem 5.1 (DLPM paper, §5.2), as stated with Definition 3.1's
    backlog, is false for a large finite Q^w. f floods with prompts that share a document
    and sticks to the worker caching it, where its credit of Q^w lasts the whole run (it
    is served about 2,500 per second); g floods with prompts that match nothing and is
    served on both workers. Both have requests waiting at some worker throughout — f is
    backlogged as Definition 3.1 has it, since more requests would only queue at the same
    worker — and g's lead grows with time, past 2·|W|·(U + Q) = 26,672 after about 7 s:
    38,320 over 8 s and 95,584 over 20 s at Q^w = 10^6 and 80 requests per second, f
    waiting at one worker only (served 47,940), its credit there never spent. The
    proof's premise, backlogged at every worker, never holds for f, so the every-worker
    gap is 0 and says nothing of this run. D2LPM spreads f only after f has spent Q^w on
    its worker, so the gap grows until then, by as much as Q^w lets it: a bound for
    Definition 3.1's backlog needs Q^w in it, or Q^w small (`auto`, below; Theorem A.5 is
    the limit Q^w = ∞)."""
    fleet, summary = sticky_run(duration, worker_quantum, rate)
    assert [e.policy.served.get("f", 0) > 0 for e in fleet.engines].count(True) == 1
    assert summary["max_backlogged_at_some_worker_service_gap"] > summary["fairness_bound"]
    assert summary["max_fully_backlogged_service_gap"] == 0


def test_backlogged_anywhere_gap_grows_with_time_on_several_workers():
    """Known exception: the backlogged-anywhere measure has no bound independent of time.

    A light tenant (32 requests/s of 20 prompt + 10 output tokens: 1,280 service/s, its
    whole demand served) beside a flood (80/s of 200 + 50) on two workers. Each light
    request waits a few steps for its turn, so the light tenant almost always has one
    waiting at one worker or the other, while its queue at each worker empties every
    second or so. Backlogged anywhere — and at some worker, Definition 3.1's reading —
    it looks continuously backlogged for seconds, and the gap to the flood grows with
    the interval: 7,460 over 6 s, 16,280 over 12 s, 41,424 over 24 s against a bound of
    24,992. More requests would raise its throughput, so in the sense of Definition 3.1's
    first sentence it is not backlogged, and at no worker is it waiting throughout, so
    Theorem 5.1's proof does not apply; backlogged on every worker the gap stays below
    7,500. The bound that holds for tenants backlogged somewhere is Theorem 5.2's,
    one-sided, with the other tenant backlogged everywhere (next tests). The flooding
    workloads that once failed Theorem 5.1 on this measure (a gap of 27,270 against
    24,280, the bound of two workers with prompts of at most 22 tokens) are this case: of
    45 random runs of that family (2-4 flows at 30-80 requests/s, prompts of 20-22
    tokens, outputs of 10-120), 10 exceeded 24,280 backlogged anywhere (gaps up to 57,715),
    each with a tenant whose requests were all small (outputs of 10-26 tokens: its whole
    demand served) beside a heavy one; backlogged on every worker none exceeded 7,681."""
    gaps = {}
    for duration in (6.0, 24.0):
        trace = uniform("light", 32, duration, 20, 10) + uniform("heavy", 80, duration, 200, 50)
        _, summary = run(trace, workers=2, policy="dlpm", router="d2lpm", duration=duration)
        light = summary["tenants"]["light"]
        assert light["requests"] - light["finished"] <= 32  # served all but its last second
        assert light["backlogged_s"] >= 0.95 * duration  # yet "backlogged" nearly always
        assert summary["max_fully_backlogged_service_gap"] <= summary["fairness_bound"]
        assert (
            summary["max_backlogged_at_some_worker_service_gap"]
            == summary["max_backlogged_service_gap"]
        )  # no gateway queue, no closed-loop clients: demand waits at the workers only
        gaps[duration] = summary["max_backlogged_service_gap"], summary["fairness_bound"]
    (short, _), (long, bound) = gaps[6.0], gaps[24.0]
    assert long > 4 * short
    assert long > bound


@settings(max_examples=10, deadline=None)
@given(fleet_workload, st.integers(2, 3), fleet_quantum, fleet_worker_quantum, fleet_duration)
def test_backlogged_tenant_gets_no_less_than_any_other_behind_d2lpm(
    spec, workers, quantum, worker_quantum, duration
):
    """Theorem 5.2 under Theorem 5.1's premise: over any interval in which f has a request
    waiting at every worker throughout and g is any tenant, backlogged or not,
    W_g − W_f ≤ 2·(U + Q)·|W|. One-sided: g may receive less (it asked for less).

    With f backlogged as Definition 3.1 has it (at some worker,
    `max_excess_over_backlogged_at_some_worker`) it fails as Theorem 5.1 does: the sticky
    flood above is a case (g gains 38,320 over 8 s on f against 26,672)."""
    fleet, summary = bounded_run(spec, workers, quantum, worker_quantum, duration)
    assert fleet.recorder.max_excess_over_fully_backlogged() <= summary["fairness_bound"]


@settings(max_examples=10, deadline=None)
@given(
    fleet_workload,
    st.integers(2, 3),
    st.sampled_from([500.0, 2048.0, 5000.0]),
    fleet_worker_quantum,
    fleet_duration,
)
def test_refills_account_for_service_behind_d2lpm(spec, workers, quantum, worker_quantum, duration):
    """Theorem A.3: for client i with k_{i,w} refills of the local DLPM at worker w since
    the start (all deficits 0), |Σ_w k_{i,w}·Q − W_i(0, t)| ≤ max(Q, U)·|W|: the service
    it received is what its refills granted, but for what each worker's deficit holds,
    q_{i,w} ∈ (−U, Q]. Stated for a backlogged client; the proof uses the deficits' range
    alone, so it holds for every tenant and every Q^w (which only decides where a tenant's
    requests go), and is checked so, at the end of a run of random length."""
    fleet, _ = bounded_run(spec, workers, quantum, worker_quantum, duration)
    engines = fleet.engines
    U = max(e.policy.service_bound(e.memory_tokens) / 2 - e.policy.quantum for e in engines)
    for tenant in fleet.recorder.tenants:
        granted = sum(e.policy.refills(tenant) * e.policy.tenant_quantum(tenant) for e in engines)
        received = sum(e.policy.served.get(tenant, 0.0) for e in engines)
        assert abs(granted - received) <= max(quantum, U) * len(engines)


def test_infinite_worker_quantum_is_unfair():
    """Theorem A.5: D2LPM with Q^w = ∞ is not fair. On the sticky flood all of f's
    requests go to the worker caching its document, while g's are balanced over every
    worker. Both are backlogged, yet g is served on |W| workers and f on one, so W_g − W_f
    grows with time without bound: 22,680 over 5 s and 95,874 over 20 s on two workers,
    against 2·|W|·(U + Q) = 26,672, f waiting at its worker throughout. f is backlogged
    (Definition 3.1: more requests would go to the same worker) but on one worker only,
    the premise of Theorem 5.1's proof that Q^w = ∞ breaks (a large finite Q^w breaks it
    for as long as f's credit lasts: the test above). With `auto` Q^w f spreads once its
    credit on its favourite is spent: over 20 s W_g − W_f = −314, and the every-worker
    gap stays within the bound (8,006)."""
    excess = {}
    for duration in (5.0, 20.0):
        fleet, summary = sticky_run(duration, worker_quantum=1e15)
        tenants = summary["tenants"]
        assert [e.policy.served.get("f", 0) > 0 for e in fleet.engines].count(True) == 1
        assert tenants["f"]["backlogged_s"] >= 0.95 * duration  # waiting at its worker
        excess[duration] = tenants["g"]["service"] - tenants["f"]["service"]
        bound = summary["fairness_bound"]
    assert excess[20.0] > 3 * excess[5.0]
    assert excess[20.0] > bound
    fleet, summary = sticky_run(20.0, worker_quantum=None)
    assert all(e.policy.served.get("f", 0) > 0 for e in fleet.engines)
    assert summary["max_fully_backlogged_service_gap"] <= summary["fairness_bound"]


# ---------------------------------------------------------------- the command


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_sim_command_writes_the_json_contract(tmp_path, capsys):
    trace = write(
        tmp_path / "t.jsonl",
        [
            '{"t": 0, "tenant": "a", "segments": [["sys", 300], [null, 20]], "output_tokens": 30}',
            '{"t": 0.1, "tenant": "b", "segments": [[null, 200]], "output_tokens": 20, '
            '"max_tokens": 40}',
            '{"t": 0.2, "tenant": "a", "segments": [["sys", 300], [null, 10]], '
            '"output_tokens": 30}',
        ],
    )
    out = tmp_path / "out.json"
    assert main(["sim", "--trace", trace, "--workers", "2", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    for key in (
        "duration_s",
        "throughput_tokens_per_s",
        "output_tokens_per_s",
        "cache_hit_rate",
        "jain_index",
        "fairness_bound",
        "max_backlogged_service_gap",
        "max_backlogged_at_some_worker_service_gap",
        "max_fully_backlogged_service_gap",
        "worst_share_ratio",
        "worst_share_ratio_tenant",
        "hung_up",
        "bands",
        "tenants",
    ):
        assert key in summary
    # the default policy and router, DLPM behind D2LPM, with their `auto` quanta in force
    assert summary["quantum"] == AUTO_QUANTUM_FLOOR  # the trace's prompts cost less
    assert summary["worker_quantum"] == AUTO_WORKER_QUANTUM_FLOOR
    for key in (
        "requests",
        "finished",
        "service",
        "input_tokens",
        "output_tokens",
        "ttft_p50",
        "ttft_p99",
        "latency_p50",
        "latency_p99",
        "backlogged_s",
        "fully_backlogged_s",
        "hung_up",
        "backlogged_share",
        "entitled_share",
        "share_ratio",
    ):
        assert key in summary["tenants"]["a"]
    assert set(summary["bands"]["standard"]) >= {"requests", "service", "ttft_p50", "ttft_p99"}
    assert summary["tenants"]["a"]["requests"] == 2
    assert "tenant" in capsys.readouterr().out


def test_sim_command_saves_the_generated_workload_as_a_trace(tmp_path):
    saved = tmp_path / "w.jsonl"
    args = ["sim", "--workload", "vtc_overload", "--duration", "5", "--write-trace", str(saved)]
    assert main(args) == 0
    requests = read_trace(saved)
    assert {r.tenant for r in requests} == {"c1", "c2"}
    assert all(r.prompt_tokens == 256 for r in requests)


def test_sim_command_reads_tenant_weights_and_plots(tmp_path):
    tenants = write(
        tmp_path / "tenants.yaml",
        [
            "apiVersion: fairpool.io/v1alpha1",
            "kind: TenantQuota",
            "metadata: {name: a}",
            "spec: {weight: 3}",
        ],
    )
    trace = write(
        tmp_path / "t.jsonl",
        [
            f'{{"t": {i / 40}, "tenant": "{t}", "segments": [[null, 100]], "output_tokens": 50}}'
            for i in range(600)
            for t in "ab"
        ],
    )
    plot = tmp_path / "p.png"
    out = tmp_path / "o.json"
    args = [
        "sim",
        "--trace",
        trace,
        "--policy",
        "vtc",
        "--tenants",
        tenants,
        "--duration",
        "15",
        "--memory-tokens",
        "1500",
        "--json",
        str(out),
        "--plot",
        str(plot),
    ]
    assert main(args) == 0
    summary = json.loads(out.read_text())
    assert summary["tenants"]["a"]["service"] > 2 * summary["tenants"]["b"]["service"]
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_sim_command_runs_closed_loop_clients(tmp_path):
    """`--client TENANT:STREAMS[:P:Q:O]`: each tenant keeps its streams busy for the whole
    run, so a pool under KV pressure can be reproduced as production loads it."""
    out = tmp_path / "out.json"
    argv = ["sim", "--client", "flood:16", "--client", "light:4:64:16:8", "--workers", "2"]
    argv += ["--memory-tokens", "1024", "--block-size", "16", "--duration", "5"]
    assert main([*argv, "--json", str(out)]) == 0
    tenants = json.loads(out.read_text())["tenants"]
    assert set(tenants) == {"flood", "light"}
    # Closed loops: every request finished, except at most the streams still in flight.
    assert 0 <= tenants["flood"]["requests"] - tenants["flood"]["finished"] <= 16
    assert 0 <= tenants["light"]["requests"] - tenants["light"]["finished"] <= 4
    assert tenants["light"]["finished"] > 0


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--client", "flood:2"], "--duration"),
        (["--client", "flood:x", "--duration", "1"], "--client"),
        (["--client", ":2", "--duration", "1"], "--client"),
        (["--client", "flood:2:1:1", "--duration", "1"], "--client"),
        (["--client", "flood:0", "--duration", "1"], "--client"),
        (["--client", "a:1", "--duration", "1", "--write-trace", "t.jsonl"], "--write-trace"),
        (["--client", "a:1", "--duration", "1", "--workload-param", "rate=1"], "--workload-param"),
    ],
)
def test_bad_closed_loop_clients_are_clear_errors(capsys, argv, named):
    assert main(["sim", *argv]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            ['{"t": 0, "tenant": "a", "segments": [[null, 10]], "output_tokens": 0}'],
            "line 1: output_tokens",
        ),
        (["", "not json"], "line 2"),
        (
            ['{"t": 0, "tenant": "a", "segments": [[null, 10]], "output_tokens": 5, "x": 1}'],
            "line 1: x",
        ),
        (
            [
                '{"t": 0, "tenant": "a", "segments": [[null, 10]], "output_tokens": 5, '
                '"output_segment": ""}'
            ],
            "line 1: output_segment",
        ),
    ],
)
def test_bad_traces_are_clear_errors_naming_line_and_field(tmp_path, capsys, lines, expected):
    trace = write(tmp_path / "bad.jsonl", lines)
    assert main(["sim", "--trace", trace]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_sim_command_rejects_bad_names_with_the_option_named(tmp_path, capsys):
    trace = write(
        tmp_path / "t.jsonl",
        ['{"t": 0, "tenant": "a", "segments": [[null, 10]], "output_tokens": 5}'],
    )
    assert main(["sim", "--trace", trace, "--profile", "nope"]) == 2
    assert "--profile" in capsys.readouterr().err
    assert main(["sim", "--trace", trace, "--policy", "fcfs", "--quantum", "5"]) == 2
    assert "quantum" in capsys.readouterr().err
    assert main(["sim", "--trace", str(tmp_path / "missing.jsonl")]) == 2
    assert "--trace" in capsys.readouterr().err


def test_rpm_limit_refuses_requests_beyond_the_window():
    trace = uniform("a", 1, 120, 50, 5)
    config = FleetConfig(rpm_limit=30, step_time=FAST, memory_tokens=2000)
    summary = Fleet(config).run(trace).summary()
    assert summary["tenants"]["a"]["rejected"] == 60
    assert summary["tenants"]["a"]["finished"] == 60


def test_workload_parameters_from_the_command_line(tmp_path, capsys):
    saved = tmp_path / "w.jsonl"
    args = [
        "sim",
        "--workload",
        "vtc_overload",
        "--workload-param",
        "rpm=[60,120]",
        "--duration",
        "10",
        "--write-trace",
        str(saved),
    ]
    assert main(args) == 0
    counts = {}
    for request in read_trace(saved):
        counts[request.tenant] = counts.get(request.tenant, 0) + 1
    assert counts == {"c1": 10, "c2": 20}
    assert main(["sim", "--workload", "vtc_overload", "--workload-param", "bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert main(["sim", "--workload", "vtc_overload", "--workload-param", "novalue"]) == 2
    assert "--workload-param" in capsys.readouterr().err
