"""Routers: round robin, least load, SGLang's cache_aware, the base bookkeeping, registry."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairpool.sched.cost import CostModel
from fairpool.sched.errors import ConfigError
from fairpool.sched.registry import ROUTERS, make_router
from fairpool.sched.routers import (
    D2LPM,
    JFFC,
    CacheAware,
    ChainProfile,
    LeastLoad,
    PrefixRouter,
    RoundRobin,
    Router,
    RouteRequest,
)

pytestmark = pytest.mark.unit

_ids: Iterator[int] = itertools.count()


def req(
    key: Sequence[Any] = "", tenant: str = "t", input_tokens: int | None = None
) -> RouteRequest:
    tokens = len(key) if input_tokens is None else input_tokens
    return RouteRequest(f"r{next(_ids)}", tenant, key, tokens)


def route(router: Router, key: Sequence[Any] = "", tenant: str = "t") -> tuple[str, str]:
    """Route a fresh request; returns (request id, worker)."""
    request = req(key, tenant)
    return request.request_id, router.route(request).worker


@contextmanager
def raises_config(parameter: str) -> Iterator[None]:
    """Expect a ConfigError about `parameter` (its attribute and its message)."""
    with pytest.raises(ConfigError) as info:
        yield
    assert info.value.parameter == parameter
    assert str(info.value).startswith(f"{parameter}:")


WORKERS = ["w0", "w1", "w2"]
PROMPT = "You are a helpful assistant. Answer briefly and cite sources. " * 2


# ---------------------------------------------------------------------- round robin


def test_round_robin_cycles_in_order() -> None:
    router = RoundRobin(WORKERS)
    assert [route(router)[1] for _ in range(7)] == [*WORKERS, *WORKERS, "w0"]


def test_round_robin_ignores_load_and_prefixes() -> None:
    router = RoundRobin(WORKERS)
    router.update_load("w1", kv_usage=0.99, waiting=100)
    chosen = [route(router, PROMPT)[1] for _ in range(6)]  # nothing is completed
    assert chosen == [*WORKERS, *WORKERS]
    assert [router.workers[w].outstanding for w in WORKERS] == [2, 2, 2]


def test_round_robin_includes_an_added_worker() -> None:
    router = RoundRobin(WORKERS)
    route(router)
    router.add_worker("w3")
    window = [route(router)[1] for _ in range(4)]
    assert sorted(window) == ["w0", "w1", "w2", "w3"]
    window = [route(router)[1] for _ in range(8)]
    assert sorted(window) == sorted(["w0", "w1", "w2", "w3"] * 2)


def test_round_robin_skips_a_removed_worker() -> None:
    router = RoundRobin(WORKERS)
    route(router)
    route(router)
    router.remove_worker("w1")
    chosen = [route(router)[1] for _ in range(6)]
    assert "w1" not in chosen
    assert sorted(chosen) == ["w0", "w0", "w0", "w2", "w2", "w2"]
    assert chosen[0::2] == [chosen[0]] * 3  # still alternating


def test_round_robin_after_removing_the_last_position() -> None:
    router = RoundRobin(WORKERS)
    route(router)
    route(router)  # next index is 2
    router.remove_worker("w2")
    assert sorted(route(router)[1] for _ in range(4)) == ["w0", "w0", "w1", "w1"]


# ---------------------------------------------------------------------- least load


def test_least_load_picks_fewest_outstanding() -> None:
    router = LeastLoad(WORKERS)
    first = [route(router) for _ in range(3)]
    assert sorted(worker for _, worker in first) == WORKERS  # one each
    assert route(router)[1] == "w0"  # all tied at 1: by id
    assert [router.workers[w].outstanding for w in WORKERS] == [2, 1, 1]
    on_w2 = next(request_id for request_id, worker in first if worker == "w2")
    router.complete(on_w2)
    assert route(router)[1] == "w2"
    assert route(router)[1] == "w1"  # w1 and w2 at 1, w1 dispatched fewer
    assert [router.workers[w].outstanding for w in WORKERS] == [2, 2, 1]


def test_least_load_ties_broken_by_kv_usage_then_dispatched_then_id() -> None:
    router = LeastLoad(WORKERS)
    router.update_load("w0", kv_usage=0.5)
    router.update_load("w1", kv_usage=0.2)
    router.update_load("w2", kv_usage=0.2)
    assert route(router)[1] == "w1"  # lowest KV usage, id before w2
    request_id, worker = route(router)
    assert worker == "w2"  # w1 now has 1 outstanding
    router.complete(request_id)
    # w2 and w0 both at 0 outstanding... w2 has lower KV usage
    request_id, worker = route(router)
    assert worker == "w2"
    router.complete(request_id)
    router.update_load("w2", kv_usage=0.5)
    router.update_load("w0", kv_usage=0.5)
    # w0 and w2 tie on outstanding (0) and KV (0.5): fewer dispatched wins (w0: 0, w2: 2)
    assert route(router)[1] == "w0"


def test_least_load_ignores_engine_waiting_queue() -> None:
    router = LeastLoad(WORKERS)
    router.update_load("w0", waiting=50)
    assert route(router)[1] == "w0"  # s_w counts the router's own outstanding requests


# ---------------------------------------------------------------------- cache aware


def set_load(router: Router, loads: dict[str, int]) -> None:
    for worker, load in loads.items():
        router.workers[worker].outstanding = load


def test_cache_aware_defaults_are_sglangs() -> None:
    router = CacheAware(WORKERS)
    assert router.cache_threshold == 0.3
    assert router.balance_abs_threshold == 64
    assert router.balance_rel_threshold == 1.5


def test_cache_aware_routes_to_the_prefix_holder_above_threshold() -> None:
    router = CacheAware(WORKERS)
    _, holder = route(router, PROMPT + "first question")
    assert holder == "w0"
    set_load(router, {"w0": 5, "w1": 0, "w2": 0})  # the holder is busier, but balanced enough
    for suffix in ("second question", "third"):
        assert route(router, PROMPT + suffix)[1] == "w0"


def test_cache_aware_routes_least_loaded_below_threshold() -> None:
    router = CacheAware(WORKERS, cache_threshold=0.5)
    route(router, "abcde" + "fghij")  # w0 holds "abcdefghij"
    set_load(router, {"w0": 3, "w1": 2, "w2": 1})
    # 5 of 10 characters match: a rate of exactly 0.5 is not above the threshold
    assert route(router, "abcde" + "vwxyz")[1] == "w2"
    # 6 of 10 is
    set_load(router, {"w0": 3, "w1": 2, "w2": 1})
    assert route(router, "abcdef" + "wxyz")[1] == "w0"
    # nothing cached: least loaded
    set_load(router, {"w0": 3, "w1": 2, "w2": 1})
    assert route(router, "zzzzzzzzzz")[1] == "w2"


def test_cache_aware_prefers_the_least_loaded_holder() -> None:
    router = CacheAware(WORKERS)
    route(router, PROMPT)  # w0
    set_load(router, {"w0": 1, "w1": 0, "w2": 0})
    router.tree.insert(PROMPT, "w2")
    set_load(router, {"w0": 4, "w1": 0, "w2": 3})
    assert route(router, PROMPT + "x")[1] == "w2"


def test_cache_aware_empty_key_goes_least_loaded() -> None:
    router = CacheAware(WORKERS, cache_threshold=0.0)
    set_load(router, {"w0": 2, "w1": 1, "w2": 3})
    assert route(router, "")[1] == "w1"


@pytest.mark.parametrize(
    ("loads", "imbalanced"),
    [
        ({"w0": 4, "w1": 1, "w2": 2}, True),  # 4 - 1 > 2 and 4 > 1.5 × 1
        ({"w0": 10, "w1": 7, "w2": 8}, False),  # 10 - 7 > 2, but 10 ≤ 1.5 × 7 (relative fails)
        ({"w0": 3, "w1": 1, "w2": 1}, False),  # 3 > 1.5 × 1, but 3 - 1 ≤ 2 (absolute fails)
        ({"w0": 3, "w1": 0, "w2": 0}, True),  # 3 > 1.5 × 0
        ({"w0": 2, "w1": 0, "w2": 0}, False),  # difference equal to the threshold
    ],
)
def test_cache_aware_imbalance_needs_both_conditions(
    loads: dict[str, int], imbalanced: bool
) -> None:
    router = CacheAware(WORKERS, balance_abs_threshold=2, balance_rel_threshold=1.5)
    route(router, PROMPT)  # w0 holds the prompt
    set_load(router, loads)
    assert router.is_imbalanced() is imbalanced
    least = min(WORKERS, key=lambda w: loads[w])
    assert route(router, PROMPT + "again")[1] == (least if imbalanced else "w0")


def test_cache_aware_default_imbalance_thresholds() -> None:
    router = CacheAware(WORKERS)
    set_load(router, {"w0": 64, "w1": 0, "w2": 0})
    assert not router.is_imbalanced()  # 64 is not above 64
    set_load(router, {"w0": 65, "w1": 0, "w2": 0})
    assert router.is_imbalanced()
    set_load(router, {"w0": 265, "w1": 200, "w2": 220})
    assert not router.is_imbalanced()  # 265 - 200 > 64, but 265 ≤ 1.5 × 200
    set_load(router, {"w0": 151, "w1": 100, "w2": 151})
    assert not router.is_imbalanced()  # 151 > 1.5 × 100, but 151 - 100 ≤ 64
    set_load(router, {"w0": 265, "w1": 170, "w2": 200})
    assert router.is_imbalanced()


def test_cache_aware_inserts_after_every_decision() -> None:
    router = CacheAware(WORKERS, cache_threshold=0.5, balance_abs_threshold=2)
    # below threshold
    _, worker = route(router, "hello there")
    assert router.tree.match("hello there").owners == {worker}
    # above threshold
    _, again = route(router, "hello there, friend")
    assert again == worker
    assert router.tree.match("hello there, friend").owners == {worker}
    # imbalanced: sent elsewhere, and the tree learns that worker holds it too
    set_load(router, {worker: 10})
    _, other = route(router, "hello there, friend")
    assert other != worker
    assert router.tree.match("hello there, friend").owners == {worker, other}


def test_cache_aware_with_token_keys() -> None:
    router = CacheAware(WORKERS)
    system = list(range(100))
    route(router, [*system, 1000])
    set_load(router, {"w0": 3})
    assert route(router, [*system, 2000, 2001])[1] == "w0"
    with raises_config("sequence"):
        route(router, "text into a token tree")


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"cache_threshold": 1.5}, "cache_threshold"),
        ({"cache_threshold": -0.1}, "cache_threshold"),
        ({"balance_abs_threshold": -1}, "balance_abs_threshold"),
        ({"balance_rel_threshold": 0}, "balance_rel_threshold"),
        ({"max_tree_tokens": 0}, "max_tree_tokens"),
    ],
)
def test_cache_aware_rejects_bad_parameters(params: dict[str, Any], parameter: str) -> None:
    with raises_config(parameter):
        CacheAware(WORKERS, **params)


# ---------------------------------------------------------------------- base behaviour


ALL_ROUTERS: list[type[Router]] = [RoundRobin, LeastLoad, CacheAware, D2LPM]


@pytest.mark.parametrize("cls", ALL_ROUTERS)
def test_complete_decrements_outstanding(cls: type[Router]) -> None:
    router = cls(WORKERS)
    first, worker = route(router, PROMPT)
    second, worker2 = route(router, PROMPT)
    total = {w: router.workers[w].outstanding for w in WORKERS}
    assert sum(total.values()) == 2
    router.complete(first, output_tokens=7)
    assert router.workers[worker].outstanding == total[worker] - 1
    assert router.in_flight(first) is None
    assert router.in_flight(second) == worker2
    router.complete(second)
    assert all(router.workers[w].outstanding == 0 for w in WORKERS)
    assert sum(router.workers[w].dispatched for w in WORKERS) == 2  # dispatched stays


@pytest.mark.parametrize("cls", ALL_ROUTERS)
def test_unknown_or_repeated_completion_raises(cls: type[Router]) -> None:
    router = cls(WORKERS)
    with raises_config("request_id"):
        router.complete("never-routed")
    request_id, _ = route(router, PROMPT)
    router.complete(request_id)
    with raises_config("request_id"):
        router.complete(request_id)


@pytest.mark.parametrize("cls", ALL_ROUTERS)
def test_duplicate_request_id_raises_and_changes_nothing(cls: type[Router]) -> None:
    router = cls(WORKERS)
    request = req(PROMPT)
    worker = router.route(request).worker
    with raises_config("request_id"):
        router.route(RouteRequest(request.request_id, "other", "x", 1))
    assert sum(state.outstanding for state in router.workers.values()) == 1
    assert router.in_flight(request.request_id) == worker
    router.complete(request.request_id)
    router.route(request)  # an id may be reused once complete


@pytest.mark.parametrize("cls", ALL_ROUTERS)
def test_empty_pool_raises(cls: type[Router]) -> None:
    router = cls()
    with raises_config("workers"):
        route(router, PROMPT)
    router.add_worker("w0")
    route(router, PROMPT)
    router.remove_worker("w0")
    with raises_config("workers"):
        route(router, PROMPT)


@pytest.mark.parametrize("cls", ALL_ROUTERS)
def test_bad_output_tokens_keeps_the_request_in_flight(cls: type[Router]) -> None:
    router = cls(WORKERS)
    request_id, worker = route(router, PROMPT)
    with raises_config("output_tokens"):
        router.complete(request_id, output_tokens=-1)
    assert router.in_flight(request_id) == worker
    router.complete(request_id, output_tokens=3)
    assert router.workers[worker].outstanding == 0


@pytest.mark.parametrize("cls", ALL_ROUTERS)
def test_completion_after_worker_left_does_not_touch_a_readded_worker(cls: type[Router]) -> None:
    router = cls(["w0"])
    request_id, _ = route(router, PROMPT)
    router.remove_worker("w0")
    router.add_worker("w0")
    assert router.workers["w0"].outstanding == 0
    router.complete(request_id, output_tokens=5)
    assert router.workers["w0"].outstanding == 0
    with raises_config("request_id"):
        router.complete(request_id)


@pytest.mark.parametrize("cls", [CacheAware, D2LPM])
def test_remove_worker_forgets_tree_ownership(cls: type[PrefixRouter]) -> None:
    router = cls(WORKERS)
    _, holder = route(router, PROMPT)
    assert holder in router.tree.owners()
    router.remove_worker(holder)
    assert holder not in router.tree.owners()
    assert router.tree.match(PROMPT).owners == frozenset()
    chosen = {route(router, PROMPT + str(i))[1] for i in range(4)}
    assert holder not in chosen


@pytest.mark.parametrize("cls", ALL_ROUTERS)
def test_removing_an_unknown_worker_is_a_no_op(cls: type[Router]) -> None:
    router = cls(WORKERS)
    router.remove_worker("nobody")
    assert list(router.workers) == WORKERS


def test_add_worker_is_idempotent_and_validated() -> None:
    router = LeastLoad(["w0"])
    route(router)
    router.add_worker("w0")
    assert router.workers["w0"].outstanding == 1
    with raises_config("worker_id"):
        router.add_worker("")
    with raises_config("worker_id"):
        router.add_worker(3)  # type: ignore[arg-type]
    with raises_config("worker_id"):
        LeastLoad(["w0", ""])


def test_update_load_sets_and_validates() -> None:
    router = LeastLoad(WORKERS)
    router.update_load("w1", kv_usage=0.25, waiting=4)
    assert (router.workers["w1"].kv_usage, router.workers["w1"].waiting) == (0.25, 4)
    router.update_load("w1", waiting=2)
    assert (router.workers["w1"].kv_usage, router.workers["w1"].waiting) == (0.25, 2)
    with raises_config("worker_id"):
        router.update_load("nobody", kv_usage=0.1)
    with raises_config("kv_usage"):
        router.update_load("w1", kv_usage=-0.1)
    with raises_config("kv_usage"):
        router.update_load("w1", kv_usage=float("nan"))
    with raises_config("waiting"):
        router.update_load("w1", waiting=-1)
    with raises_config("waiting"):
        router.update_load("w1", waiting=1.5)  # type: ignore[arg-type]
    assert (router.workers["w1"].kv_usage, router.workers["w1"].waiting) == (0.25, 2)


@pytest.mark.parametrize(
    ("fields", "parameter"),
    [
        (("", "t", "k", 1), "request_id"),
        (("r", "", "k", 1), "tenant"),
        (("r", "t", "k", -1), "input_tokens"),
        (("r", "t", "k", 1.0), "input_tokens"),
    ],
)
def test_route_request_validation(fields: tuple[Any, ...], parameter: str) -> None:
    with raises_config(parameter):
        RouteRequest(*fields)


def test_evicted_is_a_no_op_for_load_only_routers() -> None:
    router = RoundRobin(WORKERS)
    router.evicted("anything", "w0")
    router.evicted("anything", "nobody", keep=0)


# ---------------------------------------------------------------------- registry


def test_registry_knows_every_router() -> None:
    assert set(ROUTERS) == {"round_robin", "least_load", "cache_aware", "d2lpm", "jffc"}
    for name, cls in ROUTERS.items():
        router = make_router(name, WORKERS)
        assert isinstance(router, cls)
        assert router.name == name
        assert list(router.workers) == WORKERS


def test_registry_passes_parameters() -> None:
    cost = CostModel(extend_weight=2.0, output_weight=3.0)
    d2lpm = make_router("d2lpm", WORKERS, cost=cost, weights={"a": 2}, worker_quantum=4096)
    assert isinstance(d2lpm, D2LPM)
    assert d2lpm.worker_quantum == 4096
    assert d2lpm.cost is cost
    assert d2lpm.tenant_quantum("a") == 8192
    assert d2lpm.tenant_quantum("b") == 4096
    cache = make_router("cache_aware", WORKERS, cache_threshold=0.5, balance_abs_threshold=8)
    assert isinstance(cache, CacheAware)
    assert (cache.cache_threshold, cache.balance_abs_threshold) == (0.5, 8)
    # cost and weights are accepted for every router, and ignored by those without them
    assert isinstance(make_router("round_robin", WORKERS, cost=cost, weights={"a": 2}), RoundRobin)


@pytest.mark.parametrize(
    ("name", "params", "parameter"),
    [
        ("nope", {}, "router"),
        ("D2LPM", {}, "router"),
        ("d2lpm", {"worker_quantum": -1}, "worker_quantum"),
        ("d2lpm", {"worker_quantum": 0}, "worker_quantum"),
        ("d2lpm", {"worker_quantum": float("inf")}, "worker_quantum"),
        ("d2lpm", {"worker_quantum": "big"}, "worker_quantum"),
        ("d2lpm", {"max_tree_tokens": 0}, "max_tree_tokens"),
        ("d2lpm", {"weights": {"a": 0}}, "weights[a]"),
        ("cache_aware", {"cache_threshold": 1.5}, "cache_threshold"),
        ("cache_aware", {"balance_rel_threshold": -2}, "balance_rel_threshold"),
        ("cache_aware", {"worker_quantum": 10}, "worker_quantum"),
        ("round_robin", {"cache_threshold": 0.5}, "cache_threshold"),
        ("least_load", {"bogus": 1}, "bogus"),
        ("d2lpm", {"quantum": 1024}, "quantum"),
        ("least_load", {"workers": ["w0", ""]}, "worker_id"),
    ],
)
def test_registry_bad_names_and_parameters(
    name: str, params: dict[str, Any], parameter: str
) -> None:
    with raises_config(parameter):
        make_router(name, **params)


# ---------------------------------------------------------------------- JFFC (seed 003, Alg. 3)


def _jffc(profiles: dict[str, tuple[int, float]]) -> JFFC:
    chains = {worker: ChainProfile(capacity, rate) for worker, (capacity, rate) in profiles.items()}
    return JFFC(list(profiles), chains=chains)


def test_jffc_fills_the_fastest_chain_first_up_to_its_capacity() -> None:
    router = _jffc({"slow": (3, 0.5), "fast": (2, 2.0), "middle": (1, 1.0)})
    chosen = [router.route(RouteRequest(f"r{i}", "t", "", 1)).worker for i in range(6)]
    assert chosen == ["fast", "fast", "middle", "slow", "slow", "slow"]
    assert not router.has_room()
    with raises_config("workers"):
        router.route(RouteRequest("r6", "t", "", 1))
    router.complete("r3")  # a slow chain's slot frees: the queue head goes there
    assert router.room("slow") == 1
    assert router.route(RouteRequest("r7", "t", "", 1)).worker == "slow"


def test_jffc_ties_go_to_the_earliest_chain_and_unprofiled_workers_are_unbounded() -> None:
    router = JFFC(["a", "b", "c"], chains={"b": ChainProfile(1, 1.0)})
    assert router.room("a") is None
    assert [router.route(RouteRequest(f"r{i}", "t", "", 1)).worker for i in range(3)] == ["a"] * 3


@given(
    profiles=st.lists(
        st.tuples(st.integers(1, 4), st.sampled_from([0.5, 1.0, 2.0, 3.0])), min_size=1, max_size=5
    ),
    events=st.lists(st.booleans(), max_size=60),
)
def test_jffc_never_exceeds_capacity_and_always_picks_the_fastest_free_chain(
    profiles: list[tuple[int, float]], events: list[bool]
) -> None:
    router = _jffc({f"w{i}": profile for i, profile in enumerate(profiles)})
    running: list[str] = []
    for number, arrive in enumerate(events):
        if arrive and router.has_room():
            free = [w for w in router.workers if router.room(w)]
            fastest = max(router.chains[w].service_rate for w in free)
            worker = router.route(RouteRequest(f"r{number}", "t", "", 1)).worker
            assert router.chains[worker].service_rate == fastest
            running.append(f"r{number}")
        elif running:
            router.complete(running.pop(0))
        for worker, state in router.workers.items():
            assert 0 <= state.outstanding <= router.chains[worker].capacity


def test_chain_profile_validation() -> None:
    with raises_config("capacity"):
        ChainProfile(0, 1.0)
    with raises_config("service_rate"):
        ChainProfile(1, 0.0)


# ---------------------------------------------------------------------- the decision

keys = st.text(alphabet="ab", min_size=0, max_size=12)


@pytest.mark.parametrize("name", ["d2lpm", "cache_aware"])
@given(key_list=st.lists(keys, min_size=1, max_size=30), min_match=st.integers(0, 4))
def test_a_decision_reports_what_the_worker_held_before_this_request(name, key_list, min_match):
    """`matched` is the chosen worker's match as it was before the router learned this
    request's key: a lookup made after the insert would report every key as cached."""
    from fairpool.sched.radix import RadixTree

    router = make_router(name, WORKERS, min_match=min_match)
    before = RadixTree()  # what each worker was sent, learned only after each decision
    for key in key_list:
        decision = router.route(req(key))
        held = before.match_length(key, decision.worker)
        assert decision.matched == (held if held >= min_match else 0)
        before.insert(key, decision.worker)


