"""The deficit schedulers' quantum: a value the operator fixes, or `auto`.

DLPM's Q and D2LPM's Q^w (Cao et al., arXiv 2501.14312, §4.1 Algorithm 1 and §5.2
Algorithm 2) trade locality for fairness, and the right value depends on how large the
requests are: a quantum below one request's prompt hands the engine (or the worker) to
another tenant before the next request can reuse the prefix the last one cached, so the
scheduler degenerates into VTC (or into spreading every request), and a quantum of many
requests lets one tenant hold the engine for long. `auto` sizes the quantum from the
requests seen: `requests` times the largest prompt cost w_e·L_input charged so far, never
below `floor`.

The value only grows (the largest prompt seen only grows). The fairness proofs need each
deficit in (−U, Q]; credit is only ever added by refills capped at the quantum in force,
so no deficit exceeds the current quantum after it grows, and the bounds hold with the
quantum in force when they are read (DLPM Theorem 4.1: 2(U + Q)).
"""

from __future__ import annotations

from dataclasses import dataclass

from fairpool.sched.errors import require_count, require_positive


@dataclass(frozen=True)
class Quantum:
    """A fixed quantum, or (`fixed` None) the `auto` one sized from the prompts seen."""

    fixed: float | None
    floor: float
    requests: int = 1
    parameter: str = "quantum"

    def __post_init__(self) -> None:
        if self.fixed is not None:
            require_positive(self.parameter, self.fixed)
        require_positive("floor", self.floor)
        require_count("requests", self.requests, minimum=1)

    @property
    def auto(self) -> bool:
        return self.fixed is None

    def value(self, largest_prompt: float) -> float:
        """The quantum in force once the largest prompt charged cost `largest_prompt`
        (service units, w_e·L_input)."""
        if self.fixed is not None:
            return self.fixed
        return max(self.floor, self.requests * largest_prompt)
