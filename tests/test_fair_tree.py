"""The fair order's tree (`fairpool.sched.tree`): its bounds, checked by random search.

Model: one server admits one waiting request at a time in the policy's order (VTC over the
tree), and each admission is charged its whole cost at once — the setting of VTC's Lemma
4.3 with service charged at admission, so that the bounds below are the tree's alone. U is
the largest cost a request may have.

- **Bands, strict priority.** With no minimum share for the lower bands, a request of a
  lower band is never admitted while one of a higher band waits.
- **A lower band's minimum share.** Over any stretch in which band b and another band have
  requests waiting throughout, b's service S_b ≥ φ_b·S − (2 + φ_b)·U, S the service of
  every band in that stretch (its credit stays in (−2U, φ_b·U]: it starts a request's worth
  in debt).
- **Groups.** Two sibling groups (same band, same parent) with requests waiting throughout
  a stretch: their weighted service differs by at most 2U / w_min there (VTC's Theorem 4.4
  at the groups' level: their counters stay within U / w_min of each other).
- **Organisations.** Org A with ten tenants and org B with one, equal weights, all
  backlogged: each org gets half, within the groups' bound.
- **Deadlines.** In the interactive band, with first-token targets, VTC takes the request
  due first among the flows within one request's worth of the least served: the waiting
  flows' counters stay within 2U / w_min, and two flows waiting throughout a stretch are
  served within 4U / w_min of each other; outside it, or without targets, nothing changes.
- **Flat tables are VTC.** A tree without groups and bands orders exactly as VTC without
  the tree did (the tests of tests/test_fairness_bounds.py run on it unchanged).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.sched import CostModel, EngineSnapshot, Request, make_policy
from fairpool.sched.errors import ConfigError
from fairpool.sched.tree import FairTree, Group, Shares, flow

pytestmark = pytest.mark.unit

COST = CostModel()
U = 400.0  # the largest request cost: prompts of 1..400 tokens, no output
VIEW = EngineSnapshot(memory_tokens=10**9)


@dataclass
class Server:
    """VTC over the tree, one admission at a time, each charged its prompt at once."""

    shares: Shares
    policy: object = None
    served: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    admitted: list[Request] = field(default_factory=list)
    count: int = 0

    def __post_init__(self) -> None:
        self.policy = make_policy("vtc", cost=COST, weights=self.shares)

    def arrive(self, flow_id: str, cost: int, arrival: float = 0.0) -> None:
        self.count += 1
        request = Request(f"r{self.count}", flow_id, cost, 1, arrival=arrival)
        self.policy.add(request)  # type: ignore[attr-defined]

    def step(self) -> Request | None:
        request = self.policy.next_request(VIEW)  # type: ignore[attr-defined]
        if request is None:
            return None
        self.policy.admit(request.request_id)  # type: ignore[attr-defined]
        self.policy.finish(request.request_id)  # type: ignore[attr-defined]
        self.served[request.tenant] += COST.prefill(request.prompt_tokens, 0)
        self.admitted.append(request)
        return request

    def waiting(self) -> set[str]:
        return set(self.policy.waiting_tenants())  # type: ignore[attr-defined]


BAND_FLOWS = {"interactive": "fast", "standard": "mid", "batch": "bulk"}
costs = st.integers(1, int(U))


def banded(min_shares: dict[str, float]) -> Shares:
    return Shares(
        {name: 1.0 for name in BAND_FLOWS.values()},
        tenant_bands={name: band for band, name in BAND_FLOWS.items()},
        min_shares=min_shares,
    )


schedule = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.sampled_from(sorted(BAND_FLOWS.values())), costs),
        st.tuples(st.just("step"), st.integers(1, 5)),
    ),
    max_size=150,
)


@given(events=schedule)
def test_without_minimum_shares_a_lower_band_waits_for_every_higher_request(events) -> None:
    server = Server(banded({"standard": 0.0, "batch": 0.0}))
    rank = {name: index for index, name in enumerate(BAND_FLOWS.values())}
    for event in events:
        if event[0] == "arrive":
            server.arrive(event[1], event[2])
            continue
        for _ in range(event[1]):
            waiting = server.waiting()
            chosen = server.step()
            if chosen is None:
                break
            assert rank[chosen.tenant] == min(rank[name] for name in waiting)


@settings(max_examples=200)
@given(
    events=schedule,
    standard=st.sampled_from([0.05, 0.1, 0.3]),
    batch=st.sampled_from([0.02, 0.05, 0.2]),
)
def test_a_lower_band_gets_its_minimum_share_while_others_have_work(events, standard, batch):
    shares = {"standard": standard, "batch": batch}
    server = Server(banded(shares))
    by_band = {name: band for band, name in BAND_FLOWS.items()}
    # Stretches in which a band and another had requests waiting throughout.
    start: dict[str, tuple[float, float]] = {}

    def check_and_open(waiting: set[str]) -> None:
        bands = {by_band[name] for name in waiting}
        for band, share in shares.items():
            contended = band in bands and len(bands) > 1
            if not contended:
                start.pop(band, None)
                continue
            total = sum(server.served.values())
            mine = server.served[BAND_FLOWS[band]]
            if band in start:
                total0, mine0 = start[band]
                assert mine - mine0 >= share * (total - total0) - (2 + share) * U - 1e-6
            else:
                start[band] = (total, mine)

    for event in events:
        if event[0] == "arrive":
            server.arrive(event[1], event[2])
            check_and_open(server.waiting())
            continue
        for _ in range(event[1]):
            before = server.waiting()
            if server.step() is None:
                break
            check_and_open(before & server.waiting() | (server.waiting() - before))


def organisations(tenants_in_a: int) -> Shares:
    names = [f"a{i}" for i in range(tenants_in_a)] + ["b0"]
    return Shares(
        dict.fromkeys(names, 1.0),
        groups={"org-a": Group(1.0), "org-b": Group(1.0)},
        tenant_groups={name: "org-a" if name.startswith("a") else "org-b" for name in names},
    )


@settings(max_examples=100)
@given(
    group_weights=st.tuples(st.sampled_from([0.5, 1.0, 3.0]), st.sampled_from([0.5, 1.0, 3.0])),
    arrivals=st.lists(st.tuples(st.integers(0, 5), costs), min_size=1, max_size=200),
    steps=st.integers(1, 300),
)
def test_two_backlogged_sibling_groups_stay_within_2u_over_w(group_weights, arrivals, steps):
    """Groups g (tenants g0..g2) and h (h0..h2), all their tenants flooding: while both
    groups have requests waiting, their weighted service stays within 2U / w_min."""
    wg, wh = group_weights
    names = ["g0", "g1", "g2", "h0", "h1", "h2"]
    shares = Shares(
        dict.fromkeys(names, 1.0),
        groups={"g": Group(wg), "h": Group(wh)},
        tenant_groups={name: name[0] for name in names},
    )
    server = Server(shares)
    for index, (who, cost) in enumerate(arrivals):
        server.arrive(names[who], cost)
        server.arrive(names[(who + 3) % 6], cost)  # the other group has work too
        if index % 7 == 0:
            for name in names:  # floods: everyone keeps work waiting
                server.arrive(name, int(U))
    bound = 2 * U / min(wg, wh)
    for _ in range(steps):
        waiting = server.waiting()
        if not (waiting & {"g0", "g1", "g2"}) or not (waiting & {"h0", "h1", "h2"}):
            break
        server.step()
        g = sum(server.served[name] for name in names[:3]) / wg
        h = sum(server.served[name] for name in names[3:]) / wh
        assert abs(g - h) <= bound + 1e-6


def test_an_organisation_with_ten_tenants_gets_no_more_than_one_with_one() -> None:
    shares = organisations(10)
    server = Server(shares)
    for _ in range(400):  # more than either org can be served in the run: both backlogged
        for name in shares:
            server.arrive(name, 100)
    for _ in range(400):
        server.step()
    org_a = sum(served for name, served in server.served.items() if name.startswith("a"))
    org_b = server.served["b0"]
    assert abs(org_a - org_b) <= 2 * U  # flat weights would give 10 : 1


# ---------------------------------------------------------------------- flows and shape


def test_a_request_may_run_below_its_tenants_band_never_above() -> None:
    assert flow("acme", None, "interactive") == "acme"
    assert flow("acme", "interactive", "interactive") == "acme"
    assert flow("acme", "batch", "interactive") == "acme@batch"
    with pytest.raises(ConfigError, match="above the tenant's band"):
        flow("acme", "interactive", "batch")
    shares = Shares({"acme": 3.0}, tenant_bands={"acme": "interactive"})
    assert shares["acme@batch"] == 3.0 and shares.band_of("acme@batch") == "batch"


def test_an_interactive_tenants_batch_job_waits_behind_interactive_work() -> None:
    shares = Shares(
        {"acme": 1.0, "other": 1.0},
        tenant_bands={"acme": "interactive", "other": "interactive"},
        min_shares={"standard": 0.0, "batch": 0.0},
    )
    server = Server(shares)
    server.arrive("acme@batch", 10)
    server.arrive("other", 10)
    server.arrive("acme", 10)
    order = [server.step().tenant for _ in range(3)]  # type: ignore[union-attr]
    assert order[-1] == "acme@batch"


@given(
    parents=st.dictionaries(
        st.sampled_from("abcdef"), st.one_of(st.none(), st.sampled_from("abcdef")), min_size=1
    )
)
def test_any_tree_of_groups_is_accepted_or_refused_for_its_cycle(parents) -> None:
    groups = {name: Group(1.0, parent) for name, parent in parents.items()}
    dangling = any(parent is not None and parent not in groups for parent in parents.values())

    def cyclic() -> bool:
        for name in groups:
            seen, at = set(), name
            while at is not None and at in groups:
                if at in seen:
                    return True
                seen.add(at)
                at = groups[at].parent
        return False

    try:
        Shares({}, groups=groups)
        assert not dangling and not cyclic()
    except ConfigError as error:
        assert dangling or cyclic()
        assert "parent" in error.parameter


def test_a_reshaped_tree_keeps_counters_and_takes_the_waiting_flows() -> None:
    tree = FairTree(Shares({"a": 1.0, "b": 1.0}))
    tree.join("a")
    tree.join("b")
    tree.charge("a", 100.0)
    tree.reshape(
        Shares({"a": 1.0, "b": 1.0}, groups={"g": Group()}, tenant_groups={"a": "g"}),
        ["a", "b"],
    )
    assert tree.counter("a") == 100.0  # the flow's counter is kept
    tree.charge("a", 50.0)  # and now its group's counter counts it
    assert tree.candidates(["a", "b"]) == ["b"]


# ---------------------------------------------------------------------- deadlines (EDF)

INTERACTIVE = ["i0", "i1", "i2"]
targets = st.sampled_from([None, 0.05, 0.5, 5.0])


def interactive(weights: tuple[float, ...], ttft: tuple[float | None, ...]) -> Shares:
    return Shares(
        dict(zip(INTERACTIVE, weights, strict=True)),
        tenant_bands=dict.fromkeys(INTERACTIVE, "interactive"),
        ttft={name: t for name, t in zip(INTERACTIVE, ttft, strict=True) if t is not None},
    )


@settings(max_examples=150)
@given(
    weights=st.tuples(*[st.sampled_from([0.5, 1.0, 3.0])] * 3),
    ttft=st.tuples(targets, targets, targets),
    events=st.lists(
        st.one_of(
            st.tuples(st.just("arrive"), st.integers(0, 2), costs, st.integers(0, 20)),
            st.tuples(st.just("flood"), st.integers(1, 8), costs, st.integers(0, 20)),
            st.tuples(st.just("step"), st.integers(1, 20), st.just(0), st.just(0)),
        ),
        max_size=120,
    ),
)
def test_with_deadlines_interactive_siblings_stay_within_2u_and_4u_over_w(weights, ttft, events):
    """EDF among the interactive band's flows within one request's worth of the least
    served: the counters of the flows waiting stay within 2U / w_min, and two flows waiting
    throughout a stretch are served within 4U / w_min of each other's weighted service."""
    server = Server(interactive(weights, ttft))
    tree = server.policy.tree  # type: ignore[attr-defined]
    w_min = min(weights)

    def weighted(name: str) -> float:
        return server.served[name] / server.shares[name]

    since: dict[tuple[str, str], float] = {}  # pair → their weighted service gap then
    for kind, count, cost, at in events:
        if kind == "arrive":
            server.arrive(INTERACTIVE[count], cost, arrival=float(at))
        elif kind == "flood":  # every flow gets `count` requests, arrived at `at`
            for name in INTERACTIVE:
                for _ in range(count):
                    server.arrive(name, cost, arrival=float(at))
        for _ in range(count if kind == "step" else 0):
            waiting = server.waiting()
            since = {pair: gap for pair, gap in since.items() if set(pair) <= waiting}
            for first in waiting:
                for second in waiting - {first}:
                    since.setdefault((first, second), weighted(first) - weighted(second))
            if server.step() is None:
                break
            counters = [tree.counter(name) for name in server.waiting()]
            if counters:
                assert max(counters) - min(counters) <= 2 * U / w_min + 1e-6
            for (first, second), gap in since.items():
                assert weighted(first) - weighted(second) - gap <= 4 * U / w_min + 1e-6


