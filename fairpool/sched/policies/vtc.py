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
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fairpool.sched.policy import LocalPolicy, Waiting
from fairpool.sched.requests import EngineView


class VTC(LocalPolicy):
    """Least-served tenant first, by weighted virtual token counters with the counter lift."""

    name = "vtc"
    shares_memory = True
    weighs_tenants = True

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.counters: dict[str, float] = defaultdict(float)
        self._last_left: str | None = None

    def _on_join(self, tenant: str, idle: bool) -> None:
        waiting = [self.counters[other] for other in self.waiting_tenants()]
        waiting.extend(self.waiting_elsewhere())
        if waiting:
            floor = min(waiting)
        elif self._last_left is not None:
            floor = self.counters[self._last_left]
        else:
            return
        self.counters[tenant] = max(self.counters[tenant], floor)

    def _on_leave(self, tenant: str) -> None:
        self._last_left = tenant

    def _on_charge(self, tenant: str, service: float) -> None:
        self.counters[tenant] += service / self.weights[tenant]

    def _select(self, view: EngineView) -> Waiting | None:
        return self._first_head(self.counters)

    def tenant_state(self) -> dict[str, float]:
        return dict(self.counters)

    def service_bound(self, memory_tokens: int) -> float:
        """Theorem 4.4: 2U (this U, w_e·L_input + w_q·M, is no smaller than the paper's
        max of the two terms)."""
        return 2 * self._largest_request(memory_tokens)
