"""Unit tests of the local policies, including the digests' edge cases."""

from __future__ import annotations

import math
import sys

import pytest
from helpers import drain, request, view
from hypothesis import given
from hypothesis import strategies as st

from fairpool.sched import ConfigError, CostModel, Running, TenantWeights, make_policy
from fairpool.sched.policies import DLPM, FCFS, LPM, MCSF, VTC
from fairpool.sched.policies.dlpm import AUTO_QUANTUM_FLOOR, refills_to_credit

pytestmark = pytest.mark.unit


def ids(requests):
    return [r.request_id for r in requests]


# ---------------------------------------------------------------- shared bookkeeping


def test_fcfs_serves_in_arrival_order_across_tenants():
    policy = FCFS()
    for rid, tenant in [("1", "a"), ("2", "b"), ("3", "a")]:
        policy.add(request(tenant, request_id=rid))
    assert ids(drain(policy)) == ["1", "2", "3"]


def test_prefill_charged_at_admission_on_uncached_tokens_and_decode_per_token():
    policy = FCFS(cost=CostModel(extend_weight=1, output_weight=2))
    policy.add(request("a", prompt=100, request_id="x"))
    assert policy.admit("x", cached_tokens=30) == 70
    assert policy.record_output("x", 5) == 10
    assert policy.served["a"] == 80


def test_preempted_request_goes_first_and_is_not_charged_twice():
    policy = FCFS()
    policy.add(request("a", prompt=50, request_id="old"))
    policy.add(request("b", prompt=50, request_id="new"))
    policy.admit("old")
    policy.preempt("old")
    assert policy.next_request(view()).request_id == "old"
    assert policy.admit("old") == 0.0
    assert policy.served["a"] == 50


def test_abort_of_waiting_and_running_requests_leaves_no_state():
    policy = VTC()
    policy.add(request("a", request_id="w"))
    policy.add(request("a", request_id="r"))
    policy.admit("r")
    assert policy.remove("w") and policy.remove("r")
    assert not policy.remove("unknown")
    assert policy.waiting_count == 0 and policy.running_count == 0
    assert not policy.is_active("a")


def test_duplicate_and_unknown_request_ids_are_errors_naming_the_parameter():
    policy = FCFS()
    policy.add(request(request_id="x"))
    with pytest.raises(ConfigError) as duplicate:
        policy.add(request(request_id="x"))
    assert duplicate.value.parameter == "request_id"
    with pytest.raises(ConfigError, match="request_id"):
        policy.admit("nope")
    with pytest.raises(ConfigError, match="request_id"):
        policy.record_output("x")  # waiting, not running


# ---------------------------------------------------------------- LPM


def test_predicted_output_is_charged_to_the_order_at_admission_and_settled_at_the_end():
    """VTC with length prediction (OSDI'24 §4.4, Alg. 3): the counter takes the predicted
    output at admission — max_tokens until the tenant finished one, then the mean of its
    last five — and the difference once the request ends; `served` is what was produced."""
    policy = VTC(cost=CostModel(extend_weight=1, output_weight=2), predict_output=True)
    policy.add(request("a", prompt=10, max_tokens=50, request_id="first"))
    policy.admit("first")
    assert policy.counters["a"] == 10 + 2 * 50 and policy.served["a"] == 10
    assert policy.record_output("first", 20) == 40  # covered by the charge ahead
    assert policy.counters["a"] == 110 and policy.served["a"] == 50
    policy.finish("first")  # 30 predicted tokens never came: refunded
    assert policy.counters["a"] == 10 + 2 * 20 == policy.served["a"]
    policy.add(request("a", prompt=10, max_tokens=50, request_id="second"))
    policy.admit("second")
    assert policy.counters["a"] == 50 + 10 + 2 * 20  # predicted: the last output, 20
    policy.record_output("second", 25)  # 5 past the prediction, charged as produced
    assert policy.counters["a"] == 60 + 2 * 25
    policy.remove("second")
    assert policy.counters["a"] == policy.served["a"] == 50 + 10 + 2 * 25


def test_lpm_takes_longest_cached_prefix_first_then_arrival():
    policy = LPM()
    for rid in ("short", "long", "tie"):
        policy.add(request(request_id=rid, prompt=100))
    snapshot = view(hits={"short": 10, "long": 90, "tie": 90})
    assert ids(drain(policy, snapshot)) == ["long", "tie", "short"]


# ---------------------------------------------------------------- VTC


