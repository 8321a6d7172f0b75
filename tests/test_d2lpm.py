"""D2LPM (seed 000, Algorithm 2): worker selection, deficits, refills, evictions.

The property tests drive random route / complete / evict sequences through the router and
check, from its public state (`deficits`, `workers`, `tree`), the rules of SelectWorker and
the bounds the fairness proofs rest on.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairpool.sched.cost import CostModel, TenantWeights
from fairpool.sched.errors import ConfigError
from fairpool.sched.policies.dlpm import refills_to_credit
from fairpool.sched.routers import D2LPM, RouteRequest
from fairpool.sched.routers.d2lpm import AUTO_WORKER_QUANTUM_FLOOR, AUTO_WORKER_QUANTUM_REQUESTS

pytestmark = pytest.mark.unit

_ids: Iterator[int] = itertools.count()
W4 = ["w0", "w1", "w2", "w3"]


def send(router: D2LPM, key: Sequence[Any], tenant: str = "a", tokens: int = 10) -> str:
    """Route a request; returns its id (the worker is `router.in_flight(id)`)."""
    request = RouteRequest(f"r{next(_ids)}", tenant, key, tokens)
    router.route(request)
    return request.request_id


def to(router: D2LPM, key: Sequence[Any], tenant: str = "a", tokens: int = 10) -> str:
    """Route a request; returns the worker it went to."""
    worker = router.in_flight(send(router, key, tenant, tokens))
    assert worker is not None
    return worker


def deficits(router: D2LPM, tenant: str) -> dict[str, float]:
    return {worker: router.deficits[tenant][worker] for worker in router.workers}


def outstanding(router: D2LPM) -> dict[str, int]:
    return {worker: state.outstanding for worker, state in router.workers.items()}


# ---------------------------------------------------------------------- selection


def test_first_request_refills_every_worker() -> None:
    router = D2LPM(W4, worker_quantum=100)
    assert deficits(router, "a") == dict.fromkeys(W4, 0.0)
    worker = to(router, [1, 2, 3], tokens=30)
    assert router.refill_rounds == 1
    assert deficits(router, "a") == {w: 70.0 if w == worker else 100.0 for w in W4}
    assert deficits(router, "b") == dict.fromkeys(W4, 0.0)  # per tenant


def test_completion_corrects_the_input_charge_to_what_the_engine_computed() -> None:
    router = D2LPM(W4, worker_quantum=1000, cost=CostModel(1.0, 2.0))
    request_id = send(router, [1, 2, 3], tokens=300)  # charged 300 at dispatch
    worker = router.in_flight(request_id)
    assert worker is not None
    assert router.deficits["a"][worker] == 700.0
    # The engine found 200 of the 300 prompt tokens cached and generated 10.
    router.complete(request_id, output_tokens=10, uncached_input=100)
    assert router.deficits["a"][worker] == 1000.0 - 100 - 2 * 10
    with pytest.raises(ConfigError, match="uncached_input"):
        router.complete(send(router, [9]), uncached_input=-1)


def test_matches_shorter_than_min_match_count_as_none() -> None:
    router = D2LPM(["w0", "w1"], worker_quantum=1000, min_match=8)
    assert to(router, "Manual A: the whole of part A") == "w0"
    assert to(router, "Manual B: the whole of part B") == "w1"  # 7 shared chars: no match
    assert to(router, "Manual A: the whole of part A, again") == "w0"


def test_empty_match_load_balances_over_workers_with_credit() -> None:
    router = D2LPM(W4, worker_quantum=100)
    chosen = [to(router, [i, 0, 0], tokens=10) for i in range(4)]  # distinct first tokens
    assert chosen == W4

    router = D2LPM(["w0", "w1", "w2"], worker_quantum=100)
    spent = send(router, [0], tokens=100)  # w0: credit 0
    assert router.in_flight(spent) == "w0"
    assert [to(router, [1]), to(router, [2])] == ["w1", "w2"]
    router.complete(spent)
    assert outstanding(router) == {"w0": 0, "w1": 1, "w2": 1}
    # w0 is the least loaded, but the tenant has no credit there
    assert to(router, [3]) == "w1"
    assert to(router, [4]) == "w2"
    assert router.deficits["a"]["w0"] == 0.0


def test_longest_match_holders_with_credit_preferred_least_outstanding_among_them() -> None:
    router = D2LPM(W4, worker_quantum=10_000)
    system = list(range(100))
    assert to(router, [*system, 1, 2, 3]) == "w0"
    router.tree.insert([*system, 1, 2, 3], "w2")  # w2 holds the same long prefix
    router.tree.insert(system, "w1")  # w1 only the shorter one
    elsewhere = send(router, [500], tokens=1)
    assert router.in_flight(elsewhere) == "w1"  # empty match: least loaded
    # holders of the longest match: w0 (1 outstanding) and w2 (0); w3 is idle, no holder
    assert to(router, [*system, 1, 2, 3, 4]) == "w2"
    assert to(router, [*system, 1, 2, 3, 5]) == "w0"  # tie at 1: fewer dispatched, id
    assert outstanding(router) == {"w0": 2, "w1": 1, "w2": 1, "w3": 0}
    # a request matching only `system` has holders w0, w1, w2: the least loaded of them
    router.complete(elsewhere)
    assert to(router, [*system, 9]) == "w1"
    assert outstanding(router)["w3"] == 0


def test_holders_without_credit_fall_back_to_least_loaded_worker_with_credit() -> None:
    router = D2LPM(W4, worker_quantum=100)
    key = [7] * 50
    first = send(router, key, tokens=60)  # w0: 40
    second = send(router, key, tokens=60)  # still a holder with credit: w0: -20
    assert router.in_flight(first) == router.in_flight(second) == "w0"
    assert [to(router, [1], tenant="b"), to(router, [2], tenant="b")] == ["w1", "w2"]
    # w0 holds the prefix but `a` has no credit there: the least loaded with credit
    assert to(router, key, tokens=60) == "w3"  # w3: 40
    router.complete(first)
    router.complete(second)
    assert outstanding(router) == {"w0": 0, "w1": 1, "w2": 1, "w3": 1}
    # holders w0 (least loaded, no credit) and w3 (credit): w3
    assert to(router, key, tokens=60) == "w3"  # w3: -20
    # no holder has credit: the least loaded of w1, w2, not the idle holder w0
    assert to(router, key, tokens=10) == "w1"
    assert deficits(router, "a") == {"w0": -20.0, "w1": 90.0, "w2": 100.0, "w3": -20.0}


def test_exhausted_everywhere_refills_all_workers_repeatedly_in_one_call() -> None:
    router = D2LPM(["w0", "w1"], worker_quantum=100)
    assert to(router, [1], tokens=1000) == "w0"
    assert deficits(router, "a") == {"w0": -900.0, "w1": 100.0}
    assert to(router, [2], tokens=350) == "w1"  # the only worker with credit
    assert deficits(router, "a") == {"w0": -900.0, "w1": -250.0}
    assert router.refill_rounds == 1
    # w1 needs 3 refills to turn positive, w0 10: 3 rounds on both, in this one call
    assert to(router, [3], tokens=0) == "w1"
    assert router.refill_rounds == 4
    assert deficits(router, "a") == {"w0": -600.0, "w1": 50.0}


def test_refill_never_exceeds_the_quantum() -> None:
    router = D2LPM(["w0", "w1", "w2"], worker_quantum=100)
    to(router, [1], tokens=300)  # w0: -200
    to(router, [2], tokens=100)  # w1: 0
    to(router, [3], tokens=100)  # w2: 0 -> all exhausted
    assert deficits(router, "a") == {"w0": -200.0, "w1": 0.0, "w2": 0.0}
    worker = to(router, [4], tokens=0)
    assert router.refill_rounds == 2
    # one round (w1 and w2 need one): nobody rises above Q
    assert deficits(router, "a") == {"w0": -100.0, "w1": 100.0, "w2": 100.0}
    assert worker in {"w1", "w2"}


def test_a_debt_too_deep_to_count_up_to_is_refilled_in_one_step() -> None:
    """A charge of 1e300 (one heard from another replica, forged) spun the refill's count
    for ever: past 2^53 rounds, one more round no longer changes rounds × Q^w. The count
    is a closed form: the tenant is refilled at once and routed."""
    router = D2LPM(["w0", "w1"], worker_quantum=8192)
    for worker in ("w0", "w1"):
        router.charge_elsewhere("a", worker, 1e300)
    assert to(router, [1], tokens=10) in {"w0", "w1"}
    assert router.refill_rounds == refills_to_credit(-1e300, 8192.0) > 2**53
    assert all(0 < value <= 8192.0 or value == -1e300 for value in deficits(router, "a").values())


def test_dispatch_charges_full_input_and_completion_charges_output() -> None:
    router = D2LPM(["w0"], worker_quantum=1000, cost=CostModel(1.5, 3.0))
    key = list(range(40))
    first = send(router, key, tokens=40)
    assert router.deficits["a"]["w0"] == 1000 - 1.5 * 40
    # the second request hits the same prefix, but the router cannot know the engine's
    # cache: the full input is charged again (line 16)
    second = send(router, key, tokens=40)
    assert router.deficits["a"]["w0"] == 1000 - 2 * 1.5 * 40
    router.complete(first, output_tokens=7)
    assert router.deficits["a"]["w0"] == 1000 - 2 * 1.5 * 40 - 3.0 * 7
    router.complete(second)
    assert router.deficits["a"]["w0"] == 1000 - 2 * 1.5 * 40 - 3.0 * 7


def test_default_cost_is_we1_wq2() -> None:
    router = D2LPM(["w0"], worker_quantum=1000)
    router.complete(send(router, [1], tokens=10), output_tokens=5)
    assert router.deficits["a"]["w0"] == 1000 - 10 - 2 * 5


def test_eviction_reports_prune_the_tree() -> None:
    router = D2LPM(["w0", "w1"], worker_quantum=10_000)
    key = list(range(64))
    assert to(router, key) == "w0"
    assert to(router, key) == "w0"  # locality beats load (w0: 2, w1: 0)
    router.evicted(key, "w0", keep=16)  # w0 keeps the first 16 tokens only
    assert router.tree.match_length(key, "w0") == 16
    assert to(router, key) == "w0"  # still the longest (16-token) match
    router.evicted(key, "w0", keep=0)
    router.evicted(key, "w0", keep=0)  # a repeated report is harmless
    assert "w0" not in router.tree.match(key).owners
    assert to(router, key) == "w1"  # no holder: the least loaded


def test_eviction_for_an_unknown_worker_or_key_changes_nothing() -> None:
    router = D2LPM(["w0", "w1"])
    key = list(range(8))
    to(router, key)
    router.evicted(key, "nobody", keep=0)
    router.evicted([99, 98], "w0", keep=0)
    assert router.tree.match(key).owners == {"w0"}


def test_weights_scale_the_quantum() -> None:
    router = D2LPM(["w0", "w1"], worker_quantum=100, weights=TenantWeights({"heavy": 2.5}))
    assert router.tenant_quantum("heavy") == 250
    assert router.tenant_quantum("light") == 100
    to(router, [1], tenant="heavy", tokens=0)
    to(router, [2], tenant="light", tokens=0)
    assert deficits(router, "heavy") == {"w0": 250.0, "w1": 250.0}
    assert deficits(router, "light") == {"w0": 100.0, "w1": 100.0}
    # a heavy tenant stays on its favourite 2.5 times as long
    router = D2LPM(["w0", "w1"], worker_quantum=100, weights=TenantWeights({"heavy": 2.5}))
    prefix = list(range(30))
    heavy = Counter(to(router, [*prefix, i], tenant="heavy", tokens=10) for i in range(25))
    assert heavy["w0"] == 25
    assert to(router, [*prefix, 99], tenant="heavy", tokens=10) == "w1"


@pytest.mark.parametrize(("quantum", "spread"), [(1000.0, True), (1e15, False)])
def test_backlogged_shared_prefix_tenant_spreads_once_its_favourite_is_spent(
    quantum: float, spread: bool
) -> None:
    """Thm A.5's intuition: finite Q^w spreads a backlogged tenant, Q^w = ∞ pins it."""
    router = D2LPM(W4, worker_quantum=quantum)
    system = list(range(200))
    placed = [to(router, [*system, 1000 + i], tenant="f", tokens=100) for i in range(40)]
    if spread:
        # 10 requests of 100 tokens use Q^w on a worker; then the next one is taken
        assert placed == [w for w in W4 for _ in range(10)]
        assert router.tree.match(system).owners == set(W4)
    else:
        assert set(placed) == {"w0"}
    # a tenant with no shared prefix is load-balanced over all workers
    other = Counter(to(router, [5000 + i], tenant="g", tokens=100) for i in range(9))
    assert set(other) == (set(W4) if spread else {"w1", "w2", "w3"})


