"""A load run's results for people and programs: the per-tenant table (live and final),
one status line, the JSON report and the plot of cumulative service over time."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from fairpool_cli.load.stats import LoadResult, TenantStats

COLUMNS = (
    "tenant", "weight", "sent", "done", "errors", "out tok/s", "service", "share / entitled",
    "cached", "TTFT p50 / p99", "latency p50 / p99",
)  # fmt: skip


def tenant_table(result: LoadResult, title: str) -> Table:
    """One row per tenant: requests, errors by kind, output tokens/s, service and its
    share next to the entitled share, prompt tokens served from cache, TTFT and latency."""
    table = Table(title=title, title_justify="left")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("tenant", "errors") else "right")
    for stats in result.tenants.values():
        table.add_row(*_row(result, stats))
    return table


def _row(result: LoadResult, stats: TenantStats) -> list[str]:
    share, entitled = result.share(stats.name), result.entitled_share(stats.name)
    cached = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else None
    return [
        stats.name,
        f"{stats.weight:g}",
        str(stats.sent),
        str(stats.done),
        errors_text(stats),
        f"{stats.completion_tokens / result.elapsed_or_one:,.0f}",
        f"{stats.service:,.0f}",
        f"{_share(share)} / {_share(entitled)}",
        _percent(cached),
        f"{_seconds(stats.ttft(0.5))} / {_seconds(stats.ttft(0.99))}",
        f"{_seconds(stats.latency(0.5))} / {_seconds(stats.latency(0.99))}",
    ]


def errors_text(stats: TenantStats) -> str:
    """`limited 3, 503 1, cancelled 2`; `—` for none."""
    parts = [f"{kind} {count}" for kind, count in sorted(stats.errors.items())]
    if stats.cancelled:
        parts.append(f"cancelled {stats.cancelled}")
    return ", ".join(parts) or "—"


def title(result: LoadResult) -> str:
    spec = result.spec
    what = f"trace of {len(spec.trace)} requests" if spec.trace else spec.shape.name
    parts = [spec.url, result.model, spec.api, what, f"{result.elapsed:.1f}s"]
    if spec.warmup:
        parts.append(f"shares after {spec.warmup:g}s")
    if result.stopped_by != "running":
        parts.append(f"ended: {result.stopped_by}")
    return " · ".join(parts)


def status_line(result: LoadResult) -> str:
    """One line for logs: elapsed, totals, and each tenant's share / entitled share."""
    tenants = result.tenants.values()
    sent = sum(stats.sent for stats in tenants)
    done = sum(stats.done for stats in tenants)
    errors = sum(sum(stats.errors.values()) for stats in tenants)
    shares = " ".join(
        f"{stats.name} {_share(result.share(stats.name))}/"
        f"{_share(result.entitled_share(stats.name))}"
        for stats in tenants
    )
    return (
        f"{result.elapsed:6.1f}s sent {sent} done {done} errors {errors} | share/entitled {shares}"
    )


def write_json(result: LoadResult, path: str | Path) -> Path:
    output = Path(path)
    output.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return output


def plot_service(result: LoadResult, path: str | Path) -> Path:
    """Cumulative service per tenant over time, normalized by weight in a second panel:
    parallel curves there mean shares in proportion to the weights."""
    from fairpool.sim.plots import pyplot, save

    plt = pyplot()
    figure, (raw, normalized) = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    times = [point.t for point in result.series]
    for name, stats in result.tenants.items():
        served = [point.service[name] / 1000 for point in result.series]
        raw.plot(times, served, label=f"{name} (weight {stats.weight:g})")
        normalized.plot(times, [value / stats.weight for value in served], label=name)
    raw.set_title("cumulative service", fontsize=10)
    normalized.set_title("cumulative service / weight", fontsize=10)
    for axis in (raw, normalized):
        axis.set_xlabel("seconds")
        axis.set_ylabel("thousand tokens")
        axis.grid(alpha=0.3)
    raw.legend(fontsize=8)
    return save(figure, path)


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"
