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

    def arrive(self, flow_id: str, cost: int) -> None:
        self.count += 1
        self.policy.add(Request(f"r{self.count}", flow_id, cost, 1))  # type: ignore[attr-defined]

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
