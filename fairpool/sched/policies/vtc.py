"""Virtual Token Counter.

Sheng, Cao, Li, Zhu, Li, Zhuo, Gonzalez, Stoica, "Fairness in Serving Large Language
Models", OSDI'24 (arXiv 2401.00588), §4, Algorithm 2; weighted form §4.3.

Each tenant has a counter of the service it received, divided by its weight. The tenant
with the smallest counter among those with waiting requests is served next, its earliest
request first (lines 19-26). Prefill is charged at admission (line 24, footnote 5), decode
per generated token (line 30). A tenant that gets a waiting request after having none is
lifted to the smallest counter of the tenants that are waiting (lines 7-13), or to the
counter of the tenant that most recently left the queue when nobody is waiting (lines
9-10): credit from idle periods is not banked, and debts are kept. In a gateway's replicas
the tenants waiting include those waiting at the other replicas (`waiting_elsewhere`).

Lemma 4.3: while anyone waits, the counters of waiting tenants stay within U of each other.

The counters and the lift are the fair order's tree's (`fairpool.sched.tree`), which applies
them at every level — band, group, tenant — so VTC over a flat table of tenants is exactly
Algorithm 2, and over bands and groups its hierarchical form.
"""

from __future__ import annotations

from collections.abc import Mapping

from fairpool.sched.policy import LocalPolicy, Waiting
from fairpool.sched.requests import EngineView


class VTC(LocalPolicy):
    """Least-served tenant first, by weighted virtual token counters with the counter lift
    (the tree's, at every level)."""

    name = "vtc"
    shares_memory = True
    weighs_tenants = True

    @property
    def counters(self) -> dict[str, float]:
        """Each flow's counter: its weighted service in its band."""
        return self.tree.flow_counters()

    def _select(self, view: EngineView) -> Waiting | None:
        """The head of the flow with the smallest counter among those the tree offers
        (ties: the earliest request, as Algorithm 2 breaks them)."""
        candidates = self.tree.candidates(self._queues)
        if not candidates:
            return None
        counters = self.tree.band_counters(candidates[0])
        if self.weights.orders_by_deadline(candidates[0]):
            return self._earliest_due(candidates, counters)
        return self._first_head(counters, candidates)

    def _earliest_due(self, candidates: list[str], counters: Mapping[str, float]) -> Waiting:
        """Deadlines where the fair order leaves a choice (EDF, the interactive band's
        tenants with `slo.ttftSeconds`): among the candidate flows within one request's
        worth of the least served (`FairTree.slack`), the head request due first (its
        arrival plus its tenant's target); ties, and flows without a target, by counter,
        then arrival. A flow further ahead is never chosen for its deadline, so the
        counters of the flows waiting stay within 2U/w_min of each other instead of
        VTC's U/w_min (docs/scheduling.md, "The fair order")."""
        least = min(counters[name] for name in candidates)
        shares, queues = self.weights, self._queues
        best: Waiting | None = None
        best_key = (0.0, 0.0, 0)
        for name in candidates:
            counter = counters[name]
            if counter - least > self.tree.slack(name):
                continue
            head = queues[name][0]
            key = (shares.due(name, head.request.arrival), counter, head.order)
            if best is None or key < best_key:
                best, best_key = head, key
        assert best is not None  # the least served is always within its own slack
        return best

    def tenant_state(self) -> dict[str, float]:
        return self.tree.flow_counters()

    def service_bound(self, memory_tokens: int) -> float:
        """Theorem 4.4: 2U (this U, w_e·L_input + w_q·M, is no smaller than the paper's
        max of the two terms)."""
        return 2 * self._largest_request(memory_tokens)
