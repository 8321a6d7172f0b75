"""The deficit schedulers' quantum: a value the operator fixes, or `auto`.

DLPM's Q and D2LPM's Q^w (Cao et al., arXiv 2501.14312, §4.1 Algorithm 1 and §5.2
Algorithm 2) trade locality for fairness, and the right value depends on how large the
requests are: a quantum below one request's prompt hands the engine (or the worker) to
another tenant before the next request can reuse the prefix the last one cached, so the
scheduler degenerates into VTC (or into spreading every request), and a quantum of many
requests lets one tenant hold the engine for long. `auto` sizes the quantum from the
requests seen: `requests` times the largest prompt cost w_e·L_input charged so far, never
below `floor`.

How many requests (DLPM: `AUTO_QUANTUM_REQUESTS` in `fairpool.sched.policies.dlpm`):

- Locality. DLPM charges a request's uncached prompt at admission (Algorithm 1, line 23).
  A tenant whose document was evicted pays a whole prompt for the first request on it,
  and the requests after it on the cached document cost almost nothing. With a quantum of
  one prompt its credit is gone after one such miss; it then waits for the next refill
  (Algorithm 1, lines 3-8: every waiting tenant out of credit) while the other tenants'
  misses evict what it just loaded. A tenant that works on several documents needs a
  prompt's worth per document it reloads in a round: m prompts keep it on the engine
  through up to m misses a round.
- Fairness. Theorem 4.1 bounds two backlogged tenants' gap by 2(U + Q), VTC (Sheng et
  al., OSDI'24, Theorem 4.4) by 2U, with U = w_e·L_input + w_q·M. A prompt fits in the KV
  pool (L_input ≤ M), so Q = m·w_e·L_input gives Q/U ≤ m·w_e/(w_e + w_q): DLPM's bound is
  at most 1 + m·w_e/(w_e + w_q) times VTC's, 1 + m/3 at w_e, w_q = 1, 2. While the floor
  is in force, Q/U ≤ floor/(w_q·M) instead.

DLPM keeps m = 1. `python -m fairpool_reproduce --only quantum` (docs/results.md §9)
chooses the smallest m that keeps 95 % of the best fixed quantum's throughput on every
workload of two tuning families, then runs that m and the default on families held out
from the choice; docs/scheduling.md says why the default has not moved to it yet.

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
