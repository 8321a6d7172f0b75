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
        return self._first_head(self.tree.band_counters(candidates[0]), candidates)

    def tenant_state(self) -> dict[str, float]:
        return self.tree.flow_counters()

    def service_bound(self, memory_tokens: int) -> float:
        """Theorem 4.4: 2U (this U, w_e·L_input + w_q·M, is no smaller than the paper's
        max of the two terms)."""
        return 2 * self._largest_request(memory_tokens)
