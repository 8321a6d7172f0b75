"""First come, first served: the baseline of every paper (VTC §5.1, S-LoRA's default)."""

from __future__ import annotations

from fairpool.sched.policy import LocalPolicy, Waiting
from fairpool.sched.requests import EngineView


class FCFS(LocalPolicy):
    """Admit the earliest waiting request (preempted requests first, as vLLM prepends them)."""

    name = "fcfs"

    def _select(self, view: EngineView) -> Waiting | None:
        return self._first_head()
