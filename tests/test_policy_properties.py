"""Invariants the papers prove, checked after every event of random workloads.

- VTC, Lemma 4.3 (OSDI'24 §4.1): the counters of waiting tenants stay within U of each
  other. With weights, counters move by service / weight, so the spread is U / w_min.
  We use U = w_e·L_input + w_q·M: after a tenant's last admission (when it had the least
  counter) it can gain at most one prefill and the decode of requests that fit in memory.
- DLPM, Theorem A.1's invariants (arXiv 2501.14312, App. A.1): −U < q_i ≤ Q_i.
- Work conservation (both papers): with requests waiting and the engine empty, the
  policy always offers one.
- Memory-safe admission (seed 002, Eq. 1): the admitted set's projected KV usage never
  exceeds M at any future step (checked by brute force over every step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairpool.sched import CostModel, EngineSnapshot, Request, Running, TenantWeights, make_policy
from fairpool.sched.memory import projected_peak

pytestmark = pytest.mark.unit

TENANTS = ["a", "b", "c"]
MEMORY = 200
MAX_PROMPT = 40
MAX_OUTPUT = 40

arrival = st.tuples(
    st.just("arrive"),
    st.sampled_from(TENANTS),
    st.integers(1, MAX_PROMPT),
    st.integers(1, MAX_OUTPUT),
    st.integers(0, MAX_PROMPT),  # cache hit (capped at the prompt)
    st.floats(0.1, 1.0),  # actual output as a fraction of max_tokens
)
burst = st.tuples(st.just("burst"), st.integers(2, 12), arrival)
event = st.one_of(
    arrival,
    burst,
    st.tuples(st.just("schedule")),
    st.tuples(st.just("decode"), st.integers(1, 40)),
    st.tuples(st.just("abort"), st.integers(0, 10_000)),
)
weights = st.dictionaries(st.sampled_from(TENANTS), st.sampled_from([0.5, 1.0, 2.0, 3.0]))


@dataclass
class Harness:
    """An engine reduced to what the invariants need: memory, admission, decode, abort."""

    policy: object
    running: dict[str, tuple[Running, int]] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    targets: dict[str, int] = field(default_factory=dict)
    count: int = 0

    def view(self) -> EngineSnapshot:
        return EngineSnapshot(MEMORY, [r for r, _ in self.running.values()], hits=self.hits)

    def used(self) -> int:
        return sum(r.request.prompt_tokens + r.request.max_tokens for r, _ in self.running.values())

    def apply(self, step: tuple) -> None:
        kind = step[0]
        if kind == "arrive":
            _, tenant, prompt, max_tokens, hit, fraction = step
            self.count += 1
            rid = f"r{self.count}"
            self.hits[rid] = min(hit, prompt)
            self.targets[rid] = max(1, int(max_tokens * fraction))
            self.policy.add(Request(rid, tenant, prompt, max_tokens))
        elif kind == "burst":
            for _ in range(step[1]):
                self.apply(step[2])
        elif kind == "schedule":
            while (chosen := self.policy.next_request(self.view())) is not None:
                if self.used() + chosen.prompt_tokens + chosen.max_tokens > MEMORY:
                    break
                self.policy.admit(chosen.request_id, self.hits[chosen.request_id])
                self.running[chosen.request_id] = (Running(chosen), self.targets[chosen.request_id])
        elif kind == "decode":
            for _ in range(step[1]):
                for rid, (running, target) in list(self.running.items()):
                    running.output_tokens += 1
                    self.policy.record_output(rid)
                    if running.output_tokens >= target:
                        self.policy.finish(rid)
                        del self.running[rid]
        elif kind == "abort":
            known = [w.request.request_id for w in self.policy.waiting()] + list(self.running)
            if known:
                rid = known[step[1] % len(known)]
                self.policy.remove(rid)
                self.running.pop(rid, None)


def bound_u(cost: CostModel) -> float:
    return cost.extend_weight * MAX_PROMPT + cost.output_weight * MEMORY


# A tenant that joins late must be lifted (Algorithm 2 line 13), or it starts far below.
LATE_JOINER = (
    [("burst", 12, ("arrive", "a", 40, 40, 0, 1.0)), ("burst", 12, ("arrive", "b", 40, 40, 0, 1.0))]
    + [("schedule",), ("decode", 40)] * 6
    + [("arrive", "a", 40, 40, 0, 1.0), ("arrive", "c", 40, 40, 0, 1.0)]
)


@settings(max_examples=300)
@example(LATE_JOINER, {})
@given(st.lists(event, min_size=20, max_size=200), weights)
def test_vtc_counter_spread_among_waiting_tenants_stays_within_u(events, tenant_weights):
    table = TenantWeights(tenant_weights)
    policy = make_policy("vtc", weights=table)
    harness = Harness(policy)
    limit = bound_u(policy.cost) / min(table[t] for t in TENANTS)
    for step in events:
        harness.apply(step)
        waiting = [policy.counters[t] for t in policy.waiting_tenants()]
        if waiting:
            assert max(waiting) - min(waiting) <= limit + 1e-6


@given(
    st.lists(event, min_size=20, max_size=200),
    weights,
    st.sampled_from([1.0, 50.0, 400.0, 5000.0, None]),
)
def test_dlpm_deficits_stay_within_minus_u_and_the_quantum(events, tenant_weights, quantum):
    """With `auto` Q (None), prompts cost 100× their tokens, so Q grows past its floor."""
    table = TenantWeights(tenant_weights)
    cost = CostModel(extend_weight=100.0) if quantum is None else CostModel()
    policy = make_policy("dlpm", weights=table, quantum=quantum, cost=cost)
    harness = Harness(policy)
    u = bound_u(policy.cost)
    for step in events:
        harness.apply(step)
        for tenant, deficit in policy.tenant_state().items():
            assert -u < deficit <= policy.quantum * table[tenant] + 1e-9


@given(
    st.lists(arrival, min_size=1, max_size=30),
    st.sampled_from(["fcfs", "lpm", "vtc", "dlpm", "mcsf", "slai"]),
)
def test_an_empty_engine_always_gets_a_waiting_request(arrivals, name):
    policy = make_policy(name)
    harness = Harness(policy)
    for step in arrivals:
        harness.apply(step)
    assert policy.next_request(harness.view()) is not None


demands = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 100)), max_size=12)


def brute_force_peak(items: list[tuple[int, int]]) -> int:
    horizon = max((remaining for _, remaining in items), default=0)
    return max(
        (
            sum(held + step for held, remaining in items if remaining >= step)
            for step in range(horizon + 1)
        ),
        default=0,
    )


@given(demands)
def test_projected_peak_matches_brute_force(items):
    assert projected_peak(items) == brute_force_peak(items)


@given(
    demands,
    st.lists(st.tuples(st.integers(1, 60), st.integers(1, 40)), min_size=1, max_size=15),
    st.integers(50, 600),
    st.sampled_from(["mcsf", "fcfs+memsafe", "dlpm+memsafe", "vtc+memsafe"]),
)
def test_memory_safe_admission_never_admits_a_set_that_can_overflow(
    running, candidates, memory, name
):
    policy = make_policy(name)
    snapshot = EngineSnapshot(memory)
    for index, (held, remaining) in enumerate(running):
        prompt = max(held, 0)
        snapshot.running.append(Running(Request(f"run{index}", "x", prompt, remaining + 1), 1))
    for index, (prompt, max_tokens) in enumerate(candidates):
        policy.add(Request(f"c{index}", "ab"[index % 2], prompt, max_tokens))
    while (chosen := policy.next_request(snapshot)) is not None:
        policy.admit(chosen.request_id)
        snapshot.running.append(Running(chosen))
    items = [(r.held_tokens, r.request.max_tokens - r.output_tokens) for r in snapshot.running]
    admitted_any = len(snapshot.running) > len(running)
    if admitted_any:
        assert brute_force_peak(items) <= memory


@dataclass
class EpochView(EngineSnapshot):
    """Hits that change only when their tenant's epoch advances, as the engines' views
    promise."""

    epochs: dict[str, int] = field(default_factory=dict)

    def hit_epoch(self, tenant: str) -> int | None:
        return self.epochs.get(tenant, 0)


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("arrive"), st.sampled_from(TENANTS), st.integers(0, 30)),
            st.tuples(st.just("admit"), st.just(""), st.just(0)),
            st.tuples(st.just("rehit"), st.sampled_from(TENANTS), st.integers(0, 10_000)),
            st.tuples(st.just("abort"), st.just(""), st.integers(0, 10_000)),
            st.tuples(st.just("preempt"), st.just(""), st.integers(0, 10_000)),
        ),
        max_size=120,
    ),
    st.sampled_from(["lpm", "dlpm"]),
)
def test_longest_match_remembered_per_tenant_is_the_full_scan(events, name):
    """LPM and DLPM keep each tenant's requests in a heap while its hits stay the same;
    their choice must be the request a scan of the whole queue in (−hit, arrival) order
    gives, through arrivals, admissions, aborts, preemptions and one tenant's hits
    changing at a time."""
    policy = make_policy(name, **({"quantum": 50.0} if name == "dlpm" else {}))
    view = EpochView(memory_tokens=10_000)
    running: list[str] = []
    for index, (kind, tenant, value) in enumerate(events):
        waiting = sorted(entry.request.request_id for entry in policy.waiting())
        if kind == "arrive":
            request = Request(f"r{index}", tenant, 40, 4)
            view.hits[request.request_id] = value
            policy.add(request)
        elif kind == "rehit":  # the cache changed for this tenant: new hits, new epoch
            for offset, entry in enumerate(policy.waiting()):
                if entry.request.tenant == tenant:
                    view.hits[entry.request.request_id] = (value * (offset + 7)) % 31
            view.epochs[tenant] = view.epochs.get(tenant, 0) + 1
        elif kind == "abort" and waiting:
            policy.remove(waiting[value % len(waiting)])
        elif kind == "preempt" and running:
            policy.preempt(running.pop(value % len(running)))
        chosen = policy.next_request(view)
        eligible = [
            entry
            for entry in policy.waiting()
            if name == "lpm" or policy.deficits[entry.request.tenant] > 0  # type: ignore[attr-defined]
        ]
        expected = min(
            eligible,
            key=lambda entry: (-view.cached_tokens(entry.request), entry.order),
            default=None,
        )
        assert chosen == (expected.request if expected else None)
        if kind == "admit" and chosen is not None:
            running.append(chosen.request_id)
            policy.admit(chosen.request_id, view.cached_tokens(chosen))