def test_deadlines_order_the_interactive_band_only_where_the_counters_leave_a_choice():
    shares = Shares(
        {"fast": 1.0, "slow": 1.0},
        tenant_bands={"fast": "interactive", "slow": "interactive"},
        ttft={"fast": 0.2, "slow": 5.0},
    )
    server = Server(shares)
    server.arrive("slow", 100, arrival=0.0)
    server.arrive("fast", 100, arrival=1.0)
    assert server.step().tenant == "fast"  # due at 1.2, before slow's 5.0
    server.arrive("fast", 100, arrival=1.1)
    assert server.step().tenant == "fast"  # one request (100) ahead: within the slack
    server.arrive("fast", 100, arrival=1.2)
    assert server.step().tenant == "slow"  # two ahead: the least served goes, due or not


@pytest.mark.parametrize("band", ["standard", "batch"])
def test_outside_the_interactive_band_deadlines_change_nothing(band):
    shares = Shares(
        {"fast": 1.0, "slow": 1.0},
        tenant_bands={"fast": band, "slow": band},
        ttft={"fast": 0.2, "slow": 5.0},
    )
    server = Server(shares)
    server.arrive("slow", 100, arrival=0.0)
    server.arrive("fast", 100, arrival=1.0)
    assert server.step().tenant == "slow"  # VTC: equal counters, the earliest request