def test_workers_added_later_start_at_zero() -> None:
    router = D2LPM(["w0"], worker_quantum=100)
    to(router, [1], tokens=30)
    router.add_worker("w1")
    assert deficits(router, "a") == {"w0": 70.0, "w1": 0.0}
    assert to(router, [2], tokens=0) == "w0"  # no credit on w1 until the next refill


def test_removed_worker_comes_back_at_zero_even_after_late_completions() -> None:
    router = D2LPM(["w0", "w1"], worker_quantum=100)
    request_id = send(router, [1], tokens=30)
    assert router.in_flight(request_id) == "w0"
    router.remove_worker("w0")
    assert "w0" not in router.deficits["a"]
    router.complete(request_id, output_tokens=20)  # finishes after w0 left
    router.add_worker("w0")
    assert deficits(router, "a") == {"w0": 0.0, "w1": 100.0}
    assert router.workers["w0"].outstanding == 0


def test_bad_key_raises_before_touching_deficits() -> None:
    router = D2LPM(["w0"], worker_quantum=100)
    to(router, [1, 2, 3], tokens=0)
    before = (deficits(router, "b"), router.refill_rounds)
    with pytest.raises(ConfigError) as info:
        to(router, "text into a token tree", tenant="b")
    assert info.value.parameter == "sequence"
    assert (deficits(router, "b"), router.refill_rounds) == before


