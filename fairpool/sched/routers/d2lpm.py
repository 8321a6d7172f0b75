"""Distributed Deficit Longest Prefix Match (D2LPM).

Cao et al., "Locality-aware Fair Scheduling in LLM Serving" (arXiv 2501.14312), §5.2,
Algorithm 2. Each (tenant, worker) pair has a deficit q[i,w] with quantum Q^w:

- SelectWorker (lines 3-9): among the workers holding the request's longest cached prefix,
  those where the tenant still has credit (q[i,w] > 0), the one with the fewest
  outstanding requests s_w; if none of them has credit, the least loaded worker where the
  tenant has credit; if the tenant has no credit anywhere, every worker is refilled by Q^w
  (repeatedly, until one is positive) first.
- Dispatch charges w_e × the full input length to q[i,w] (line 16) — the router cannot know
  the worker's cache hit — and completion charges w_q × the output tokens (line 22). Where
  the engine reports its usage (the gateway), completion also corrects the input charge to
  the uncached tokens the worker actually computed, so deficits follow real service.
- The tree is updated at dispatch (line 18) and pruned on eviction reports (line 27).

A backlogged tenant thus spreads over all workers once it has used Q^w on its favourites;
Q^w trades locality for balance and fairness (Q^w = ∞ is unfair, Theorem A.5). Q^w appears
in no fairness bound (Theorems 5.1, 5.2), but their proof assumes a backlogged tenant
waits at every worker: with a large finite Q^w they are false until the tenant has spent
Q^w where it sticks (docs/scheduling.md, "The theorems the tests check").

Q^w is `auto` by default (`fairpool.sched.quantum`): eight times the largest prompt cost
w_e·L_input dispatched so far, never below 8,192. Dispatch charges the whole prompt and
only completion refunds the cached part, so a tenant's credit on a worker must cover the
requests it has in flight there, or it is moved off the worker that caches its prefix
while its own earlier requests are still running. Eight requests' worth matches the
value tuned by hand on the long-context QA reproduction (`make reproduce`, docs/results.md
§5). An explicit Q^w wins.

Choices the paper leaves open (reference digest §B.7), made here:

1. An empty match means every worker holds the longest match (G = all workers), so the
   request goes to the least loaded worker where the tenant has credit (Theorem A.5's
   "load-balanced to all workers").
2. Deficits start at 0, so a tenant's first request refills every worker (as the paper
   says: "at the beginning all q = 0"); a worker added later starts at 0 for everyone.
3. Idle tenants keep their deficits (the paper defines no reset at the global level; the
   engines' local DLPM handles rejoining). Credit is still capped at Q^w per worker
   because refills only happen when every worker is exhausted.
4. Weights (an extension): tenant i's quantum is Q^w·w_i, as in the local DLPM.
5. Eligible workers (an extension): the gateway's front may restrict a decision to the
   workers below its saturation thresholds (`route(request, eligible)`). G_avail and the
   refill are then taken over those: the tenant is refilled until an eligible worker has
   credit, and a worker that kept credit meanwhile is capped at Q^w·w_i, so credit stays
   bounded per worker as in the unrestricted algorithm (where the cap never binds: the
   refill stops as soon as any worker has credit, and none had any before it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping

from fairpool.sched.cost import CostModel, TenantWeights, Tokens
from fairpool.sched.policies.dlpm import refills_to_credit
from fairpool.sched.quantum import Quantum
from fairpool.sched.routers.base import DEFAULT_TREE_TOKENS, InFlight, PrefixRouter, RouteRequest

#: The smallest `auto` Q^w, and Q^w before any request was dispatched.
AUTO_WORKER_QUANTUM_FLOOR = 8192.0
#: How many of the largest prompts seen the `auto` Q^w holds.
AUTO_WORKER_QUANTUM_REQUESTS = 8


class WorkerDeficits(Mapping[str, float]):
    """One tenant's q[i,w] over the pool's workers.

    Every worker starts at 0 and gets the same refills, so the workers the tenant was
    never charged on all hold one value (`uncharged`); only the others are stored, and a
    tenant costs memory per worker it used rather than per worker in the pool. Each
    worker's value still goes through the same float operations as in a full table.
    """

    def __init__(self, pool: Collection[str]) -> None:
        self.pool = pool  # the router's workers; `charged` holds only workers in it
        self.uncharged = 0.0
        self.charged: dict[str, float] = {}

    def __getitem__(self, worker: str) -> float:
        return self.charged.get(worker, self.uncharged)

    def __contains__(self, worker: object) -> bool:
        return worker in self.pool

    def __iter__(self) -> Iterator[str]:
        return iter(self.pool)

    def __len__(self) -> int:
        return len(self.pool)

    def credited(self) -> list[str]:
        """The workers where the tenant has credit, in pool order."""
        charged, uncharged = self.charged, self.uncharged
        return [worker for worker in self.pool if charged.get(worker, uncharged) > 0]

    def levels(self) -> list[float]:
        """The distinct deficits held: each charged worker's, and the uncharged value
        while some worker is uncharged."""
        values = list(self.charged.values())
        if len(self.charged) < len(self.pool):
            values.append(self.uncharged)
        return values

    def charge(self, worker: str, service: float) -> None:
        self.charged[worker] = self[worker] - service

    def refill(self, amount: float, cap: float) -> None:
        """Add `amount` on every worker, none ending above `cap` (a worker that kept its
        credit while the refill was for others: see D2LPM's choice 5)."""
        self.uncharged = min(self.uncharged + amount, max(self.uncharged, cap))
        for worker, value in self.charged.items():
            self.charged[worker] = min(value + amount, max(value, cap))

    def start(self, worker: str) -> None:
        """A worker joins the pool at 0."""
        self.charged[worker] = 0.0

    def forget(self, worker: str) -> None:
        self.charged.pop(worker, None)


class D2LPM(PrefixRouter):
    """Longest-match workers where the tenant has credit, then the shortest queue."""

    name = "d2lpm"

    def __init__(
        self,
        workers: Iterable[str] = (),
        worker_quantum: float | None = None,
        cost: CostModel | None = None,
        weights: TenantWeights | None = None,
        max_tree_tokens: int = DEFAULT_TREE_TOKENS,
        min_match: int = 0,
        max_tree_nodes: int | None = None,
    ) -> None:
        self.quantum_rule = Quantum(
            worker_quantum,
            floor=AUTO_WORKER_QUANTUM_FLOOR,
            requests=AUTO_WORKER_QUANTUM_REQUESTS,
            parameter="worker_quantum",
        )
        self.largest_prompt = 0.0  # service units (w_e·L_input) of the longest prompt routed
        self.cost = cost or CostModel()
        self.weights = weights or TenantWeights()
        self.deficits: dict[str, WorkerDeficits] = defaultdict(lambda: WorkerDeficits(self.workers))
        self.refill_rounds = 0
        super().__init__(workers, max_tree_tokens, min_match, max_tree_nodes)

    @property
    def worker_quantum(self) -> float:
        """Q^w in force."""
        return self.quantum_rule.value(self.largest_prompt)

    def tenant_quantum(self, tenant: str) -> float:
        return self.worker_quantum * self.weights[tenant]

    def available(self, tenant: str, candidates: Collection[str] | None = None) -> list[str]:
        """G_avail: workers (of `candidates`, default all) where `tenant` has credit,
        after refilling if it has none there."""
        deficits = self.deficits[tenant]
        available = self._credited(deficits, candidates)
        if not available:
            self._refill(tenant, candidates)
            available = self._credited(deficits, candidates)
        return available

    @staticmethod
    def _credited(deficits: WorkerDeficits, candidates: Collection[str] | None) -> list[str]:
        credited = deficits.credited()
        if candidates is None:
            return credited
        return [worker for worker in credited if worker in candidates]

    def _refill(self, tenant: str, candidates: Collection[str] | None = None) -> None:
        """Lines 5-6: add Q^w on every worker until some (eligible) worker has credit."""
        deficits = self.deficits[tenant]
        quantum = self.tenant_quantum(tenant)
        levels = deficits.levels() if candidates is None else [deficits[w] for w in candidates]
        rounds = min(refills_to_credit(deficit, quantum) for deficit in levels)
        self.refill_rounds += rounds
        deficits.refill(rounds * quantum, cap=quantum)

    def _choose(self, request: RouteRequest, candidates: list[str]) -> str:
        _, holders = self._longest_match(request)  # first: it raises on a bad key
        restricted = len(candidates) < len(self.workers)
        eligible = set(candidates) if restricted else None
        available = self.available(request.tenant, eligible)
        if not holders:
            return self._least_loaded(available)  # empty match: every worker holds it
        credited = set(available)
        preferred = [worker for worker in holders if worker in credited]
        return self._least_loaded(preferred or available)

    def _dispatched(self, request: RouteRequest, worker_id: str) -> None:
        super()._dispatched(request, worker_id)
        prompt_cost = self.cost.prefill(request.input_tokens, 0)
        self.largest_prompt = max(self.largest_prompt, prompt_cost)
        self.deficits[request.tenant].charge(worker_id, prompt_cost)

    def _completed(self, flight: InFlight, served: Tokens) -> None:
        charged = Tokens(extend=flight.input_tokens, output=0)
        service = self.cost.correction(charged, served)
        self.deficits[flight.tenant].charge(flight.worker_id, service)

    def set_weights(self, weights: TenantWeights) -> None:
        self.weights = weights

    def charge_elsewhere(self, tenant: str, worker_id: str, service: float) -> None:
        """Deficits shared by the gateway's replicas: what another replica's request was
        charged on a worker (dispatch and completion together, told at its completion)
        spends `tenant`'s credit there for this replica too, so every replica moves a
        tenant off a worker when the tenant's service there, from all of them, used its
        quantum — as one router would. Each replica refills by the same rule from the
        same charges, so their tables agree but for requests still in flight elsewhere."""
        if worker_id in self.workers:
            self.deficits[tenant].charge(worker_id, service)

    def tenant_state(self) -> dict[str, dict[str, float]]:
        return {tenant: dict(deficits) for tenant, deficits in self.deficits.items()}

    def add_worker(self, worker_id: str) -> None:
        joins = worker_id not in self.workers
        super().add_worker(worker_id)
        if joins:
            for deficits in self.deficits.values():
                deficits.start(worker_id)

    def remove_worker(self, worker_id: str) -> None:
        super().remove_worker(worker_id)
        for deficits in self.deficits.values():
            deficits.forget(worker_id)