# ---------------------------------------------------------------------- entitled parts


@settings(max_examples=200)
@given(
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=1, max_size=8),
    group_of=st.lists(st.sampled_from([None, "a", "a1", "b"]), min_size=8, max_size=8),
    group_weights=st.tuples(*[st.sampled_from([0.5, 1.0, 4.0])] * 3),
    band_of=st.lists(st.sampled_from(["interactive", "standard", "batch"]), min_size=8, max_size=8),
    active=st.sets(st.integers(0, 7), min_size=1),
)
def test_parts_split_each_band_by_the_tree_and_the_bands_by_their_minimum_shares(
    weights, group_of, group_weights, band_of, active
):
    """`Shares.parts`: the highest band with work gets what the lower bands' minimum
    shares leave; inside a band each group's flows get the group's part, split by weight,
    and the group's part is its parent's split by the weights of the children with work."""
    names = [f"t{i}" for i in range(len(weights))]
    active_names = {names[i] for i in active if i < len(names)} or {names[0]}
    groups = {
        "a": Group(group_weights[0]),
        "a1": Group(group_weights[1], parent="a"),
        "b": Group(group_weights[2]),
    }
    shares = Shares(
        dict(zip(names, weights, strict=True)),
        groups=groups,
        tenant_groups={n: g for n, g in zip(names, group_of, strict=False) if g is not None},
        tenant_bands=dict(zip(names, band_of, strict=False)),
    )
    parts = shares.parts(active_names)
    assert set(parts) == active_names and sum(parts.values()) == pytest.approx(1.0)
    bands = [
        band
        for band in ("interactive", "standard", "batch")
        if any(shares.band_of(n) == band for n in active_names)
    ]
    for band in bands:
        in_band = [n for n in active_names if shares.band_of(n) == band]
        expected = (
            shares.min_shares[band]
            if band != bands[0]
            else 1.0 - sum(shares.min_shares[b] for b in bands[1:])
        )
        assert sum(parts[n] for n in in_band) == pytest.approx(expected)
        # Two flows under the same parent node: their parts are in their weights' ratio.
        for first in in_band:
            for second in in_band:
                if shares.path(first) == shares.path(second):
                    assert parts[first] * shares[second] == pytest.approx(
                        parts[second] * shares[first]
                    )


