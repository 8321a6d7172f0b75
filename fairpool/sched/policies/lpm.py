"""Longest prefix match first: SGLang's default local policy.

DLPM paper (Cao et al., arXiv 2501.14312), §2 and §B.3 of the reference digest: "sorts
current requests in the waiting queue based on their matched prefix length and then adds
them to the new batch until the memory pool is full". No isolation: a tenant with many
requests sharing a long cached prefix takes the whole engine.
"""

from __future__ import annotations

from fairpool.sched.policy import LocalPolicy, Waiting
from fairpool.sched.requests import EngineView


class LPM(LocalPolicy):
    """Admit the waiting request with the most cached prompt tokens (ties: FCFS)."""

    name = "lpm"

    def _select(self, view: EngineView) -> Waiting | None:
        return self._longest_match(view, self._queues)