@pytest.mark.parametrize("quantum", [0, -1, float("nan"), True])
def test_worker_quantum_must_be_positive(quantum: Any) -> None:
    with pytest.raises(ConfigError) as info:
        D2LPM(W4, worker_quantum=quantum)
    assert info.value.parameter == "worker_quantum"


# ---------------------------------------------------------------------- properties

TENANTS = ["t0", "t1", "t2"]
WEIGHTS = {"t0": 1.0, "t1": 2.0, "t2": 0.5}
# Keys over a tiny alphabet share prefixes often; a few long shared "system prompts".
SYSTEMS = [[], [9] * 12, [8, 7] * 8]

route_op = st.tuples(
    st.just("route"),
    st.sampled_from(TENANTS),
    st.sampled_from(range(len(SYSTEMS))),
    st.lists(st.integers(0, 3), max_size=10),
    st.integers(0, 400),
)
complete_op = st.tuples(st.just("complete"), st.integers(0, 1000), st.integers(0, 300))
evict_op = st.tuples(st.just("evict"), st.integers(0, 1000), st.integers(0, 7), st.integers(0, 30))
# Long enough that tenants run out of credit everywhere, unevenly, several times.
operations = st.lists(
    st.one_of(route_op, route_op, complete_op, evict_op), min_size=20, max_size=150
)


