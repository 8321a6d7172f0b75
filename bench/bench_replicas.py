"""Several gateway replicas: does a tenant's limit hold across them, and do the weights?

Everything runs here as processes on loopback: a Valkey server (`fairpool_cli.local.store`),
`fairpool engine-sim` workers at real time (`--speedup 1`, 2,048 KV tokens each, VTC with
the tenants' weights in their scheduler configuration, so queues form in the engines), and
N `fairpool gateway` processes with one configuration (`sharedState` naming the server,
`replicas: N`), each on its own port. The load generator is `fairpool load`'s, as in
`bench_gateway.py`, whose request shapes it reuses (a tenant's own system prompt, a
120-word question, 64 output tokens, streamed).

Five measurements:

1. **Limits** (`limits`). A tenant limited to `--tpm` tokens a minute floods (closed loop,
   `--limit-streams` streams) through 4 replicas, its streams spread evenly, for
   `--limit-seconds`: the tokens its admitted requests were reserved (prompt estimate +
   output limit; nothing refunds them within the run, as the engine's usage only lowers
   the count) against the limit, with the replicas sharing state and, for comparison,
   each keeping its own (no `sharedState`).
2. **Weights** (`weights`). Two tenants, gold (weight 4) and bronze (1), both flooding
   (`--streams` streams each), with 1, 2 and 4 replicas: each tenant through its own
   replica (`skewed`: gold through replica 0, bronze through the last), or both spread
   evenly over every replica (`spread`). After `--warmup` seconds, a window of
   `--window` seconds: each tenant's service (1 × uncached prompt + 2 × output tokens)
   from the engines' own counters, gold : bronze, and the engines' total service per
   second against the one-replica run's. The gateways' saturation is the flood
   benchmark's (`maxOutstanding: 8` per worker; `--max-outstanding` sets another). Three
   setups (`--engines fair,stock,alone`): `fair`, engines running VTC with the weights
   and the pool's `fairEngines` on (each tenant keeps `tenantWaiting` requests waiting
   in every engine, whose VTC decides); `stock`, engines serving first come, first served
   (as stock vLLM) behind replicas that share their queues and caps through the shared
   state (the gateways' fair queue decides); `alone`, the same engines behind replicas
   without shared state (each decides on its own requests).

3. **Overhead** (`overhead`). One gateway (pinned to core 1; the worker, the load generator
   and the Valkey server share core 0), one engine-sim at `--speedup 1000` (model time
   negligible), with and without `sharedState`, its tenants limited (so every request
   runs the shared script): open-loop Poisson arrivals at `--rate` (200/s) for
   `--overhead-seconds`, TTFT and total p50/p99, and a closed loop of 32 streams: requests
   per second and per core of the gateway.

4. **Outage** (`outage`). Two replicas sharing state, a tenant flooding through both
   (`--limit-streams` streams, under a concurrency limit of as many: the clients here
   retry a refusal at once, with no back-off, and a limit they kept hitting would have
   them flood the gateways with refusals) for
   `--outage-seconds` × 3: after the first third the Valkey server is stopped for a
   third, then started again. Requests that failed (neither answered nor refused by a
   limit), and the seconds from the server's return until both replicas count in it
   again (`fairpool_gateway_shared_state_up` 1 on their admin ports, polled every 0.1 s).

5. **Processes** (`processes`). One `fairpool gateway --workers N`, N = 1 and 2, no shared
   state, one engine-sim at `--speedup 1000`: a closed loop of `--process-streams` (32)
   streamed requests for `--overhead-seconds`, requests per second and the CPU of the
   gateway's processes, the engine and the load generator. Nothing is pinned: on a
   two-core machine the gateway's processes share the cores with the engine and the load
   generator, so the ratio is what a second process gains here, not on an idle core.

Results: `bench/results/replicas.json` and `.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from _common import write_results
from bench_gateway import (
    Cpu,
    Flood,
    MakeRequest,
    closed_loop_results,
    closed_loop_row,
    flood_engine_options,
    latency_row,
    open_loop_results,
    pin_self,
    request_maker,
    scrape,
    sender,
    served_between,
)
from routers import (
    FAIRPOOL,
    GATEWAY_MAX_OUTSTANDING,
    HOST,
    EngineOptions,
    FairpoolGateway,
    Process,
    RunningProxy,
    Tenant,
    free_port,
    free_ports_from,
    gateway_config,
    probe,
    spawn,
    start_engines,
    wait_until,
)

from fairpool_cli.local.store import LocalStore

GOLD, BRONZE = Tenant("gold", 4.0), Tenant("bronze", 1.0)
LIMITED = Tenant("limited", 1.0)
MAX_TOKENS = 64
WORDS = 120
PROXY = FairpoolGateway("fairpool")


def say(message: str) -> None:
    print(f"bench_replicas: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- processes


@contextlib.contextmanager
def gateways(
    count: int,
    workers: list[str],
    tenants: list[Tenant],
    store: LocalStore | None,
    logs: Path,
    limits: dict[str, Any] | None = None,
    max_outstanding: int | None = GATEWAY_MAX_OUTSTANDING,
    cores: str | None = None,
    fair_engines: bool = False,
    processes: int = 1,
    shared: bool = True,
    groups: dict[str, dict[str, Any]] | None = None,
) -> Iterator[list[RunningProxy]]:
    """`count` gateways with one configuration, each ready on its own port
    (`max_outstanding` None: the pool's default saturation)."""
    started: list[RunningProxy] = []
    try:
        for _ in range(count):
            port = free_port()
            config = gateway_config(
                port, free_ports_from(processes), workers, tenants, None, groups
            )
            if max_outstanding is None:
                del config["pools"][0]["routing"]["saturation"]
            else:
                config["pools"][0]["routing"]["saturation"]["maxOutstanding"] = max_outstanding
            config["pools"][0]["fairEngines"] = fair_engines
            if store is not None and shared:
                config["sharedState"] = {"url": store.url, "replicas": count}
            if limits:
                for entry in config["tenants"]:
                    entry["limits"] = limits
            path = logs / f"gateway-{port}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            command = [str(FAIRPOOL), "gateway", "--config", str(path), "--workers", str(processes)]
            process = spawn(f"gateway-{port}", command, cores, logs)
            started.append(RunningProxy(PROXY, [(HOST, port)], process, config))
        for running in started:
            wait_until(lambda r=running: probe(r, tenants[0]), running.process, 60, "gateway")
        yield started
    finally:
        for running in started:
            running.stop()


@contextlib.contextmanager
def started_engines(
    count: int, options: EngineOptions, cores: str | None, logs: Path
) -> Iterator[list[Process]]:
    """`count` engine-sim workers for the `with` block, stopped after it."""
    engines = start_engines(count, options, cores, logs)
    try:
        yield engines
    finally:
        for engine in engines:
            engine.stop()


def spread_over(running: list[RunningProxy]) -> Any:
    """Each client stream's sender, the streams spread evenly over the replicas."""
    targets = [proxy.targets[0] for proxy in running]
    return lambda index: sender(*targets[index % len(targets)])


async def flood(
    streams: dict[str, tuple[int, MakeRequest]],
    client_for: Any,
    seconds: float,
) -> Flood:
    load = Flood(streams)
    task = asyncio.create_task(load.run(client_for))
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return load


# ---------------------------------------------------------------------- limits


def run_limits(settings: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    rows = []
    with started_engines(2, flood_engine_options({}, "vtc"), None, logs) as engines:
        workers = [engine.url for engine in engines]
        for shared in (True, False):
            with contextlib.ExitStack() as stack:
                store = stack.enter_context(LocalStore()) if shared else None
                running = stack.enter_context(
                    gateways(4, workers, [LIMITED], store, logs, {"tokensPerMinute": settings.tpm})
                )
                rows.append(asyncio.run(measure_limit(settings, running, shared)))
                say(f"limits, shared={shared}: {rows[-1]['reserved_tokens']:,} tokens admitted")
    return rows


async def measure_limit(
    settings: argparse.Namespace, running: list[RunningProxy], shared: bool
) -> dict[str, Any]:
    make = request_maker(PROXY, [LIMITED], "chat", MAX_TOKENS, WORDS)
    load = await flood(
        {LIMITED.name: (settings.limit_streams, make)}, spread_over(running), settings.limit_seconds
    )
    admitted = [result for result in load.results if result.ok]
    refused = [result for result in load.results if result.status == 429]
    # what the limiter counted for each admitted request: its prompt and output limit
    reserved = sum(result.prompt_tokens + MAX_TOKENS for result in admitted)
    return {
        "shared": shared,
        "replicas": len(running),
        "limit_tokens_per_minute": settings.tpm,
        "seconds": settings.limit_seconds,
        "admitted": len(admitted),
        "refused": len(refused),
        "reserved_tokens": reserved,
        "served_tokens": sum(r.prompt_tokens + r.completion_tokens for r in admitted),
        "largest_request": max((r.prompt_tokens + MAX_TOKENS for r in admitted), default=0),
        "vs_limit": round(reserved / settings.tpm, 3),
    }


# ---------------------------------------------------------------------- weights


@dataclass(frozen=True)
class Setup:
    """Engines and gateways of one weights run."""

    engine_policy: str
    fair_engines: bool
    shared: bool
    label: str


SETUPS = {
    "fair": Setup("vtc", True, True, "VTC engines, fairEngines on"),
    "stock": Setup("fcfs", False, True, "FCFS engines, shared queues"),
    "alone": Setup("fcfs", False, False, "FCFS engines, replicas alone"),
}


def run_weights(settings: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    rows = [
        weights_row(settings, logs, replicas, layout, setup)
        for setup in settings.engines
        for replicas in settings.replicas
        for layout in (("skewed", "spread") if replicas > 1 else ("skewed",))
    ]
    for row in rows:
        base = next(one for one in rows if one["replicas"] == 1 and one["setup"] == row["setup"])
        row["throughput_vs_one"] = round(row["service_per_s"] / base["service_per_s"], 3)
    return rows


def weights_row(
    settings: argparse.Namespace, logs: Path, replicas: int, layout: str, name: str
) -> dict[str, Any]:
    setup = SETUPS[name]
    weights = {GOLD.name: GOLD.weight, BRONZE.name: BRONZE.weight}
    options = flood_engine_options(weights, setup.engine_policy)
    with (
        started_engines(2, options, None, logs) as engines,
        LocalStore() as store,
        gateways(
            replicas,
            [e.url for e in engines],
            [GOLD, BRONZE],
            store,
            logs,
            max_outstanding=settings.max_outstanding,
            fair_engines=setup.fair_engines,
            shared=setup.shared,
        ) as running,
    ):
        row = asyncio.run(measure_weights(settings, running, engines, layout))
    row["setup"] = name
    say(f"weights, {replicas} replica(s), {layout}, {setup.label}: {row['ratio']:.2f}")
    return row


async def measure_weights(
    settings: argparse.Namespace,
    running: list[RunningProxy],
    engines: list[Process],
    layout: str,
) -> dict[str, Any]:
    def through(tenant: Tenant) -> Any:
        if layout == "spread":
            return spread_over(running)
        own = running[0] if tenant is GOLD else running[-1]
        return spread_over([own])

    makes = {t.name: request_maker(PROXY, [t], "chat", MAX_TOKENS, WORDS) for t in (GOLD, BRONZE)}
    clients = {GOLD.name: through(GOLD), BRONZE.name: through(BRONZE)}
    loads = [
        Flood({tenant: (settings.streams, makes[tenant])}) for tenant in (GOLD.name, BRONZE.name)
    ]
    tasks = [
        asyncio.create_task(load.run(clients[tenant]))
        for load, tenant in zip(loads, (GOLD.name, BRONZE.name), strict=True)
    ]
    async with httpx.AsyncClient(timeout=10) as http:
        await asyncio.sleep(settings.warmup)
        before, start = await scrape(http, engines), time.monotonic()
        await asyncio.sleep(settings.window)
        after, end = await scrape(http, engines), time.monotonic()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    service = {tenant: served_between(before, after, tenant) for tenant in (GOLD.name, BRONZE.name)}
    errors = sum(1 for load in loads for result in load.results if not result.ok)
    return {
        "replicas": len(running),
        "layout": layout,
        "service": {tenant: round(value) for tenant, value in service.items()},
        "ratio": round(service[GOLD.name] / max(service[BRONZE.name], 1.0), 3),
        "service_per_s": round(sum(service.values()) / (end - start), 1),
        "errors": errors,
    }


# ---------------------------------------------------------------------- outage


def run_outage(settings: argparse.Namespace, logs: Path) -> dict[str, Any]:
    with (
        started_engines(2, flood_engine_options({}, "vtc"), None, logs) as engines,
        LocalStore() as store,
        gateways(
            2,
            [e.url for e in engines],
            [LIMITED],
            store,
            logs,
            {"concurrent": settings.limit_streams},
            64,
        ) as running,
    ):
        row = asyncio.run(measure_outage(settings, running, store))
    say(f"outage: {row['failed']} failed, back in {row['recovered_after_s']} s")
    return row


async def shared_up(http: httpx.AsyncClient, running: list[RunningProxy]) -> bool:
    for proxy in running:
        assert proxy.config is not None
        text = (await http.get(f"http://{HOST}:{proxy.config['admin']['port']}/metrics")).text
        if "fairpool_gateway_shared_state_up 1.0" not in text:
            return False
    return True


async def measure_outage(
    settings: argparse.Namespace, running: list[RunningProxy], store: LocalStore
) -> dict[str, Any]:
    make = request_maker(PROXY, [LIMITED], "chat", MAX_TOKENS, WORDS)
    load = Flood({LIMITED.name: (settings.limit_streams, make)})
    task = asyncio.create_task(load.run(spread_over(running)))
    third = settings.outage_seconds
    recovered: float | None = None
    async with httpx.AsyncClient(timeout=5) as http:
        await asyncio.sleep(third)
        await asyncio.to_thread(store.stop)
        await asyncio.sleep(third)
        await asyncio.to_thread(store.start)
        back = time.monotonic()
        while time.monotonic() < back + third:
            if await shared_up(http, running):
                recovered = round(time.monotonic() - back, 2)
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(max(0.0, back + third - time.monotonic()))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    failed = [r for r in load.results if not r.ok and r.status != 429]
    return {
        "seconds_each": third,
        "answered": sum(1 for r in load.results if r.ok),
        "refused_by_limits": sum(1 for r in load.results if r.status == 429),
        "failed": len(failed),
        "first_failures": sorted({f"{r.status} {r.error}" for r in failed})[:3],
        "recovered_after_s": recovered,
    }


# ---------------------------------------------------------------------- overhead

OVERHEAD_TENANTS = [Tenant("a"), Tenant("b")]
#: Limits every request is checked against, none of them reached.
GENEROUS = {"requestsPerMinute": 10_000_000, "tokensPerMinute": 10_000_000_000}


def run_overhead(settings: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    rows = []
    pin_self("0")
    options = EngineOptions(speedup=1000.0, memory_tokens=32_768)
    with started_engines(1, options, "0", logs) as engines:
        for shared in (False, True):
            with contextlib.ExitStack() as stack:
                store = stack.enter_context(LocalStore()) if shared else None
                (running,) = stack.enter_context(
                    gateways(1, [engines[0].url], OVERHEAD_TENANTS, store, logs, GENEROUS, 64, "1")
                )
                row = asyncio.run(measure_overhead(settings, running, engines))
            rows.append({"shared": shared, **row})
            say(
                f"overhead, shared={shared}: TTFT p50 {row['latency']['ttft']['p50_ms']:.2f} ms, "
                f"{row['max']['achieved_per_s']:.0f} req/s"
            )
    return rows


async def measure_overhead(
    settings: argparse.Namespace, running: RunningProxy, engines: list[Process]
) -> dict[str, Any]:
    make = request_maker(PROXY, OVERHEAD_TENANTS, "chat", 4, 8)
    client = sender(*running.targets[0])
    try:
        await open_loop_results(client, make, settings.rate, 3.0, seed=7)  # warm-up
        results = await open_loop_results(
            client, make, settings.rate, settings.overhead_seconds, seed=1
        )
        latency = latency_row(results, settings.overhead_seconds)
        before, started = Cpu.now(running, engines), time.perf_counter()
        results = await closed_loop_results(client, make, 32, settings.overhead_seconds / 2)
        elapsed = time.perf_counter() - started
        cpu = Cpu.now(running, engines).since(before)
    finally:
        await client.close()
    closed = {**latency_row(results, elapsed), **cpu}
    closed["req_per_s_per_gateway_core"] = (
        round(closed["achieved_per_s"] / closed["proxy_cpu_cores"])
        if closed["proxy_cpu_cores"]
        else None
    )
    return {"latency": latency, "max": closed}


# ---------------------------------------------------------------------- processes


def run_processes(settings: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    rows = []
    options = EngineOptions(speedup=1000.0, memory_tokens=32_768)
    with started_engines(1, options, None, logs) as engines:
        for processes in (1, 2):
            with gateways(
                1, [engines[0].url], OVERHEAD_TENANTS, None, logs, processes=processes
            ) as (running,):
                row = asyncio.run(measure_processes(settings, running, engines))
            rows.append({"processes": processes, **row})
            say(f"processes {processes}: {row['achieved_per_s']:.0f} req/s")
    for row in rows:
        row["vs_one"] = round(row["achieved_per_s"] / rows[0]["achieved_per_s"], 3)
    return rows


async def measure_processes(
    settings: argparse.Namespace, running: RunningProxy, engines: list[Process]
) -> dict[str, Any]:
    """Closed loop of `--process-streams` streams after a warm-up; the client opens a
    connection per stream, and the kernel spreads the connections over the processes."""
    make = request_maker(PROXY, OVERHEAD_TENANTS, "chat", 4, 8)
    streams = settings.process_streams
    return await closed_loop_row(running, engines, make, streams, 2.0, settings.overhead_seconds)


# ---------------------------------------------------------------------- report


def overhead_table(rows: list[dict[str, Any]], rate: float) -> list[str]:
    local = next(row for row in rows if not row["shared"])
    lines = [
        f"### What sharing state costs one gateway ({rate:g} req/s open loop; 32 streams)",
        "",
        "| state | TTFT p50 / p99 ms | total p50 / p99 ms | added p50 / p99 ms | errors "
        "| req/s (32 streams) | per gateway core | vs own state |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ttft, total = row["latency"]["ttft"], row["latency"]["total"]
        base = local["latency"]["ttft"]
        per_core = row["max"]["req_per_s_per_gateway_core"] or 0
        base_core = local["max"]["req_per_s_per_gateway_core"] or 1
        lines.append(
            f"| {'shared (Valkey)' if row['shared'] else 'its own'} | "
            f"{ttft['p50_ms']:.2f} / {ttft['p99_ms']:.2f} | "
            f"{total['p50_ms']:.2f} / {total['p99_ms']:.2f} | "
            f"{ttft['p50_ms'] - base['p50_ms']:+.2f} / {ttft['p99_ms'] - base['p99_ms']:+.2f} | "
            f"{row['latency']['errors'] + row['max']['errors']} | "
            f"{row['max']['achieved_per_s']:,.0f} | {per_core:,} | {per_core / base_core:.2f}× |"
        )
    return [*lines, ""]


def table(results: dict[str, Any]) -> str:
    lines = []
    outage = results.get("outage")
    if outage:
        back = outage["recovered_after_s"]
        lines += [
            f"### The shared state stopped for {outage['seconds_each']:g} s during a flood "
            "through 2 replicas",
            "",
            "| answered | refused by a limit | failed | shared again after the server's return |",
            "|---:|---:|---:|---:|",
            f"| {outage['answered']} | {outage['refused_by_limits']} | {outage['failed']} | "
            + (f"{back:g} s |" if back is not None else "not within the run |"),
            "",
        ]
    if results.get("overhead"):
        lines += overhead_table(results["overhead"], results["settings"]["rate"])
    limits = results.get("limits") or []
    if limits:
        lines += [
            "### A tenant's tokens per minute through 4 replicas",
            "",
            "| state | admitted | refused | tokens counted in the run | vs the limit |",
            "|---|---:|---:|---:|---:|",
        ]
        for row in limits:
            state = "shared (Valkey)" if row["shared"] else "each replica its own"
            lines.append(
                f"| {state} | {row['admitted']} | {row['refused']} | "
                f"{row['reserved_tokens']:,} of {row['limit_tokens_per_minute']:,} | "
                f"{row['vs_limit']:.2f}× |"
            )
        lines.append("")
    processes = results.get("processes") or []
    if processes:
        lines += [
            "### `fairpool gateway --workers N`: one gateway, N processes, closed loop "
            f"({results['settings']['process_streams']} streams), "
            "one engine-sim at `--speedup 1000`, all on this machine's cores",
            "",
            "| processes | req/s | vs one | errors | total p50 / p99 ms | gateway CPU "
            "| engine CPU | load generator CPU |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in processes:
            lines.append(
                f"| {row['processes']} | {row['achieved_per_s']:,.0f} | {row['vs_one']:.2f}× | "
                f"{row['errors']} | {row['total']['p50_ms']:.2f} / {row['total']['p99_ms']:.2f} "
                f"| {row['proxy_cpu_cores']:.2f} | {row['worker_cpu_cores']:.2f} | "
                f"{row['client_cpu_cores']:.2f} |"
            )
        lines.append("")
    weights = results.get("weights") or []
    if weights:
        lines += [
            "### Weights gold 4 : bronze 1, both flooding",
            "",
            "| setup | replicas | traffic | gold : bronze (engines' service) | service/s "
            "| vs one replica | errors |",
            "|---|---:|---|---:|---:|---:|---:|",
        ]
        for row in weights:
            traffic = "each tenant through its own" if row["layout"] == "skewed" else "spread"
            if row["replicas"] == 1:
                traffic = "one gateway"
            lines.append(
                f"| {SETUPS[row['setup']].label} | {row['replicas']} | {traffic} "
                f"| {row['ratio']:.2f} : 1 | {row['service_per_s']:,.0f} "
                f"| {row['throughput_vs_one']:.2f}× | {row['errors']} |"
            )
        lines.append("")
    return "\n".join(lines)


def setups(text: str) -> list[str]:
    """`--engines`: known setup names, separated by commas."""
    names = text.split(",")
    unknown = [name for name in names if name not in SETUPS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown setup {unknown[0]!r}: one of {', '.join(SETUPS)}"
        )
    return names


ALL_CASES = {"overhead", "limits", "outage", "weights", "processes"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        default=",".join(sorted(ALL_CASES)),
        help="of overhead, limits, outage, weights, processes; a part of them is recorded "
        "as bench/results/replicas-CASES",
    )
    parser.add_argument("--outage-seconds", type=float, default=10.0, help="each third")
    parser.add_argument("--rate", type=float, default=200.0, help="overhead: requests/s")
    parser.add_argument("--overhead-seconds", type=float, default=20.0)
    parser.add_argument("--tpm", type=int, default=20_000, help="the limited tenant's limit")
    parser.add_argument("--limit-streams", type=int, default=16)
    parser.add_argument("--limit-seconds", type=float, default=20.0)
    parser.add_argument("--replicas", default="1,2,4", help="gateway replica counts")
    parser.add_argument("--streams", type=int, default=48, help="streams per tenant")
    parser.add_argument(
        "--engines",
        type=setups,
        default=list(SETUPS),
        help="weights: the setups to run, of fair, stock, alone",
    )
    parser.add_argument(
        "--process-streams", type=int, default=32, help="processes: closed-loop streams (32)"
    )
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument(
        "--max-outstanding",
        type=int,
        default=GATEWAY_MAX_OUTSTANDING,
        help="the gateways' saturation cap per worker (8, the flood benchmark's); another "
        "value records bench/results/replicas-outstanding-N",
    )
    parser.add_argument("--quick", action="store_true", help="short runs, no record")
    settings = parser.parse_args(argv)
    settings.replicas = [int(value) for value in settings.replicas.split(",")]
    if settings.quick:
        settings.limit_seconds, settings.warmup, settings.window = 5.0, 3.0, 5.0
        settings.overhead_seconds = 4.0
        settings.outage_seconds = 3.0
    cases = set(settings.cases.split(","))
    if cases - ALL_CASES:
        parser.error(f"--cases: {', '.join(sorted(cases - ALL_CASES))} is not a case")
    logs = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    results: dict[str, Any] = {"settings": {k: v for k, v in vars(settings).items()}}
    try:
        if "overhead" in cases:
            results["overhead"] = run_overhead(settings, logs)
        if "limits" in cases:
            results["limits"] = run_limits(settings, logs)
        if "outage" in cases:
            results["outage"] = run_outage(settings, logs)
        if "weights" in cases:
            results["weights"] = run_weights(settings, logs)
        if "processes" in cases:
            results["processes"] = run_processes(settings, logs)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    print(table(results))
    if not settings.quick:
        name = "replicas"
        if cases != ALL_CASES:  # a part of the run keeps its own record
            name += "-" + "-".join(sorted(cases))
        if settings.max_outstanding != GATEWAY_MAX_OUTSTANDING:
            name += f"-outstanding-{settings.max_outstanding}"
        write_results(name, json.loads(json.dumps(results)), table(results))


if __name__ == "__main__":
    main()