def test_vtc_serves_least_counter_tenant_and_its_earliest_request():
    policy = VTC()
    policy.add(request("a", prompt=100, request_id="a1"))
    policy.add(request("a", prompt=100, request_id="a2"))
    policy.add(request("b", prompt=100, request_id="b1"))
    first = policy.next_request(view())
    policy.admit(first.request_id)
    second = policy.next_request(view())
    assert {first.tenant, second.tenant} == {"a", "b"}
    assert first.request_id in ("a1", "b1") and second.request_id in ("a1", "b1")


def test_vtc_lifts_a_joining_tenant_to_the_smallest_waiting_counter():
    policy = VTC()
    policy.add(request("a", prompt=500, request_id="a1"))
    policy.add(request("a", prompt=10, request_id="a2"))
    policy.admit("a1")  # a's counter: 500, and a still waits
    policy.add(request("b", request_id="b1"))
    assert policy.counters["b"] == 500  # not 0: no credit for having been away


def test_vtc_lift_never_lowers_a_counter():
    policy = VTC()
    policy.add(request("a", prompt=10, request_id="a1"))
    policy.add(request("a", prompt=10, request_id="a2"))
    policy.add(request("b", prompt=900, request_id="b0"))
    assert ids(drain(policy, limit=2)) == ["a1", "b0"]
    policy.finish("b0")  # b owes 900 while a (at 10) still waits
    policy.add(request("b", request_id="b1"))
    assert policy.counters["b"] == 900


def test_vtc_lifts_to_the_last_leaver_when_nobody_waits():
    """Algorithm 2 lines 9-10: the system went idle; no counter reset."""
    policy = VTC()
    policy.add(request("a", prompt=300, request_id="a1"))
    policy.admit("a1")
    policy.finish("a1")
    policy.add(request("b", request_id="b1"))
    assert policy.counters["b"] == 300


def test_weighted_vtc_advances_counters_by_service_over_weight():
    policy = VTC(weights=TenantWeights({"gold": 2}))
    policy.add(request("gold", prompt=100, request_id="g"))
    policy.add(request("free", prompt=100, request_id="f"))
    policy.admit("g")
    policy.admit("f")
    policy.record_output("g", 10)
    policy.record_output("f", 10)
    assert policy.counters["gold"] == pytest.approx(60)
    assert policy.counters["free"] == pytest.approx(120)


def test_weighted_vtc_admits_in_proportion_to_weights():
    policy = VTC(weights=TenantWeights({"a": 3}))
    for index in range(40):
        policy.add(request("a", prompt=100, request_id=f"a{index}"))
        policy.add(request("b", prompt=100, request_id=f"b{index}"))
    admitted = drain(policy, limit=40)
    count_a = sum(r.tenant == "a" for r in admitted)
    assert count_a == 30


# ---------------------------------------------------------------- DLPM


def test_dlpm_skips_tenants_without_credit_while_others_have_some():
    policy = DLPM(quantum=100)
    policy.add(request("a", prompt=300, request_id="a1"))
    policy.add(request("a", prompt=300, request_id="a2"))
    policy.add(request("b", prompt=300, request_id="b1"))
    snapshot = view(hits={"a2": 250})
    assert policy.next_request(snapshot).request_id == "a2"  # refill, then longest match
    policy.admit("a2", cached_tokens=250)  # a: 100 - 50 = 50, still positive
    assert policy.next_request(snapshot).request_id == "a1"
    policy.admit("a1")  # a: 50 - 300 < 0
    assert policy.next_request(snapshot).request_id == "b1"


def test_dlpm_refills_only_when_every_waiting_tenant_is_out_of_credit():
    policy = DLPM(quantum=100)
    policy.add(request("a", prompt=150, request_id="a1"))
    policy.add(request("b", prompt=10, request_id="b1"))
    policy.add(request("b", prompt=10, request_id="b2"))
    policy.next_request(view())  # first refill: both at 100
    assert policy.tenant_state() == {"a": 100, "b": 100}
    policy.admit("a1")  # a: -50
    assert policy.next_request(view()).tenant == "b"
    assert policy.deficits["a"] == -50  # b still has credit: no refill yet


def test_dlpm_deep_debt_needs_several_refills_in_one_pass():
    policy = DLPM(quantum=100)
    policy.add(request("a", prompt=950, request_id="a1"))
    policy.add(request("a", prompt=10, request_id="a2"))
    policy.next_request(view())
    policy.admit("a1")  # a: 100 - 950 = -850
    assert policy.next_request(view()).request_id == "a2"  # work-conserving
    assert 0 < policy.deficits["a"] <= 100
    assert policy.refill_rounds == 1 + 9


