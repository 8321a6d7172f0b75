"""Plots of simulation results (matplotlib is an optional dependency: `fairpool[plot]`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fairpool.sched.errors import ConfigError

if TYPE_CHECKING:
    from fairpool.sim.demo import RunResult


def plot_service_over_time(results: Sequence[RunResult], path: str | Path) -> Path:
    """Cumulative service per tenant over time: one panel per scenario and policy.

    Parallel curves mean equal shares (as in the VTC paper's Fig. 3); a widening gap
    means one tenant is taking more than the other.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot", "needs matplotlib: pip install 'fairpool[plot]'") from None
    scenarios = list(dict.fromkeys(result.scenario for result in results))
    policies = list(dict.fromkeys(result.policy for result in results))
    figure, axes = plt.subplots(
        len(scenarios),
        len(policies),
        figsize=(3.2 * len(policies), 2.8 * len(scenarios)),
        squeeze=False,
        sharex=True,
    )
    for result in results:
        axis = axes[scenarios.index(result.scenario)][policies.index(result.policy)]
        tenants = sorted({tenant for _, served in result.service_over_time for tenant in served})
        times = [time for time, _ in result.service_over_time]
        for tenant in tenants:
            values = [served.get(tenant, 0.0) / 1000 for _, served in result.service_over_time]
            axis.plot(times, values, label=f"tenant {tenant}")
        axis.set_title(f"{result.scenario} · {result.policy}", fontsize=9)
        axis.grid(alpha=0.3)
        if policies.index(result.policy) == 0:
            axis.set_ylabel("service (k tokens)")
        if scenarios.index(result.scenario) == len(scenarios) - 1:
            axis.set_xlabel("time (s)")
    axes[0][0].legend(fontsize=8)
    figure.suptitle("Cumulative service per tenant (1·extend + 2·output tokens)")
    figure.tight_layout()
    output = Path(path)
    figure.savefig(output, dpi=110)
    plt.close(figure)
    return output
