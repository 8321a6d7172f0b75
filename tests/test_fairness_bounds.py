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

- VTC Theorem 4.8 (the lower bound): the paper's construction, f filling the batch just
  before g arrives, reaches the exact gap this engine allows, so 2U is 2× tight.
- Latency, VTC Theorem 4.11 and DLPM Theorem A.2, in service units: what the other
  tenants receive while a returning tenant's request waits.
- VTC Theorem 4.13: a tenant asking for less than its share is served all it asks for.

Engine model: each step, requests are admitted in the policy's order while their prompt
and max_tokens fit in M (head-of-line: the pass stops at the first that does not fit),
then every running request decodes one token, then the finished ones leave; between
steps, a tenant's most recently admitted request may be preempted (vLLM's victim), or the
first of the policy's `preemption_order` (KV sharing's victim, `fairpool.sched.kv_share`),
back to the policy's queue, to be recomputed whole. The policy sees the memory the running
requests reserve, so KV sharing's headroom rule holds admissions back as in an engine.
Every tenant's service is recorded after each admission, each decode step and each event,
with each request's arrival and dispatch.

Workloads: random event lists; `contention`, the way production contends; `adversary`,
aimed at the band between those and the bounds (long decodes filling the memory as others
join, late joiners, max-size prompts). How close each gets is in the docstring of the
VTC 2U test.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairpool.sched import CostModel, EngineSnapshot, Request, Running, TenantWeights, make_policy
from fairpool.sched.policies.dlpm import AUTO_QUANTUM_FLOOR, AUTO_QUANTUM_REQUESTS, DLPM
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
    st.tuples(st.just("victim")),
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