def holders_of_longest_match(router: D2LPM, key: list[int]) -> set[str]:
    lengths = router.tree.match_lengths(key)
    if not lengths:
        return set()
    longest = max(lengths.values())
    return {str(owner) for owner, length in lengths.items() if length == longest}


@given(
    workers=st.integers(1, 5),
    quantum=st.sampled_from([20.0, 100.0, 300.0, 5000.0, None]),
    weighted=st.booleans(),
    max_tree_tokens=st.sampled_from([16, 1 << 20]),
    ops=operations,
)
def test_d2lpm_properties(
    workers: int,
    quantum: float | None,
    weighted: bool,
    max_tree_tokens: int,
    ops: list[tuple[Any, ...]],
) -> None:
    """With `auto` Q^w (None), prompts cost up to 100× their tokens, so Q^w grows past its
    floor as larger prompts are routed."""
    pool = [f"w{i}" for i in range(workers)]
    weights = TenantWeights(WEIGHTS if weighted else {})
    cost = CostModel(extend_weight=100.0) if quantum is None else None
    router = D2LPM(pool, quantum, cost=cost, weights=weights, max_tree_tokens=max_tree_tokens)
    cost = router.cost
    in_flight: list[tuple[str, str]] = []  # (request id, worker)
    keys: list[list[int]] = []
    routed: Counter[str] = Counter()
    completed: Counter[str] = Counter()

    for op in ops:
        if op[0] == "route":
            _, tenant, system, tail, tokens = op
            key = SYSTEMS[system] + tail
            before = deficits(router, tenant)
            credit = {w for w, q in before.items() if q > 0}
            holders = holders_of_longest_match(router, key) & credit
            load = outstanding(router)
            quantum_t = router.tenant_quantum(tenant)  # the refill's; routing may grow it
            request = RouteRequest(f"r{next(_ids)}", tenant, key, tokens)
            worker = router.route(request).worker
            charge = cost.service(tokens, 0)
            # (a) never a worker without credit while another has some
            if credit:
                assert worker in credit, (worker, before)
                assert router.deficits[tenant][worker] == before[worker] - charge
                # locality first among workers with credit, then the shortest queue
                if holders:
                    assert worker in holders
                    assert load[worker] == min(load[w] for w in holders)
                else:
                    assert load[worker] == min(load[w] for w in credit)
            else:
                # refilled on every worker by the same number of quanta (the fewest that
                # give some worker credit), then sent to a worker with credit
                rounds = min(refills_to_credit(q, quantum_t) for q in before.values())
                after = deficits(router, tenant)
                after[worker] += charge
                assert after == {w: q + rounds * quantum_t for w, q in before.items()}
                assert after[worker] > 0
            in_flight.append((request.request_id, worker))
            keys.append(key)
            routed[worker] += 1
        elif op[0] == "complete" and in_flight:
            _, index, output = op
            request_id, worker = in_flight.pop(index % len(in_flight))
            router.complete(request_id, output)
            completed[worker] += 1
        elif op[0] == "evict" and keys:
            _, index, worker_index, keep = op
            key = keys[index % len(keys)]
            worker = pool[worker_index % len(pool)]
            keep = min(keep, max(len(key) - 1, 0))
            router.evicted(key, worker, keep)
            assert router.tree.match_length(key, worker) <= keep
        # (b) credit never exceeds the tenant's quantum on any worker
        for tenant in TENANTS:
            limit = router.tenant_quantum(tenant)
            for worker, q in deficits(router, tenant).items():
                assert q <= limit, (tenant, worker, q, limit)
        # (c) outstanding = routed - completed, per worker
        assert outstanding(router) == {w: routed[w] - completed[w] for w in pool}
        # (d) an `auto` Q^w is eight of the largest prompts routed, at least its floor
        if quantum is None:
            assert router.worker_quantum == max(
                AUTO_WORKER_QUANTUM_FLOOR, AUTO_WORKER_QUANTUM_REQUESTS * router.largest_prompt
            )


@given(
    quantum=st.sampled_from([100.0, 1000.0]),
    sizes=st.lists(st.integers(1, 500), min_size=1, max_size=60),
)
def test_backlogged_tenant_is_refilled_on_all_workers_alike(
    quantum: float, sizes: list[int]
) -> None:
    """A tenant that never completes is refilled only when spent everywhere, so every
    worker has received the same number of quanta and the spent service per worker
    differs by at most one request plus Q^w (Theorem 5.1's key step)."""
    router = D2LPM(W4, worker_quantum=quantum)
    for size in sizes:
        to(router, [size % 3, size], tenant="f", tokens=size)
    credit = router.refill_rounds * quantum
    spent = {w: credit - q for w, q in deficits(router, "f").items()}
    assert sum(spent.values()) == sum(sizes)
    assert max(spent.values()) - min(spent.values()) <= max(sizes) + quantum
