"""Estimates over seeds: the mean with its 95 % confidence interval (Student's t).

Every serving experiment runs each configuration over several seeds (each seed draws its
own arrivals and lengths); the reports print `mean ± half-width` and decide comparisons
from the intervals, never from one run.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from scipy.stats import t as student_t

SEEDS = (0, 1, 2, 3, 4)
LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """The mean of `n` per-seed values and the half-width of its 95 % interval (0 when
    n = 1 or every value is equal)."""

    mean: float
    half_width: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def above(self, value: float) -> bool:
        """The whole interval lies above `value`."""
        return self.low > value

    def format(self, digits: int = 2, unit: str = "") -> str:
        if self.n < 2:
            return f"{self.mean:,.{digits}f}{unit}"
        return f"{self.mean:,.{digits}f} ± {self.half_width:,.{digits}f}{unit}"


def estimate(values: Iterable[float]) -> Estimate:
    """Mean and 95 % interval of independent per-seed values."""
    sample = [float(value) for value in values]
    if not sample:
        raise ValueError("no values to estimate from")
    mean = statistics.fmean(sample)
    if len(sample) < 2:
        return Estimate(mean, 0.0, len(sample))
    spread = statistics.stdev(sample) / len(sample) ** 0.5
    quantile = float(student_t.ppf(0.5 + LEVEL / 2, len(sample) - 1))
    return Estimate(mean, quantile * spread, len(sample))