def test_dlpm_credit_never_exceeds_one_quantum():
    policy = DLPM(quantum=100)
    policy.add(request("a", prompt=500, request_id="a1"))
    policy.add(request("a", prompt=10, request_id="a2"))
    policy.add(request("b", prompt=10, request_id="b1"))
    policy.next_request(view())
    policy.admit("a1")  # a: -400; b: 100
    policy.admit("b1")  # b: 90; b leaves the queue, nothing of b is waiting
    policy.finish("b1")
    policy.next_request(view())  # only a waits, with debt: refill rounds
    assert "b" not in policy.active_tenants()
    assert policy.deficits["b"] == 90  # idle tenants are not refilled
    assert policy.deficits["a"] <= 100


def test_dlpm_rejoin_after_idle_keeps_the_debt():
    """Algorithm 1 starts a tenant at 0 on its first arrival only: a debt survives an idle
    moment (resetting it let one-request-at-a-time tenants skip paying for every request)."""
    policy = DLPM(quantum=100)
    policy.add(request("a", prompt=900, request_id="a1"))
    policy.next_request(view())
    policy.admit("a1")
    policy.finish("a1")
    assert policy.deficits["a"] == -800
    policy.add(request("a", request_id="a2"))
    assert policy.deficits["a"] == -800


def test_dlpm_rejoin_while_running_keeps_the_debt():
    policy = DLPM(quantum=100)
    policy.add(request("a", prompt=900, request_id="a1"))
    policy.next_request(view())
    policy.admit("a1")
    policy.add(request("a", request_id="a2"))  # a1 still running
    assert policy.deficits["a"] == -800