def test_a_never_seen_prompt_is_a_miss_and_its_repeat_a_hit():
    router = make_router("d2lpm", ["w0"])
    assert router.route(req(PROMPT)).matched == 0
    assert router.route(req(PROMPT)).matched == len(PROMPT)
    assert router.route(req(PROMPT[:20] + "other")).matched == 20


def test_routers_without_a_tree_match_nothing():
    for name in ("round_robin", "least_load", "jffc"):
        router = make_router(name, WORKERS)
        router.route(req(PROMPT))
        assert router.route(req(PROMPT)).matched == 0 and router.cache_size() is None


@pytest.mark.parametrize("name", sorted(ROUTERS))
@given(
    steps=st.lists(
        st.tuples(keys, st.sets(st.sampled_from(WORKERS), min_size=1), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_a_decision_is_always_among_the_eligible_workers(name, steps):
    router = make_router(name, WORKERS, **({"worker_quantum": 10} if name == "d2lpm" else {}))
    in_flight = []
    for number, (key, eligible, finish) in enumerate(steps):
        decision = router.route(RouteRequest(f"r{number}", "t", key, 8), eligible)
        assert decision.worker in eligible
        in_flight.append(f"r{number}")
        if finish:
            router.complete(in_flight.pop(0), 4)
        if isinstance(router, D2LPM):  # credit stays bounded, restricted refills or not
            assert all(q <= router.tenant_quantum("t") for q in router.deficits["t"].values())


def test_round_robin_skips_workers_that_are_not_eligible():
    router = RoundRobin(WORKERS)
    chosen = [router.route(req(), {"w0", "w2"}).worker for _ in range(4)]
    assert chosen == ["w0", "w2", "w0", "w2"]
    with raises_config("eligible"):
        router.route(req(), {"elsewhere"})
