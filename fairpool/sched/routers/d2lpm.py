"""Distributed Deficit Longest Prefix Match (D2LPM).

Cao et al., "Locality-aware Fair Scheduling in LLM Serving" (arXiv 2501.14312), §5.2,
Algorithm 2. Each (tenant, worker) pair has a deficit q[i,w] with quantum Q^w:

- SelectWorker (lines 3-9): among the workers holding the request's longest cached prefix,
  those where the tenant still has credit (q[i,w] > 0), the one with the fewest
  outstanding requests s_w; if none of them has credit, the least loaded worker where the
  tenant has credit; if the tenant has no credit anywhere, every worker is refilled by Q^w
  (repeatedly, until one is positive) first.
- Dispatch charges w_e × the full input length to q[i,w] (line 16) — the router cannot know
  the worker's cache hit — and completion charges w_q × the output tokens (line 22).
- The tree is updated at dispatch (line 18) and pruned on eviction reports (line 27).

A backlogged tenant thus spreads over all workers once it has used Q^w on its favourites;
Q^w trades locality for balance and fairness (Q^w = ∞ is unfair, Theorem A.5). Q^w appears
in no fairness bound (Theorems 5.1, 5.2).

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
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from fairpool.sched.cost import CostModel, TenantWeights
from fairpool.sched.errors import require_positive
from fairpool.sched.policies.dlpm import refills_to_credit
from fairpool.sched.routers.base import DEFAULT_TREE_TOKENS, PrefixRouter, RouteRequest

DEFAULT_WORKER_QUANTUM = 8192.0


class D2LPM(PrefixRouter):
    """Longest-match workers where the tenant has credit, then the shortest queue."""

    name = "d2lpm"

    def __init__(
        self,
        workers: Iterable[str] = (),
        worker_quantum: float = DEFAULT_WORKER_QUANTUM,
        cost: CostModel | None = None,
        weights: TenantWeights | None = None,
        max_tree_tokens: int = DEFAULT_TREE_TOKENS,
    ) -> None:
        self.worker_quantum = require_positive("worker_quantum", worker_quantum)
        self.cost = cost or CostModel()
        self.weights = weights or TenantWeights()
        self.deficits: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.refill_rounds = 0
        super().__init__(workers, max_tree_tokens)

    def tenant_quantum(self, tenant: str) -> float:
        return self.worker_quantum * self.weights[tenant]

    def available(self, tenant: str) -> list[str]:
        """G_avail: workers where `tenant` has credit, after refilling if it has none."""
        deficits = self.deficits[tenant]
        available = [worker for worker in self.workers if deficits[worker] > 0]
        if not available:
            self._refill(tenant)
            available = [worker for worker in self.workers if deficits[worker] > 0]
        return available

    def _refill(self, tenant: str) -> None:
        """Lines 5-6: add Q^w on every worker until some worker has credit."""
        deficits = self.deficits[tenant]
        quantum = self.tenant_quantum(tenant)
        rounds = min(refills_to_credit(deficits[worker], quantum) for worker in self.workers)
        self.refill_rounds += rounds
        for worker in self.workers:
            deficits[worker] += rounds * quantum

    def _choose(self, request: RouteRequest) -> str:
        _, holders = self._longest_match(request)  # first: it raises on a bad key
        available = self.available(request.tenant)
        if not holders:
            return self._least_loaded(available)  # empty match: every worker holds it
        credited = set(available)
        candidates = [worker for worker in holders if worker in credited]
        return self._least_loaded(candidates or available)

    def _dispatched(self, request: RouteRequest, worker_id: str) -> None:
        super()._dispatched(request, worker_id)
        self.deficits[request.tenant][worker_id] -= self.cost.service(request.input_tokens, 0)

    def _completed(self, tenant: str, worker_id: str, output_tokens: int) -> None:
        self.deficits[tenant][worker_id] -= self.cost.decode(output_tokens)

    def remove_worker(self, worker_id: str) -> None:
        super().remove_worker(worker_id)
        for deficits in self.deficits.values():
            deficits.pop(worker_id, None)
