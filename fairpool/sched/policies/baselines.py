"""Baselines the papers compare against, beyond FCFS and LPM.

- `sarathi`: Sarathi-Serve (Agrawal et al., OSDI'24), the baseline of seed 004 (RAD/SLAI
  §7): every running decode in every batch, prefills FCFS in chunks under a token budget.
- `alpha_protection`: the vLLM-like baselines of seed 002 (Jaillet et al. §6, "benchmark
  algorithms used currently in practice"): FCFS admission while current KV usage plus the
  prompt stays within (1 − α)·M, no look-ahead. On overflow, α-protection *greedy* clears
  every running request back to the queue (their progress is recomputed);
  α-protection *β-clearing* clears each one independently with probability β, in
  repeated passes until memory fits.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from fairpool.sched.errors import ConfigError, require_count, require_number
from fairpool.sched.policies.fcfs import FCFS
from fairpool.sched.policy import Waiting
from fairpool.sched.requests import EngineView, Running


class Sarathi(FCFS):
    """FCFS, chunked prefill under a token budget, every decode every step."""

    name = "sarathi"

    def __init__(self, token_budget: int = 512, **options: Any) -> None:
        super().__init__(**options)
        self.token_budget = require_count("token_budget", token_budget, minimum=1)


class AlphaProtection(FCFS):
    """FCFS under a (1 − α)·M watermark; clears running requests on overflow."""

    name = "alpha_protection"
    preempt_all = True  # a clearing pass clears everything it picks

    def __init__(
        self, alpha: float = 0.25, beta: float | None = None, seed: int = 0, **options: Any
    ) -> None:
        super().__init__(**options)
        self.alpha = _fraction("alpha", alpha, open_low=False)
        self.beta = None if beta is None else _fraction("beta", beta, open_low=True)
        self._random = random.Random(seed)

    def _select(self, view: EngineView) -> Waiting | None:
        head = super()._select(view)
        if head is None:
            return None
        used = view.memory_utilization * view.memory_tokens
        if used + head.request.prompt_tokens > (1 - self.alpha) * view.memory_tokens:
            return None
        return head

    def preemption_order(self, running: Sequence[Running]) -> list[Running]:
        if self.beta is None:
            return list(running)  # greedy: clear all active requests
        return [r for r in running if self._random.random() < self.beta]


def _fraction(parameter: str, value: object, open_low: bool) -> float:
    number = require_number(parameter, value)
    if not (0 < number < 1 if open_low else 0 <= number < 1):
        bounds = "(0, 1)" if open_low else "[0, 1)"
        raise ConfigError(parameter, f"must be within {bounds}, got {value!r}")
    return number
