"""SLO-aware LLM inference scheduling (SLAI).

Bari, Hegde, de Veciana, "Optimal Scheduling Algorithms for LLM Inference: Theory and
Practice", §6 (the paper gives numbered prose steps, no listing). A decode iteration of
request j is held back until its last schedulable time

    C_j = e_j + TBT_j − δ·t̄_batch                                    (Eq. 8)

where e_j is when j's previous iteration ended and t̄_batch the running mean batch time.
Each batch takes (1) decodes past their C_j, in increasing C_j; (2) prefills — chunks of
prompts already started first, then new requests shortest prompt first (SPF) or FCFS,
while the token budget τ and the cap α on active requests allow; (3) the remaining decodes
in increasing C_j while the budget and the cap β on decodes per batch allow.

Defaults are the paper's: τ = 512, α = β = 128, δ = 10, or the dynamic offset δ = 5 below
96 % KV utilisation and 10 above. `tighter_slo_first` is App. F.2's priority variant:
new requests of the tier with the tightest TBT target are prefilled first, in SPF (or
FCFS) order within a tier. Requests with no TBT target use `default_tbt`; with none
set they are always due, which decodes them every step as Sarathi-Serve does.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from fairpool.sched.errors import ConfigError, require_count, require_positive
from fairpool.sched.policy import LocalPolicy, Waiting
from fairpool.sched.requests import SLO, EngineView, Running

PrefillOrder = Literal["spf", "fcfs"]


class SLAI(LocalPolicy):
    """TBT-deadline decode deferral, SPF prefills, token budget, active and decode caps."""

    name = "slai"

    def __init__(
        self,
        token_budget: int = 512,
        max_active: int = 128,
        max_decodes: int = 128,
        offset: float | Literal["dynamic"] = 10.0,
        prefill_order: PrefillOrder = "spf",
        default_tbt: float | None = None,
        tighter_slo_first: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.token_budget = require_count("token_budget", token_budget, minimum=1)
        self.max_active = require_count("max_active", max_active, minimum=1)
        self.max_decodes = require_count("max_decodes", max_decodes, minimum=1)
        if offset != "dynamic":
            require_positive("offset", offset)
        self.offset = offset
        if prefill_order not in ("spf", "fcfs"):
            raise ConfigError("prefill_order", f"must be 'spf' or 'fcfs', got {prefill_order!r}")
        self.prefill_order = prefill_order
        if default_tbt is not None:
            require_positive("default_tbt", default_tbt)
        self.default_tbt = default_tbt
        if not isinstance(tighter_slo_first, bool):
            raise ConfigError(
                "tighter_slo_first", f"must be true or false, got {tighter_slo_first!r}"
            )
        self.tighter_slo_first = tighter_slo_first

    def current_offset(self, view: EngineView) -> float:
        if self.offset == "dynamic":
            return 5.0 if view.memory_utilization < 0.96 else 10.0
        return float(self.offset)

    def deadline(self, running: Running, view: EngineView) -> float:
        """C_j of Eq. 8: the latest time the next decode iteration may start."""
        tbt = self.tbt(running.request.slo)
        if tbt == math.inf:
            return -math.inf
        return running.last_step_end + tbt - self.current_offset(view) * view.mean_batch_time

    def split_decodes(self, view: EngineView) -> tuple[list[Running], list[Running]]:
        decoding = sorted(
            (r for r in view.running if r.decoding), key=lambda r: self.deadline(r, view)
        )
        due = [r for r in decoding if self.deadline(r, view) <= view.now]
        return due, decoding[len(due) :]

    def _select(self, view: EngineView) -> Waiting | None:
        if len(view.running) >= self.max_active:
            return None

        def tier(entry: Waiting) -> float:
            return self.tbt(entry.request.slo) if self.tighter_slo_first else 0.0

        if self.prefill_order == "fcfs":
            return self._best(self.waiting(), key=lambda entry: (tier(entry), entry.order))
        return self._best(
            self.waiting(),
            key=lambda entry: (
                tier(entry),
                entry.request.prompt_tokens - view.cached_tokens(entry.request),
                entry.order,
            ),
        )

    def tbt(self, slo: SLO | None) -> float:
        """The TBT target a request is scheduled by (∞: none, always due)."""
        if slo is not None and slo.tbt is not None:
            return slo.tbt
        return math.inf if self.default_tbt is None else self.default_tbt