def long_request(rng: random.Random) -> tuple[int, int]:
    """A request that takes much of the memory: a max-size prompt, or a long decode."""
    prompt = rng.choice([1, rng.randint(1, MAX_PROMPT), MAX_PROMPT])
    longest = MEMORY - prompt
    return prompt, rng.choice([longest - rng.randint(0, 2), rng.randint(longest // 4, longest)])


def adversary(rng: random.Random) -> list[tuple]:  # type: ignore[type-arg]
    """Workloads aimed at the band between what the searches above reach and the bounds,
    from VTC Theorem 4.8's construction on: tenants filling the memory with long decodes
    or max-size prompts while others wait or join (a batch admitted while the others'
    requests do not fit, head-of-line blocked behind it; a late joiner lifted to the
    least counter of those waiting), one-at-a-time clients with long requests,
    preemptions by the KV-share victim rule, and the engine serving two memories' worth of
    decode steps at the end."""
    events: list[tuple] = []  # type: ignore[type-arg]
    for _ in range(rng.randint(2, 6)):
        tenant = rng.choice(TENANTS)
        kind = "sequential" if rng.random() < 0.15 else "burst"
        if kind == "burst":
            events.append(("burst", tenant, rng.randint(1, 3), long_request(rng)))
        else:
            events.append(("sequential", tenant, long_request(rng)))
        if rng.random() < 0.5:
            events.append(("serve", rng.choice([1, rng.randint(1, MEMORY)])))
        if rng.random() < 0.2:
            events.append(("victim",))
    events.append(("serve", 2 * MEMORY))
    return events


#: Two tenants whose memory-filling batches differ slightly in cost, both waiting: a's
#: batch runs while b's request does not fit, then b, a full batch behind, runs two
#: batches while a's does not fit. A backlogged a falls 1.49 U behind (VTC), against 2U.
BEHIND_BY_TWO_BATCHES = [
    ("burst", "a", 3, (1, MEMORY - 1)),
    ("burst", "b", 3, (1, MEMORY - 3)),
    ("serve", 3 * MEMORY),
]
#: The same with b arriving just after a's batch was admitted, lifted to a's counter,
#: and c's short requests waiting behind: 1.50 U for VTC with `predict_output`, and for
#: DLPM with Q = 1,000.
LIFTED_BEHIND_A_BATCH = [
    ("burst", "a", 5, (1, MEMORY - 1)),
    ("serve", 1),
    ("burst", "b", 5, (1, MEMORY - 1)),
    ("burst", "c", 5, (1, MAX_OUTPUT)),
    ("serve", 3 * MEMORY),
]
EQUAL = dict.fromkeys(TENANTS, 1.0)

contended = st.randoms(use_true_random=True).map(contention)
adversarial = st.randoms(use_true_random=True).map(adversary)
workloads = st.one_of(contended, adversarial, st.lists(event, min_size=5, max_size=60))


@dataclass
class Trace:
    """One request's life as the engine saw it: indexes into `Engine.history`."""

    tenant: str
    arrival: int  # the first record after it arrived: service before it is at arrival − 1
    fresh: bool  # its tenant had nothing waiting and nothing running when it arrived
    dispatch: int | None = None  # the record right after its first admission


@dataclass
class Engine:
    """The policy under an engine, and every tenant's weighted service after each event,
    each admission and each decode step; each request's arrival and dispatch."""

    policy: object
    weights: TenantWeights
    memory: int = MEMORY
    running: dict[str, Running] = field(default_factory=dict)
    sequential: dict[str, tuple[int, int]] = field(default_factory=dict)  # tenant → shape
    history: list[tuple[dict[str, float], frozenset[str]]] = field(default_factory=list)
    served: list[dict[str, float]] = field(default_factory=list)  # unweighted, per record
    admitted: list[str | None] = field(default_factory=list)  # who was admitted, per record
    backlog_starts: list[dict[str, int]] = field(default_factory=list)  # waiting → since
    requests: dict[str, Trace] = field(default_factory=dict)
    requested: list[tuple[int, str, float]] = field(default_factory=list)  # (record, tenant, cost)
    count: int = 0
    emptied: set[str] = field(default_factory=set)  # tenants whose queue emptied since record
    joined: dict[str, int] = field(default_factory=dict)  # tenant → record its backlog began

    def __post_init__(self) -> None:
        """Note every moment a tenant's last waiting request leaves the queue: its backlog
        ends there, even if a new request arrives within the same step."""
        note = self.policy._on_leave  # type: ignore[attr-defined]

        def on_leave(tenant: str) -> None:
            self.emptied.add(tenant)
            note(tenant)

        self.policy._on_leave = on_leave  # type: ignore[attr-defined]

    def cost(self, request: Request) -> float:
        """The service a request asks for: its prompt and all of its output."""
        cost: CostModel = self.policy.cost  # type: ignore[attr-defined]
        return cost.service(request.prompt_tokens, request.max_tokens)

    def queued(self, request: Request) -> None:
        """`request` joined the queue (arrived, or preempted: this engine recomputes a
        preempted request whole, so its tenant asks for its service again)."""
        if request.tenant not in self.policy.waiting_tenants():  # type: ignore[attr-defined]
            self.joined[request.tenant] = len(self.history)
        self.requested.append((len(self.history), request.tenant, self.cost(request)))

    def add(self, tenant: str, prompt: int, max_tokens: int) -> None:
        self.count += 1
        request = Request(f"r{self.count}", tenant, prompt, max_tokens)
        fresh = not self.policy.is_active(tenant)  # type: ignore[attr-defined]
        self.requests[request.request_id] = Trace(tenant, len(self.history), fresh)
        self.queued(request)
        self.policy.add(request)  # type: ignore[attr-defined]

    def used(self) -> int:
        return sum(r.request.prompt_tokens + r.request.max_tokens for r in self.running.values())

    def view(self) -> EngineSnapshot:
        """What the policy sees: the running requests, and the memory their reservations
        take (so KV sharing's headroom rule holds admissions back as in an engine)."""
        running = list(self.running.values())
        return EngineSnapshot(self.memory, running, memory_utilization=self.used() / self.memory)

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
        elif kind == "preempt":  # vLLM's victim: the tenant's most recently admitted
            victims = [rid for rid, r in self.running.items() if r.request.tenant == step[1]]
            if victims:
                self.preempt(victims[-1])
        elif kind == "victim":  # the policy's: KV sharing's, when it shares memory
            order = policy.preemption_order(list(self.running.values()))  # type: ignore[attr-defined]
            if order:
                self.preempt(order[0].request.request_id)
        self.record()

    def preempt(self, rid: str) -> None:
        self.queued(self.running.pop(rid).request)
        self.policy.preempt(rid)  # type: ignore[attr-defined]

    def step(self) -> None:
        """Admit in the policy's order while requests fit (a record after each admission),
        decode one token of every running request (a record), then let the finished go."""
        policy: object = self.policy
        while (chosen := policy.next_request(self.view())) is not None:  # type: ignore[attr-defined]
            if self.used() + chosen.prompt_tokens + chosen.max_tokens > self.memory:
                break
            policy.admit(chosen.request_id, 0)  # type: ignore[attr-defined]
            self.running[chosen.request_id] = Running(chosen)
            trace = self.requests[chosen.request_id]
            if trace.dispatch is None:
                trace.dispatch = len(self.history)
            self.record(admitted=chosen.tenant)
        for rid, running in self.running.items():
            running.output_tokens += 1
            policy.record_output(rid)  # type: ignore[attr-defined]
        self.record()
        for rid, running in list(self.running.items()):
            if running.output_tokens >= running.request.max_tokens:
                self.finish(rid)

    def finish(self, rid: str) -> None:
        tenant = self.running.pop(rid).request.tenant
        self.policy.finish(rid)  # type: ignore[attr-defined]
        shape = self.sequential.get(tenant)
        if shape is not None and not self.policy.is_active(tenant):  # type: ignore[attr-defined]
            self.add(tenant, *shape)  # a one-at-a-time client sends its next request

    def record(self, admitted: str | None = None) -> None:
        served = self.policy.served  # type: ignore[attr-defined]
        raw = {tenant: served.get(tenant, 0.0) for tenant in TENANTS}
        weighted = {tenant: raw[tenant] / self.weights[tenant] for tenant in TENANTS}
        queued = self.policy.waiting_tenants()  # type: ignore[attr-defined]
        waiting = frozenset(queued) - self.emptied
        self.emptied.clear()
        self.history.append((weighted, waiting))
        self.served.append(raw)
        self.admitted.append(admitted)
        self.backlog_starts.append({tenant: self.joined[tenant] for tenant in queued})

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

    def service_to_others_while_waiting(self, trace: Trace) -> tuple[dict[str, float], float]:
        """For a request of tenant f, between its arrival and its dispatch (or now, if it
        still waits): per other tenant g, the service g received from its first admission
        after the arrival on (0 if none), and the service all others received in total."""
        first = trace.arrival - 1  # the last record before the arrival
        last = len(self.history) - 1 if trace.dispatch is None else trace.dispatch
        ahead: dict[str, float] = {}
        for g in TENANTS:
            if g == trace.tenant:
                continue
            admission = next((k for k in range(trace.arrival, last) if self.admitted[k] == g), None)
            before = self.served[last][g] if admission is None else self.served[admission - 1][g]
            ahead[g] = self.served[last][g] - before
        total = sum(
            self.served[last][g] - self.served[first][g] for g in TENANTS if g != trace.tenant
        )
        return ahead, total

    def smallest_demand_of_a_backlogged_tenant(self, constant: Callable[[str], float]) -> float:
        """VTC Theorem 4.13, as its proof uses it: at every record t2 at which a tenant f
        is backlogged, with t3 the moment its current backlog began, the service f asked
        for in [t3, t2] less its fair share of what the engine served in [t3, t2] plus
        `constant(f)`: w_f · W(t3, t2) / Σ w − constant(f), the sum over the tenants that
        received service in [t3, t2]. The smallest such difference (≥ 0: the theorem
        holds)."""
        worst = float("inf")
        demand = {tenant: [0.0] * (len(self.history) + 1) for tenant in TENANTS}
        for index, tenant, cost in self.requested:
            demand[tenant][index + 1] += cost
        for tenant in TENANTS:  # demand[t][k]: asked for before record k
            for k in range(1, len(self.history) + 1):
                demand[tenant][k] += demand[tenant][k - 1]
        for t2, starts in enumerate(self.backlog_starts):
            for f, t3 in starts.items():
                received = {
                    g: self.served[t2][g] - self.served[t3 - 1][g]
                    for g in TENANTS
                    if self.served[t2][g] > self.served[t3 - 1][g]
                }
                if not received:
                    continue
                share = self.weights[f] * sum(received.values())
                share /= sum(self.weights[g] for g in received)
                asked = demand[f][t2 + 1] - demand[f][t3]
                worst = min(worst, asked - (share - constant(f)))
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


@settings(max_examples=500, deadline=None)
@given(workloads, weights, st.booleans())
@example(BEHIND_BY_TWO_BATCHES, EQUAL, False)
@example(LIFTED_BEHIND_A_BATCH, EQUAL, True)
def test_vtc_a_backlogged_tenant_is_never_left_more_than_2u_behind(
    events, tenant_weights, predict_output
):
    """VTC (Sheng et al., OSDI'24), §4.1, Theorem 4.4 (f, g both backlogged: |W_f − W_g| ≤
    2U) and Theorem 4.9 (f backlogged, g any client, one request at a time included:
    W_g − W_f ≤ 4U) in one: g ranges over every tenant, backlogged or not, so this is
    Theorem 4.9 with 2U / w_min in place of 4U. The proof here gives 2U / w_g + U / w_min
    (3U with equal weights: Lemma 4.3's two U, plus g's decode of requests already running
    when the interval starts, which Lemma 4.3 does not bound); 2U is what the random
    search checks, with U = w_e·L + w_q·M, with and without output charged ahead (VTC
    §4.4, Algorithm 3: `predict_output`).

    How close the search gets, as gap × w_min / U over 150 seeds of each generator:
    `contention` 0.71 U; `adversary` 1.16 U, 1.25 U with `predict_output` (DLPM: 0.74 of
    its 2(U + Q)). A batch's decode is at most w_q·M = 0.75 U here, so a gap near 2U
    needs a tenant to start a batch behind and end one ahead: the two examples, 1.49 U
    and 1.50 U (2·w_q·M = 1.5 U). No VTC run found went past them; DLPM, whose bound
    has 2Q more, reached 1.63 U (Q = 1,000, 0.5 of its bound)."""
    table = TenantWeights(tenant_weights)
    engine = run("vtc", events, table, predict_output=predict_output)
    assert (
        engine.largest_gain_over_a_backlogged_tenant()
        <= 2 * U / min(table[t] for t in TENANTS) + 1e-6
    )


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(contended, adversarial),
    weights,
    st.sampled_from([20.0, 100.0, 1000.0]),
    st.booleans(),
)
@example(LIFTED_BEHIND_A_BATCH, EQUAL, 1000.0, False)
def test_dlpm_a_backlogged_tenant_is_never_left_more_than_2_u_plus_q_behind(
    events, tenant_weights, quantum, predict_output
):
    """DLPM (Cao et al., "Locality-aware Fair Scheduling in LLM Serving"), §4.2, Theorem
    4.1 (f, g both backlogged: |W_f − W_g| ≤ 2(U + Q)) and Theorem 4.2 (f backlogged, g
    not: W_f ≥ W_g − 2U − 2Q) in one: g ranges over every tenant, backlogged or not.
    Including tenants that send one request at a time, each larger than Q: a debt must
    survive the instant between two of their requests. With and without output charged
    ahead (VTC §4.4, Algorithm 3, which DLPM's `predict_output` applies to its deficits)."""
    table = TenantWeights(tenant_weights)
    engine = run("dlpm", events, table, quantum=quantum, predict_output=predict_output)
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
    assert policy.quantum == max(AUTO_QUANTUM_FLOOR, AUTO_QUANTUM_REQUESTS * policy.largest_prompt)
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


# ---------------------------------------------------------------- the lower bound


@settings(max_examples=200)
@given(
    st.sampled_from(["vtc", "dlpm", "fcfs"]),
    st.integers(3, 2000),
    st.data(),
    weights,
    st.sampled_from([0.5, 1.0, 2.0]),
    st.sampled_from([1.0, 2.0, 4.0]),
)
def test_a_work_conserving_policy_lets_a_tenant_fill_the_batch_theorem_4_8(
    name, memory, data, tenant_weights, extend_weight, output_weight
):
    """VTC (Sheng et al., OSDI'24), §4.1, Theorem 4.8: for any work-conserving schedule
    without preemption there is an arrival sequence and an interval in which f and g are
    both backlogged and |W_f − W_g| ≥ w_q·M; Theorem 4.4's 2U is therefore within 2× of
    tight. The paper's construction: f sends more than fits, fills the whole batch, and g
    arrives just after; nothing of g's fits until f's batch drains.

    Here, with M, the request shapes, the cost weights and the tenants' weights drawn:
    f's requests of p prompt and o output tokens, k = ⌊M / (p + o)⌋ of them fill the
    batch; g arrives after the step that admitted them (which decoded their first token)
    with requests that do not fit in what is left. Over [g's arrival, the batch's
    finish] both are backlogged and the gap is exactly w_q·k·(o − 1), for VTC, DLPM and
    FCFS alike. Its supremum w_q·M is reached only with no prompt and no token decoded in
    the admitting step; p = 1, o = M − 1 reaches w_q·(M − 2), so that 2U, U = w_e·p +
    w_q·M, exceeds twice the gap by exactly 2·w_e + 4·w_q: the bound is 2× tight up to
    that constant. And on the same run the fair policies stay within their bounds:
    2U / w_min for VTC (Theorem 4.4), 2(U / w_min + Q) for DLPM (DLPM paper, Theorem
    4.1); FCFS has none."""
    tight = data.draw(st.booleans(), label="tight")
    if tight:
        prompt, output = 1, memory - 1
    else:
        output = data.draw(st.integers(2, memory - 1), label="output")
        prompt = data.draw(st.integers(1, memory - output), label="prompt")
    fits = memory // (prompt + output)
    left = memory - fits * (prompt + output)
    g_total = data.draw(st.integers(left + 1, memory), label="g's prompt + output")
    g_output = data.draw(st.integers(1, g_total), label="g's output")
    f, g = data.draw(st.permutations(TENANTS), label="f, g")[:2]
    cost = CostModel(extend_weight=extend_weight, output_weight=output_weight)
    table = TenantWeights(tenant_weights)
    quantum = data.draw(st.sampled_from([1.0, 100.0, 5000.0]), label="quantum")
    params: dict[str, object] = {"quantum": quantum} if name == "dlpm" else {}
    engine = Engine(make_policy(name, cost=cost, weights=table, **params), table, memory)
    engine.record()
    engine.apply(("burst", f, fits + data.draw(st.integers(1, 5)), (prompt, output)))
    engine.apply(("serve", 1))
    assert engine.policy.tenant_running(f) == fits  # type: ignore[attr-defined]
    engine.apply(("burst", g, data.draw(st.integers(1, 5)), (g_total - g_output, g_output)))
    start = len(engine.history) - 1
    engine.apply(("serve", output - 1))
    end = len(engine.history) - 1
    assert all({f, g} <= waiting for _, waiting in engine.history[start : end + 1])
    served_f = engine.served[end][f] - engine.served[start][f]
    served_g = engine.served[end][g] - engine.served[start][g]
    gap = output_weight * fits * (output - 1)
    assert served_g == 0
    assert served_f == pytest.approx(gap)
    u = extend_weight * prompt + output_weight * memory
    if tight:
        assert 2 * u == pytest.approx(2 * gap + 2 * extend_weight + 4 * output_weight)
    lightest = min(table[t] for t in TENANTS)
    assert engine.largest_gain_over_a_backlogged_tenant() >= gap / table[f] - 1e-6
    engine.apply(("serve", 3 * output))  # f's next batch, g's turn, and so on
    # The bounds' U is over every request served: g's prompt may be longer than f's.
    u = extend_weight * max(prompt, g_total - g_output) + output_weight * memory
    bounds = {"vtc": 2 * u / lightest, "dlpm": 2 * (u / lightest + quantum)}
    if name in bounds:
        assert engine.largest_gain_over_a_backlogged_tenant() <= bounds[name] + 1e-6


# ---------------------------------------------------------------- latency


def fresh_requests(engine: Engine) -> list[Trace]:
    """Requests whose tenant had nothing waiting and nothing running when they arrived:
    the ones the latency theorems are about, dispatched or still waiting."""
    return [trace for trace in engine.requests.values() if trace.fresh]


@settings(max_examples=300)
@given(workloads, weights)
def test_vtc_a_returning_tenant_waits_for_at_most_2_n_minus_1_u_of_service_theorem_4_11(
    events, tenant_weights
):
    """VTC (Sheng et al., OSDI'24), §4.1, Theorem 4.11: if at t1 client f is not
    backlogged and has no request running, its next request r_f waits D(r_f) − A(r_f) ≤
    2(n − 1)·U / a, a the least service rate of the engine. In service units, with n
    tenants: while r_f waits, the others receive at most 2(n − 1)·U. The proof: f's
    counter c_f does not move while r_f waits; any other g is admitted only while
    c_g ≤ c_f, so after its last admission c_g ≤ c_f + U / w_g; when it is first
    admitted after A(r_f) it is the least waiting counter, so c_g ≥ c_f − U / w_min
    (Lemma 4.3, weighted). Weighted, the others' service from their first admission
    after A(r_f) on is at most Σ_{g≠f} (1 + w_g / w_min)·U, 2(n − 1)U with equal weights.

    What the proof leaves out: service before that first admission, the decode of
    requests already running at A(r_f) (g need not be waiting then, so Lemma 4.3 says
    nothing of its counter). Those requests fit in memory together, so it is at most
    w_q·M, which bounds all of the others' service while r_f waits. Head-of-line blocking
    by memory needs no exception: while r_f is VTC's pick and does not fit, the pass stops
    and nobody else is admitted; the running requests' decode is in the two terms above.
    Preemptions included: a re-admission is an admission, made only while c_g ≤ c_f.
    Requests still waiting at the end are checked up to then."""
    table = TenantWeights(tenant_weights)
    engine = run("vtc", events, table)
    lightest = min(table[t] for t in TENANTS)
    for trace in fresh_requests(engine):
        others = [g for g in TENANTS if g != trace.tenant]
        bound = sum((1 + table[g] / lightest) * U for g in others)
        ahead, total = engine.service_to_others_while_waiting(trace)
        assert sum(ahead.values()) <= bound + 1e-6
        assert total <= bound + COST.output_weight * MEMORY + 1e-6


@settings(max_examples=200)
@given(contended, weights, st.sampled_from([20.0, 100.0, 1000.0]))
def test_dlpm_a_returning_tenant_waits_for_at_most_2_n_minus_1_u_plus_q_of_service_a_2(
    events, tenant_weights, quantum
):
    """DLPM (Cao et al., "Locality-aware Fair Scheduling in LLM Serving"), Appendix A.1,
    Theorem A.2: if at t1 client f is not backlogged and has no request running, its next
    request r_f waits D(r_f) − A(r_f) ≤ 2(n − 1)(Q + U) / a. In service units: while r_f
    waits, the others receive at most 2(n − 1)(Q + U), all of it, the decode of requests
    running at A(r_f) included. The proof, for this DLPM (which keeps a returning tenant's
    deficit, −U < q_f ≤ Q·w_f, instead of resetting it to 0 as the paper's line 12 does):
    g's service while r_f waits is q_g(A) + R·Q·w_g − q_g(D) with q_g ≤ Q·w_g and
    q_g > −U (Theorem A.1's invariants), and R, the refill rounds, at most those f needs
    to reach credit (once it has, no round is run while it waits): R ≤ U / (Q·w_f) + 1.
    So the others receive less than Σ_{g≠f} ((1 + w_g / w_f)·U + 2Q·w_g); with equal
    weights 2(n − 1)(U + Q), the paper's bound: the debt kept costs no more than the
    reset would. Preemptions included (a re-admission needs credit, as an admission
    does); requests still waiting at the end are checked up to then."""
    table = TenantWeights(tenant_weights)
    engine = run("dlpm", events, table, quantum=quantum)
    for trace in fresh_requests(engine):
        f = trace.tenant
        bound = sum(
            (1 + table[g] / table[f]) * U + 2 * quantum * table[g] for g in TENANTS if g != f
        )
        _, total = engine.service_to_others_while_waiting(trace)
        assert total < bound + 1e-6


# ---------------------------------------------------------------- non-overloaded tenants


@settings(max_examples=300)
@given(workloads, weights)
def test_vtc_a_tenant_asking_less_than_its_share_is_served_all_theorem_4_13(events, tenant_weights):
    """VTC (Sheng et al., OSDI'24), §4.1, Theorem 4.13: if f is not backlogged at t1 and
    in every [t, t2) ⊆ [t1, t2) asks for less service than W(t, t2) / n − c·U (W: all
    tenants' service, n: the tenants served), then all it asked for in [t1, t2) is
    dispatched by t2. Read literally the premise never holds (for t near t2, W(t, t2) / n
    − c·U < 0); its proof shows the contrapositive at one t: if f is backlogged at t2, its
    backlog began at t3, and f asked in [t3, t2] for at least W(t3, t2) / n − c·U. That is
    what is checked, at every record and for every backlogged tenant.

    The constant, for this VTC: a tenant g served at least W / n exists (weighted: W_g /
    w_g ≥ W / Σw); Theorem 4.9 gives W_g / w_g − W_f / w_f ≤ 2U / w_g + U / w_min (its
    proof below Lemma 4.3's U, plus U for g's decode of requests running at t3, which
    Lemma 4.3 does not bound); f's requests sent before t3 were all running then and add
    at most w_q·M ≤ U. So f asked for at least w_f·W / Σw − (1 + 3·w_f / w_min)·U: c = 4
    with equal weights, against the 5 reconstructed from the paper's 4U Theorem 4.9 (ours
    is tighter by U: this VTC's Theorem 4.9 holds with 3U). A preempted request is
    recomputed whole by this engine, so it counts as asked for again."""
    table = TenantWeights(tenant_weights)
    engine = run("vtc", events, table)
    lightest = min(table[t] for t in TENANTS)
    slack = engine.smallest_demand_of_a_backlogged_tenant(
        lambda f: (1 + 3 * table[f] / lightest) * U
    )
    assert slack >= -1e-6
