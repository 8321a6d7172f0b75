"""Plots of simulation results (matplotlib is an optional dependency: `fairpool[plot]`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairpool.sched.errors import ConfigError

if TYPE_CHECKING:
    from fairpool.sim.demo import PriorityResult, RunResult
    from fairpool.sim.metrics import Recorder


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or a clear error without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot", "needs matplotlib: pip install 'fairpool[plot]'") from None
    return plt


def save(figure: Any, path: str | Path) -> Path:
    """Lay out, write as PNG, and release a figure."""
    figure.tight_layout()
    output = Path(path)
    figure.savefig(output, dpi=110)
    pyplot().close(figure)
    return output


def plot_service_over_time(results: Sequence[RunResult], path: str | Path) -> Path:
    """Cumulative service per tenant over time: one panel per scenario and policy.

    Parallel curves mean equal shares (as in the VTC paper's Fig. 3); a widening gap
    means one tenant is taking more than the other.
    """
    plt = pyplot()
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
    return save(figure, path)


def plot_priority(results: Sequence[PriorityResult], path: str | Path) -> Path:
    """The interactive tenant's TTFT with priority bands on, off and alone, one row per
    policy: each request's TTFT by its arrival time, and their CDF."""
    plt = pyplot()
    figure, axes = plt.subplots(len(results), 2, figsize=(11, 3.6 * len(results)), squeeze=False)
    for (time_axis, cdf_axis), result in zip(axes, results, strict=True):
        for run in result.runs:
            label = {"on": "priority on", "off": "priority off"}.get(run.label, run.label)
            times = [arrival for arrival, _ in run.interactive_ttfts]
            ttfts = [ttft * 1000 for _, ttft in run.interactive_ttfts]
            time_axis.plot(times, ttfts, marker=".", linewidth=0.8, label=label)
            ordered = sorted(ttfts)
            fractions = [(index + 1) / len(ordered) for index in range(len(ordered))]
            cdf_axis.step(ordered, fractions, where="post", label=label)
        time_axis.set_yscale("log")
        time_axis.set_xlabel("arrival (s)")
        time_axis.set_ylabel("TTFT (ms)")
        time_axis.set_title(f"{result.scenario} · {result.policy}: TTFT by arrival", fontsize=9)
        cdf_axis.set_xscale("log")
        cdf_axis.set_xlabel("TTFT (ms)")
        cdf_axis.set_ylabel("fraction of requests")
        cdf_axis.set_title(f"{result.scenario} · {result.policy}: TTFT CDF", fontsize=9)
        for axis in (time_axis, cdf_axis):
            axis.grid(alpha=0.3)
        time_axis.legend(fontsize=8)
    figure.suptitle("The interactive tenant's time to first token beside a batch flood")
    return save(figure, path)


def plot_fleet_run(recorder: Recorder, path: str | Path, title: str) -> Path:
    """Two panels: cumulative service per tenant over time, and latency CDFs per tenant."""
    plt = pyplot()
    figure, (service_axis, latency_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for tenant in sorted(recorder.service_times):
        weight = recorder.weights[tenant]
        times = [0.0, *recorder.service_times[tenant]]
        values = [0.0, *(value / weight / 1000 for value in recorder.service_values[tenant])]
        service_axis.step(times, values, where="post", label=tenant)
    service_axis.set_xlabel("time (s)")
    service_axis.set_ylabel("service / weight (k tokens)")
    service_axis.set_title("cumulative service")
    service_axis.grid(alpha=0.3)
    for tenant in sorted(recorder.tenants):
        latencies = sorted(
            c.finished_at - c.request.arrival
            for c in recorder.completions
            if c.request.tenant == tenant
        )
        if latencies:
            fractions = [(index + 1) / len(latencies) for index in range(len(latencies))]
            latency_axis.plot(latencies, fractions, label=tenant)
    latency_axis.set_xlabel("end-to-end latency (s)")
    latency_axis.set_ylabel("fraction of requests")
    latency_axis.set_title("latency CDF")
    latency_axis.grid(alpha=0.3)
    if len(recorder.tenants) <= 12:
        service_axis.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    return save(figure, path)
