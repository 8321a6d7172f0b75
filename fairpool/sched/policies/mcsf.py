"""Memory-constrained shortest first (MC-SF).

Jaillet, Jiang, Podimata, Zhou (arXiv 2502.07115 v1), §4.2, Algorithm 2: waiting requests
in ascending predicted output length, each admitted only while the memory check of Eq. (1)
holds at every future completion time; the pass stops at the first that fails ("break").
Ties go to the earlier arrival.
"""

from __future__ import annotations

from typing import Any

from fairpool.sched.policy import LocalPolicy, Waiting
from fairpool.sched.requests import EngineView


class MCSF(LocalPolicy):
    """Shortest predicted output first, with memory-safe admission always on."""

    name = "mcsf"

    def __init__(self, **options: Any) -> None:
        options["memory_safe"] = True
        super().__init__(**options)

    def _select(self, view: EngineView) -> Waiting | None:
        return self._best(
            self.waiting(), key=lambda entry: (self.predictor(entry.request), entry.order)
        )
