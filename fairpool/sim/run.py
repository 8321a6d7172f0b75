"""`fairpool sim`: one fleet run from a trace or a named workload, summarised."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from fairpool.api.inference_pool import InferencePoolSpec
from fairpool.api.manifests import load_manifests
from fairpool.api.tenant_quota import tenant_shares
from fairpool.front import tokens_for_chars
from fairpool.sched.errors import ConfigError
from fairpool.sched.registry import make_policy
from fairpool.sched.tree import Shares
from fairpool.sim.fleet import ClosedLoop, Fleet, FleetConfig
from fairpool.sim.profiles import get_profile
from fairpool.sim.trace import TraceRequest, read_trace, write_trace


@dataclass(frozen=True)
class SimulationOptions:
    """What `fairpool sim` was asked. Workers, policy, router and quanta left None come
    from `pool` (an InferencePool manifest) when one is given, else from the defaults."""

    trace: str | None = None
    workload: str | None = None
    workers: int | None = None
    policy: str | None = None
    router: str | None = None
    profile: str = "llama2-7b-a10g"
    memory_tokens: int | None = None
    block_size: int | None = None
    quantum: float | None = None
    worker_quantum: float | None = None
    tenants: str | None = None
    duration: float | None = None
    seed: int = 0
    rpm_limit: int | None = None
    pool: str | None = None
    workload_params: dict[str, object] = field(default_factory=dict)
    policy_params: dict[str, object] = field(default_factory=dict)  # `--policy-param`
    clients: tuple[ClosedLoop, ...] = ()  # closed-loop tenants (`--client`)
    gateway_replicas: int | None = None
    replica_traffic: str | None = None


def load_requests(options: SimulationOptions, shares: Shares | None = None) -> list[TraceRequest]:
    """The requests of a trace or a generated workload; none for closed-loop clients,
    which send theirs as the run goes. With `shares` (the tenants' bands), a trace line
    asking a band above its tenant's is refused naming the line."""
    sources = [options.trace is not None, options.workload is not None, bool(options.clients)]
    if sum(sources) != 1:
        raise ConfigError(
            "--trace", "give exactly one of --trace FILE, --workload NAME and --client ..."
        )
    if options.clients:
        if options.duration is None:
            raise ConfigError("--duration", "closed-loop clients (--client) need a duration")
        if options.workload_params:
            raise ConfigError("--workload-param", "only applies to --workload")
        return []
    if options.trace is not None:
        if options.workload_params:
            raise ConfigError("--workload-param", "only applies to --workload")
        return read_trace(options.trace, shares)
    from fairpool.sim.workloads import generate

    assert options.workload is not None
    return generate(
        options.workload,
        duration=options.duration or 60.0,
        seed=options.seed,
        **options.workload_params,
    )


def simulate(
    options: SimulationOptions,
    requests: list[TraceRequest],
    progress: Callable[[float], None] | None = None,
    config: FleetConfig | None = None,
) -> tuple[Fleet, dict[str, Any]]:
    """Run the fleet (`config`, else the one `options` describe); returns it and the
    summary in the `--json` format."""
    fleet = Fleet(config or fleet_config(options), seed=options.seed)
    fleet.run(requests, duration=options.duration, progress=progress, clients=options.clients)
    return fleet, fleet.summary()


def fleet_config(options: SimulationOptions) -> FleetConfig:
    """The fleet `options` describe: the profile's engines; tenants' weights, groups, bands
    and hard limits from TenantQuota and TenantGroup YAML; the pool's scheduler (its bands'
    minimum shares included), routing (the gateway's saturation thresholds, fair queue and
    timeout included) and replicas from an InferencePool manifest; and flags given
    explicitly over both."""
    profile = get_profile(options.profile)
    tenants = load_manifests(options.tenants, option="--tenants") if options.tenants else None
    quotas = tenants.quotas if tenants is not None else []
    pool = load_pool(options.pool) if options.pool is not None else None
    bands = pool.scheduler.bands.by_band() if pool is not None else None
    groups = tenants.groups if tenants is not None else []
    settings: dict[str, Any] = {
        "weights": tenant_shares(quotas, groups, bands),
        "limits": {quota.tenant: quota.spec.limits for quota in quotas},
        "rpm_limit": options.rpm_limit,
    }
    if pool is not None:
        settings.update(pool_settings(pool))
    explicit = {
        "workers": options.workers,
        "policy": options.policy,
        "router": options.router,
        "quantum": options.quantum,
        "worker_quantum": options.worker_quantum,
        "gateway_replicas": options.gateway_replicas,
        "replica_traffic": options.replica_traffic,
    }
    settings.update({name: value for name, value in explicit.items() if value is not None})
    if options.policy_params:
        settings["policy_params"] = {**settings.get("policy_params", {}), **options.policy_params}
    config = FleetConfig.from_profile(
        profile, options.memory_tokens, options.block_size, **settings
    )
    _check_policy_params(config, options.policy_params)
    return config


def _check_policy_params(config: FleetConfig, given: dict[str, object]) -> None:
    """Build the policy once, so that a bad `--policy-param` is an error naming it."""
    if not given:
        return
    try:
        make_policy(config.policy, **config.policy_params)
    except ConfigError as error:
        if error.parameter in given:
            raise ConfigError(f"--policy-param {error.parameter}", error.problem) from None
        raise


def load_pool(path: str) -> InferencePoolSpec:
    """The one InferencePool of a manifest file."""
    pools = load_manifests(path, option="--pool").pools
    if len(pools) != 1:
        raise ConfigError("--pool", f"{path} must hold exactly one InferencePool, not {len(pools)}")
    return pools[0].spec


def pool_settings(spec: InferencePoolSpec) -> dict[str, Any]:
    """FleetConfig settings of a deployed pool: what its engines and its gateway front do."""
    if spec.placement is not None:
        raise ConfigError(
            "--pool", "pipeline pools (spec.placement) are not simulated by fairpool sim"
        )
    scheduler, routing = spec.scheduler, spec.routing
    return {
        "workers": max(spec.replicas, 1),
        "policy": scheduler.policy + ("+memsafe" if scheduler.memory_safe else ""),
        "quantum": scheduler.quantum,
        "policy_params": (
            {} if scheduler.share_memory is None else {"share_memory": scheduler.share_memory}
        ),
        "cost": scheduler.cost.model(),
        "router": routing.policy,
        "worker_quantum": routing.worker_quantum,
        "min_match": tokens_for_chars(routing.min_match_chars),
        "saturation": routing.saturation,
        "queue_policy": routing.queue_policy,
        "queue_timeout": routing.queue_timeout_seconds,
        "wait_for_workers": routing.wait_for_workers,
        "max_model_len": spec.model.max_model_len,
    }


def run_command(
    options: SimulationOptions,
    json_out: str | None,
    plot_out: str | None,
    write_trace_out: str | None,
    console: Console,
) -> dict[str, Any]:
    config = fleet_config(options)
    requests = load_requests(options, Shares.of(config.weights))
    if not requests and not options.clients:
        raise ConfigError("--trace", "the trace has no requests")
    if write_trace_out and options.clients:
        raise ConfigError("--write-trace", "closed-loop clients send no trace in advance")
    if write_trace_out:
        write_trace(requests, write_trace_out)
    horizon = options.duration or max(request.t for request in requests)
    with _LazyProgress(horizon) as progress:
        fleet, summary = simulate(options, requests, progress.update, config)
    console.print(summary_table(options, fleet.config, summary))
    if json_out:
        Path(json_out).write_text(json.dumps(summary, indent=2) + "\n")
    if plot_out:
        from fairpool.sim.plots import plot_fleet_run

        config = fleet.config
        title = f"{config.policy} × {config.router}, {config.workers} worker(s)"
        console.print(f"plot: {plot_fleet_run(fleet.recorder, plot_out, title)}")
    return summary


def summary_table(
    options: SimulationOptions, config: FleetConfig, summary: dict[str, Any]
) -> Table:
    """Per tenant (and per band, for a tenant with requests in several): its service, its
    share of all the service, its entitled share and the ratio of what it got while
    backlogged to that, its TTFT and backlogged time (hang-ups where there were any); the
    fleet's figures in the caption. Everything else is in the `--json` summary."""
    source = options.trace or options.workload or "closed-loop clients"
    title = (
        f"{source}: {config.workers} worker(s), policy {config.policy}, "
        f"router {config.router}, profile {options.profile}"
    )
    table = Table(title=title, title_justify="left", show_edge=False)
    total = sum(t["service"] for t in summary["tenants"].values()) or 1.0
    cells: dict[str, Callable[[dict[str, Any]], str]] = {
        "requests": lambda f: str(f["requests"]),
        "done": lambda f: str(f["finished"]),
        "hung up": lambda f: str(f["hung_up"]),
        "service": lambda f: f"{f['service']:,.0f}",
        "share": lambda f: f"{f['service'] / total:.0%}",
        "entitled": lambda f: _percent(f["entitled_share"]),
        "ratio": lambda f: "—" if f["share_ratio"] is None else f"{f['share_ratio']:.2f}",
        "TTFT p50": lambda f: _seconds(f["ttft_p50"]),
        "TTFT p99": lambda f: _seconds(f["ttft_p99"]),
        "backlogged": lambda f: f"{f['backlogged_s']:.0f}s",
    }
    if not summary["hung_up"]:
        del cells["hung up"]
    rows = [
        (label, figures)
        for name, tenant in summary["tenants"].items()
        for label, figures in [
            (name, tenant),
            *((f" @{band}", by_band) for band, by_band in tenant.get("bands", {}).items()),
        ]
    ]
    table.add_column("tenant")
    for column in cells:  # two-word headings on two lines: the table fits in 110 columns
        table.add_column(column.replace(" ", "\n"), justify="right")
    for label, figures in rows:
        table.add_row(label, *(cell(figures) for cell in cells.values()))
    table.caption = _caption(summary)
    table.caption_justify = "left"
    return table


def _caption(summary: dict[str, Any]) -> str:
    """The fleet's figures: throughput, cache, Jain, the gap between tenants backlogged
    anywhere (the headline), at some worker (DLPM Definition 3.1's backlog, which
    Theorem 5.1 states its bound for) and on every worker (the premise of that theorem's
    proof) with the theorem's bound (on several workers it bounds only the last), the
    worst share ratio, the quanta."""
    bound = summary["fairness_bound"]
    worst = summary["worst_share_ratio"]
    return (
        f"{summary['duration_s']:.0f} s · {summary['throughput_tokens_per_s']:,.0f} tok/s "
        f"({summary['output_tokens_per_s']:,.0f} out) · cache hits "
        f"{summary['cache_hit_rate']:.0%} · Jain {summary['jain_index']:.3f} · "
        f"backlogged gap {summary['max_backlogged_service_gap']:,.0f} · at some worker "
        f"{summary['max_backlogged_at_some_worker_service_gap']:,.0f} · on every worker "
        f"{summary['max_fully_backlogged_service_gap']:,.0f}"
        + (f" (bound {bound:,.0f})" if bound is not None else " (no bound)")
        + (
            f" · worst ratio {worst:.2f} ({summary['worst_share_ratio_tenant']})"
            if worst is not None
            else ""
        )
        + "".join(
            f" · {label} {summary[key]:,.0f}"
            for key, label in (("quantum", "Q"), ("worker_quantum", "Q^w"))
            if summary.get(key) is not None
        )
    )


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}s"


class _LazyProgress:
    """A progress bar on stderr that appears only once a run has taken a second."""

    def __init__(self, horizon: float) -> None:
        self.horizon = max(horizon, 1e-9)
        self.started = time.monotonic()
        self.progress: Progress | None = None
        self.task: Any = None

    def __enter__(self) -> _LazyProgress:
        return self

    def update(self, now: float) -> None:
        if self.progress is None:
            if time.monotonic() - self.started < 1.0:
                return
            self.progress = Progress(console=Console(stderr=True), transient=True)
            self.progress.start()
            self.task = self.progress.add_task("simulating", total=self.horizon)
        self.progress.update(self.task, completed=min(now, self.horizon))

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
