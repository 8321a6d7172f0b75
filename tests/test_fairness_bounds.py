"""The papers' fairness bounds, checked by random search over event streams that include
what production has: preemptions and re-admissions, tenants that send one request at a
time (idle between two, however briefly), prompts larger than DLPM's quantum, weights.

- VTC, Lemma 4.3 (OSDI'24 §4.1): while anyone waits, the counters of the waiting tenants
  stay within U / w_min of each other, preemptions included (a preempted request's tenant
  rejoins the waiting ones with the counter lift, as any tenant does).
- The backlogged-tenant guarantee, VTC Theorem 4.4 and DLPM Theorem 4.1 in the form a
  tenant that waits needs: over any interval in which tenant f is continuously
  backlogged (a request of its waiting), any tenant g gains at most B more weighted service
  than f: W_g/w_g − W_f/w_f rises by at most B. VTC: B = 2U / w_min; DLPM, quantum Q per
  unit of weight: B = 2(U / w_min + Q). It bounds what a tenant that is *not* backlogged —
  a one-request-at-a-time client — can take from one that is.

U = w_e·L + w_q·M: a prefill of at most L prompt tokens and the decode of what fits in a
memory of M tokens. A preempted request keeps its charge and is not charged again.

Engine model: each step, requests are admitted in the policy's order while their prompt
and max_tokens fit in M (head-of-line: the pass stops at the first that does not fit),
then every running request decodes one token; between steps, a tenant's most recently
admitted request may be preempted (vLLM's victim), back to the policy's queue.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.sched import CostModel, EngineSnapshot, Request, Running, TenantWeights, make_policy
from fairpool.sched.policies.dlpm import AUTO_QUANTUM_FLOOR, DLPM
from fairpool.sched.policies.vtc import VTC

pytestmark = pytest.mark.unit

TENANTS = ["a", "b", "c"]
MEMORY = 600
MAX_PROMPT = 400  # larger than the small DLPM quanta searched
MAX_OUTPUT = 40
COST = CostModel()
U = COST.extend_weight * MAX_PROMPT + COST.output_weight * MEMORY

request_shape = st.tuples(st.integers(1, MAX_PROMPT), st.integers(1, MAX_OUTPUT))
event = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(TENANTS), request_shape),
    st.tuples(st.just("burst"), st.sampled_from(TENANTS), st.integers(2, 30), request_shape),
    st.tuples(st.just("sequential"), st.sampled_from(TENANTS), request_shape),
    st.tuples(st.just("serve"), st.integers(1, 60)),
    st.tuples(st.just("preempt"), st.sampled_from(TENANTS)),
)
weights = st.fixed_dictionaries({tenant: st.sampled_from([0.5, 1.0, 2.0]) for tenant in TENANTS})


def contention(rng: random.Random) -> list[tuple]:  # type: ignore[type-arg]
    """Tenants competing the way production has them: a flood that keeps coming back, a
    client that sends one request at a time (its requests often larger than the quantum),
    a third that comes and goes, the engine serving for a while, preemptions. Drawn from a
    hypothesis-controlled random source, so the search covers long runs uniformly and a
    failure still shrinks."""
    one_at_a_time, flood, other = rng.sample(TENANTS, 3)
    shape = (rng.randint(1, MAX_PROMPT), rng.randint(1, MAX_OUTPUT))
    events: list[tuple] = [("sequential", one_at_a_time, shape)]  # type: ignore[type-arg]
    flood_shape = (rng.randint(1, MAX_PROMPT // 4), rng.randint(1, MAX_OUTPUT))
    for _ in range(rng.randint(5, 20)):
        events.append(("burst", flood, rng.randint(5, 30), flood_shape))
        if rng.random() < 0.3:
            other_shape = (rng.randint(1, MAX_PROMPT), rng.randint(1, MAX_OUTPUT))
            events.append(("burst", other, rng.randint(2, 10), other_shape))
        events.append(("serve", rng.randint(10, 80)))
        if rng.random() < 0.3:
            events.append(("preempt", rng.choice(TENANTS)))
    return events


contended = st.randoms(use_true_random=True).map(contention)
workloads = st.one_of(contended, st.lists(event, min_size=5, max_size=60))


@dataclass
class Engine:
    """The policy under an engine, and every tenant's weighted service after each event."""

    policy: object
    weights: TenantWeights
    running: dict[str, Running] = field(default_factory=dict)
    sequential: dict[str, tuple[int, int]] = field(default_factory=dict)  # tenant → shape
    history: list[tuple[dict[str, float], frozenset[str]]] = field(default_factory=list)
    count: int = 0
    emptied: set[str] = field(default_factory=set)  # tenants whose queue emptied since record

    def __post_init__(self) -> None:
        """Note every moment a tenant's last waiting request leaves the queue: its backlog
        ends there, even if a new request arrives within the same step."""
        note = self.policy._on_leave  # type: ignore[attr-defined]

        def on_leave(tenant: str) -> None:
            self.emptied.add(tenant)
            note(tenant)

        self.policy._on_leave = on_leave  # type: ignore[attr-defined]

    def add(self, tenant: str, prompt: int, max_tokens: int) -> None:
        self.count += 1
        self.policy.add(Request(f"r{self.count}", tenant, prompt, max_tokens))  # type: ignore[attr-defined]

    def used(self) -> int:
        return sum(r.request.prompt_tokens + r.request.max_tokens for r in self.running.values())

    def apply(self, step: tuple) -> None:  # type: ignore[type-arg]
        policy: object = self.policy
        kind = step[0]
        if kind == "arrive":
            _, tenant, (prompt, output) = step
            self.add(tenant, prompt, output)
        elif kind == "burst":
            _, tenant, count, (prompt, output) = step
            for _ in range(count):
                self.add(tenant, prompt, output)
        elif kind == "sequential":  # from now on, one request at a time, the next at once
            _, tenant, shape = step
            self.sequential[tenant] = shape
            if not policy.is_active(tenant):  # type: ignore[attr-defined]
                self.add(tenant, *shape)
        elif kind == "serve":
            for _ in range(step[1]):
                self.step()
        elif kind == "preempt":
            victims = [rid for rid, r in self.running.items() if r.request.tenant == step[1]]
            if victims:
                rid = victims[-1]  # the most recently admitted
                del self.running[rid]
                policy.preempt(rid)  # type: ignore[attr-defined]
        self.record()

    def step(self) -> None:
        policy: object = self.policy
        view = EngineSnapshot(MEMORY, list(self.running.values()))
        while (chosen := policy.next_request(view)) is not None:  # type: ignore[attr-defined]
            if self.used() + chosen.prompt_tokens + chosen.max_tokens > MEMORY:
                break
            policy.admit(chosen.request_id, 0)  # type: ignore[attr-defined]
            self.running[chosen.request_id] = Running(chosen)
            view.running.append(self.running[chosen.request_id])
        for rid, running in list(self.running.items()):
            running.output_tokens += 1
            policy.record_output(rid)  # type: ignore[attr-defined]
            if running.output_tokens >= running.request.max_tokens:
                self.finish(rid)
        self.record()

    def finish(self, rid: str) -> None:
        tenant = self.running.pop(rid).request.tenant
        self.policy.finish(rid)  # type: ignore[attr-defined]
        shape = self.sequential.get(tenant)
        if shape is not None and not self.policy.is_active(tenant):  # type: ignore[attr-defined]
            self.add(tenant, *shape)  # a one-at-a-time client sends its next request

    def record(self) -> None:
        served = self.policy.served  # type: ignore[attr-defined]
        weighted = {tenant: served.get(tenant, 0.0) / self.weights[tenant] for tenant in TENANTS}
        waiting = frozenset(self.policy.waiting_tenants()) - self.emptied  # type: ignore[attr-defined]
        self.emptied.clear()
        self.history.append((weighted, waiting))

    def largest_gain_over_a_backlogged_tenant(self) -> float:
        """max over f, g, and intervals [s, t] in which f was backlogged throughout, of
        (W_g/w_g − W_f/w_f)(t) − (W_g/w_g − W_f/w_f)(s)."""
        worst = 0.0
        for f in TENANTS:
            for g in TENANTS:
                if f == g:
                    continue
                lowest: float | None = None
                for weighted, waiting in self.history:
                    difference = weighted[g] - weighted[f]
                    if f not in waiting:  # f's backlog ended (or was broken) before here
                        lowest = None
                        continue
                    if lowest is None:
                        lowest = difference
                    worst = max(worst, difference - lowest)
                    lowest = min(lowest, difference)
        return worst