def test_dlpm_auto_quantum_is_the_largest_prompt_admitted_and_an_explicit_one_wins():
    auto, fixed = DLPM(), DLPM(quantum=100)
    assert auto.quantum == AUTO_QUANTUM_FLOOR  # nothing admitted yet
    for policy in (auto, fixed):
        for index, prompt in enumerate([5000, 9000, 300]):
            policy.add(request("a", prompt=prompt, request_id=f"a{index}"))
            policy.next_request(view())
            policy.admit(f"a{index}", cached_tokens=prompt // 2)  # the whole prompt counts
    assert auto.quantum == 9000  # grown to the largest, never back down
    assert fixed.quantum == 100
    policy = DLPM(cost=CostModel(extend_weight=3.0))
    policy.add(request("a", prompt=1000, request_id="a1"))
    policy.next_request(view())
    policy.admit("a1")
    assert policy.quantum == 3000  # in service units


def test_dlpm_weight_scales_the_quantum():
    policy = DLPM(quantum=100, weights=TenantWeights({"a": 2}))
    policy.add(request("a", request_id="a1"))
    policy.add(request("b", request_id="b1"))
    policy.next_request(view())
    assert policy.tenant_state() == {"a": 200, "b": 100}


def test_dlpm_with_huge_quantum_is_lpm_and_with_tiny_quantum_alternates():
    def order(quantum):
        policy = DLPM(quantum=quantum)
        hits = {}
        for index in range(4):
            policy.add(request("a", prompt=100, request_id=f"a{index}"))
            hits[f"a{index}"] = 90
        for index in range(4):
            policy.add(request("b", prompt=100, request_id=f"b{index}"))
            hits[f"b{index}"] = 90
        return [r.tenant for r in drain(policy, view(hits=hits), cached=hits)]

    assert order(1e9) == ["a"] * 4 + ["b"] * 4
    assert order(1) == ["a", "b"] * 4


def test_refills_to_credit_counts_exact_multiples():
    assert refills_to_credit(5, 10) == 0
    assert refills_to_credit(0, 10) == 1
    assert refills_to_credit(-10, 10) == 2
    rounds = refills_to_credit(-0.3, 0.1)  # floating point: the count must still be exact
    assert -0.3 + rounds * 0.1 > 0 >= -0.3 + (rounds - 1) * 0.1


def counted_up(deficit: float, quantum: float) -> int:
    """The count as it was, from the estimate up one round at a time: the reference
    `refills_to_credit`'s closed form must equal wherever this ends (it spins for ever
    where one round more no longer changes rounds × quantum)."""
    if deficit > 0:
        return 0
    rounds = math.floor(-deficit / quantum) + 1
    for _ in range(10_000):
        if deficit + rounds * quantum > 0:
            return rounds
        rounds += 1
    raise AssertionError("counting up did not end")


quanta = st.one_of(st.floats(1e-3, 1e6), st.sampled_from([0.1, 0.3, 1 / 3, 8192.0, 2048.0 * 0.7]))


@st.composite
def deficits_near_multiples(draw: st.DrawFn) -> tuple[float, float]:
    """A deficit at, or a float or two either side of, a whole number of quanta: where the
    rounding of rounds × quantum decides the count."""
    quantum = draw(quanta)
    deficit = -draw(st.integers(0, 10**12)) * quantum
    for _ in range(draw(st.integers(0, 2))):
        deficit = math.nextafter(deficit, draw(st.sampled_from([math.inf, -math.inf])))
    return deficit, quantum


@given(
    st.one_of(
        deficits_near_multiples(),
        st.tuples(st.floats(-1e15, 1e3), quanta),
    )
)
def test_refills_closed_form_is_counting_up_wherever_counting_up_ends(case):
    deficit, quantum = case
    assert refills_to_credit(deficit, quantum) == counted_up(deficit, quantum)


@given(
    st.floats(-1.7e308, 0.0, allow_subnormal=True),
    st.floats(1e-6, 1e12),
)
def test_refills_are_the_fewest_from_the_estimate_that_lift_any_debt(deficit, quantum):
    """At any depth, 1e300 included: the count is the first from the estimate up after
    which the refill (deficit + rounds × quantum, in floating point) is above zero — what
    counting up returns where it ends, and a count where it never would."""
    first = math.floor(-deficit / quantum) + 1 if math.isfinite(-deficit / quantum) else None
    try:
        rounds = refills_to_credit(deficit, quantum)
    except OverflowError:  # no finite number of rounds lifts it
        assert sys.float_info.max * quantum <= -deficit
        return
    assert deficit + rounds * quantum > 0
    if first is not None:
        assert rounds >= first
        assert rounds == first or deficit + (rounds - 1) * quantum <= 0


# ---------------------------------------------------------------- MC-SF and +memsafe


def test_mcsf_prefers_the_shortest_predicted_output():
    policy = MCSF()
    policy.add(request(max_tokens=50, request_id="long"))
    policy.add(request(max_tokens=5, request_id="short"))
    assert policy.next_request(view()).request_id == "short"


def test_mcsf_stops_at_the_first_request_that_could_overflow():
    policy = MCSF()
    policy.add(request(prompt=10, max_tokens=50, request_id="big"))
    running = [Running(request(prompt=40, max_tokens=45))]
    assert policy.next_request(view(memory=100, running=running)) is None
    assert policy.next_request(view(memory=200, running=running)).request_id == "big"


def test_memsafe_modifier_combines_with_any_order():
    policy = make_policy("dlpm+memsafe", quantum=100)
    assert isinstance(policy, DLPM) and policy.memory_safe
    policy.add(request(prompt=60, max_tokens=60, request_id="x"))
    assert policy.next_request(view(memory=100)) is None
    assert policy.next_request(view(memory=120)).request_id == "x"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("build", "parameter"),
    [
        (lambda: make_policy("nope"), "policy"),
        (lambda: make_policy("dlpm", quantum=-1), "quantum"),
        (lambda: make_policy("dlpm", quantum=0), "quantum"),
        (lambda: make_policy("dlpm", quantum="big"), "quantum"),
        (lambda: make_policy("vtc", weights={"a": -1}), "weights[a]"),
        (lambda: make_policy("vtc", weights={"a": 0}), "weights[a]"),
        (lambda: make_policy("vtc", quantum=5), "quantum"),
        (lambda: make_policy("slai", token_budget=0), "token_budget"),
        (lambda: make_policy("slai", prefill_order="lifo"), "prefill_order"),
        (lambda: make_policy("slai", offset=-1), "offset"),
        (lambda: CostModel(extend_weight=-1), "extend_weight"),
        (lambda: CostModel(extend_weight=0, output_weight=0), "output_weight"),
        (lambda: TenantWeights(default=0), "default_weight"),
        (lambda: view(memory=0), "memory_tokens"),
        (lambda: request(prompt=-1), "prompt_tokens"),
        (lambda: request(max_tokens=0), "max_tokens"),
        (lambda: request(tenant=""), "tenant"),
    ],
)
def test_bad_parameters_are_named(build, parameter):
    with pytest.raises(ConfigError) as error:
        build()
    assert error.value.parameter == parameter
    assert str(error.value).startswith(parameter)


def test_every_policy_cites_its_source():
    from fairpool.sched.registry import POLICIES

    for name, cls in POLICIES.items():
        module = __import__(cls.__module__, fromlist=["_"])
        text = (module.__doc__ or "") + (cls.__doc__ or "")
        if name in ("vtc", "dlpm", "mcsf", "slai", "lpm"):
            assert any(word in text for word in ("Algorithm", "§")), name