def test_an_organisations_tenants_share_its_part_not_one_each() -> None:
    parts = organisations(10).parts([*(f"a{i}" for i in range(10)), "b0"])
    assert parts["b0"] == pytest.approx(0.5)
    assert parts["a3"] == pytest.approx(0.05)


def candidates_by_definition(tree: FairTree, waiting: set[str]) -> list[str]:
    """`FairTree.candidates` recomputed from the waiting flows alone: the band that goes
    next, then at each depth the child (group or flow) with the smallest counter among
    those with a waiting flow under them, down to a flow; then that flow's waiting
    siblings."""
    shares = tree.shares
    if not waiting:
        return []
    if shares.flat() and all(shares.band_of(f) == "standard" for f in waiting):
        return sorted(waiting)
    band = tree._band_to_serve({shares.band_of(f) for f in waiting})
    paths = {f: shares.node_path(f) for f in waiting if shares.band_of(f) == band}
    depth = 0
    while True:
        children = {path[depth] for path in paths.values()}
        chosen = min(children, key=lambda name: (tree.counters[band][name], name))
        if chosen in paths:
            return sorted(f for f in children if f in paths)
        paths = {f: path for f, path in paths.items() if path[depth] == chosen}
        depth += 1


@settings(max_examples=150)
@given(
    group_of=st.lists(st.sampled_from([None, "a", "a1", "b"]), min_size=6, max_size=6),
    band_of=st.lists(st.sampled_from(["interactive", "standard", "batch"]), min_size=6, max_size=6),
    events=st.lists(st.tuples(st.integers(0, 5), st.booleans(), costs), max_size=120),
)
def test_the_candidates_are_those_the_definition_gives_whatever_joined_and_left(
    group_of, band_of, events
):
    """The tree's record of the nodes with work stays what the waiting flows say: after
    any sequence of joins, leaves and charges, `candidates` equals its definition."""
    names = [f"t{i}" for i in range(6)]
    shares = Shares(
        dict.fromkeys(names, 1.0),
        groups={"a": Group(2.0), "a1": Group(1.0, parent="a"), "b": Group(1.0)},
        tenant_groups={n: g for n, g in zip(names, group_of, strict=True) if g is not None},
        tenant_bands=dict(zip(names, band_of, strict=True)),
    )
    tree = FairTree(shares)
    waiting: set[str] = set()
    for who, joins, cost in events:
        name = names[who]
        if joins and name not in waiting:
            tree.join(name)
            waiting.add(name)
        elif not joins and name in waiting:
            tree.charge(name, cost)
            tree.leave(name)
            waiting.discard(name)
        elif name in waiting:
            tree.charge(name, cost)
        assert tree.candidates(sorted(waiting)) == candidates_by_definition(tree, waiting)