def run(name: str, events: list, table: TenantWeights, **params: object) -> Engine:  # type: ignore[type-arg]
    engine = Engine(make_policy(name, weights=table, **params), table)
    engine.record()
    for step in events:
        engine.apply(step)
    return engine


@settings(max_examples=500)
@given(workloads, weights)
def test_vtc_waiting_counters_stay_within_u_through_preemptions(events, tenant_weights):
    table = TenantWeights(tenant_weights)
    engine = Engine(make_policy("vtc", weights=table), table)
    limit = U / min(table[t] for t in TENANTS)
    for step in events:
        engine.apply(step)
        counters = engine.policy.counters  # type: ignore[attr-defined]
        waiting = [counters[t] for t in engine.policy.waiting_tenants()]  # type: ignore[attr-defined]
        if waiting:
            assert max(waiting) - min(waiting) <= limit + 1e-6


@settings(max_examples=500)
@given(workloads, weights)
def test_vtc_a_backlogged_tenant_is_never_left_more_than_2u_behind(events, tenant_weights):
    table = TenantWeights(tenant_weights)
    engine = run("vtc", events, table)
    assert (
        engine.largest_gain_over_a_backlogged_tenant()
        <= 2 * U / min(table[t] for t in TENANTS) + 1e-6
    )


@settings(max_examples=500)
@given(contended, weights, st.sampled_from([20.0, 100.0, 1000.0]))
def test_dlpm_a_backlogged_tenant_is_never_left_more_than_2_u_plus_q_behind(
    events, tenant_weights, quantum
):
    """Including tenants that send one request at a time, each larger than Q: a debt must
    survive the instant between two of their requests."""
    table = TenantWeights(tenant_weights)
    engine = run("dlpm", events, table, quantum=quantum)
    bound = 2 * (U / min(table[t] for t in TENANTS) + quantum)
    assert engine.largest_gain_over_a_backlogged_tenant() <= bound + 1e-6


#: Prompts costing up to 40 × MAX_PROMPT = 16,000, well past the `auto` quantum's floor.
EXPENSIVE_PROMPTS = CostModel(extend_weight=40.0)


@settings(max_examples=300)
@given(contended, weights)
def test_dlpm_auto_quantum_keeps_the_bound_it_reports(events, tenant_weights):
    """With `auto` Q, the quantum grows as larger prompts are admitted; the gap stays
    within the bound the policy reports for the quantum in force at the end, 2(U + Q) with
    U from the largest prompt it admitted."""
    table = TenantWeights(tenant_weights)
    engine = run("dlpm", events, table, cost=EXPENSIVE_PROMPTS)
    policy = engine.policy
    assert isinstance(policy, DLPM)
    assert policy.quantum == max(AUTO_QUANTUM_FLOOR, policy.largest_prompt)
    assert engine.largest_gain_over_a_backlogged_tenant() <= policy.service_bound(MEMORY) + 1e-6


@settings(max_examples=300)
@given(workloads, weights)
def test_vtc_keeps_the_bound_it_reports(events, tenant_weights):
    """VTC's reported bound, 2U with U from the largest prompt it admitted."""
    table = TenantWeights(tenant_weights)
    engine = run("vtc", events, table)
    policy = engine.policy
    assert isinstance(policy, VTC)
    assert engine.largest_gain_over_a_backlogged_tenant() <= policy.service_bound(MEMORY) + 1e-6
