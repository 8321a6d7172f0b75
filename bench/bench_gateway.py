"""The gateway against SGLang's router and vLLM's router: added latency, throughput, fairness.

Goal (issue): the gateway adds at most 1 ms p99 to a streamed request at 500 requests/s on
one core; its most requests/s on one core; and the same workload through the SGLang
router and vllm-router on the same machine, side by side, with per-tenant fairness on a
two-tenant flood.

Everything runs on this machine, pinned with `taskset -c`: the proxy under test alone on
`--proxy-cores` (default core 1), the `fairpool engine-sim` workers on `--worker-cores`
and this process, the load generator, on `--load-cores` (both default core 0). The
proxies are the table `routers.PROXIES` (`direct`, `sglang-router`, `vllm-router`,
`fairpool`); an entry that cannot run here (no `.venv-routers`, no `fairpool gateway`)
is skipped with the reason, and the results say so.

Four measurements, each for every proxy:

1. **Added latency** (`latency`). A fresh worker for each proxy (engine-sim at
   `--speedup 1000`, so model time is negligible and what is left is the HTTP path;
   32,768 tokens of KV, see `LATENCY_MEMORY_TOKENS`); open-loop Poisson arrivals for
   `--duration` (30) seconds after a 5-second warm-up, at each rate of `--rate`: 500/s,
   the issue's, and 200/s, where the shared core is a third busy and the quantiles are
   steady. The same seeded arrival times and requests for every proxy: streamed chat
   completions, `--max-tokens` (4) output tokens, a shared 104-token system prompt, two
   tenants. TTFT is the first body byte, total the stream's `[DONE]`, both from just
   before the request is written on an idle keep-alive connection (the client opens
   more as needed). Added latency is the proxy's p50 (p99) minus the direct run's p50
   (p99): the difference of the distributions' quantiles, not of paired requests. The
   direct baseline runs first and once more last; the second's difference from the first
   is the noise of the numbers above it. The worker and the load generator share a core
   (`worker + client CPU`); a streamed request costs the worker about 1.2 ms of CPU and
   the client 0.5 ms, so at 500/s that core is two thirds busy, and its queueing shows
   in every p99, the baseline's included.
2. **Most requests/s** (`max`). Closed loop, `--concurrency` (32) streams back to back,
   4 output tokens, through the same single worker. The worker and client on the other
   core limit every fast proxy, so the table also gives the proxy's CPU and requests/s
   per proxy core = requests/s / proxy CPU: what one core of it would carry at that cost
   per request.
3. **Fairness** (`fairness`). `--flood-workers` (4) fresh engine-sim workers at real
   time (`--speedup 1`, `--flood-policy`, default DLPM) with 2,048 tokens of KV each, so
   queues form in the engines; a flooding tenant keeps `--flood` (96) streams open, a
   light one `--light` (24), both closed loop, each with its own 110-token system
   prompt, a 120-word question and 64 output tokens. After 15 seconds, a window of
   `--flood-window` (40) seconds: each tenant's share of service (1 × uncached prompt +
   2 × output tokens) from the engines' own counters summed over the workers (or, when
   the engines did not see the tenants, from the clients' usage counted pro rata over
   the window), where each tenant's service went (per worker), the light tenant's TTFT
   and total latency, and whether both stayed backlogged (the share of once-a-second
   samples in which a tenant had fewer requests running in the engines than streams
   open). Cases: every proxy with equal weights on chat completions; SGLang's router also
   on completions (it drops `vllm_xargs` from chat requests, see `routers.py`); fairpool
   also at 1:2 (light 2), with the same weights in the engines' scheduler configuration.
   Through SGLang's router and vllm-router the tenant reaches the engines only as the
   body's `vllm_xargs` tag, so the engines are fair among what each of them receives;
   through fairpool the gateway maps each tenant's API key to it.

4. **Added latency vs concurrency** (`sweep`; a run of its own, `--cases sweep`, recorded
   as `gateway-sweep`). The latency case's fresh worker and requests (streamed chat,
   `--max-tokens` output tokens), closed loops of 1, 4, 16 and 64 streams (`--sweep`) for
   10 seconds each after a second's warm-up: TTFT and total p50/p99, and what the proxy
   adds to the direct run's quantiles at the same concurrency.

The load generator is `fairpool load`'s (`fairpool_cli.load`): its `Sender` (HTTP/1.1 on
asyncio protocols, reading only the first byte, the end and the usage of a stream),
`open_loop` at seeded Poisson times and `closed_loop`, with the garbage collector off.
`--calibrate` measures its CPU per streamed request, direct to a worker. The client
shares a core with the worker, so its CPU is the worker's loss: httpx cost three times
as much per streamed request (1.3 against 0.5 ms at 200/s, measured when the benchmark
still had an httpx client to compare), and at 400/s worker and httpx client together
no longer kept up (TTFT p99 5 s).

Run: `python bench/bench_gateway.py` (about 15 minutes); `--quick` for a smoke run that
records nothing; `--only NAME[,NAME...]` (`NAME:POLICY` for another routing policy)
and `--cases latency,max,fairness` for a part (recorded, and labelled partial);
`--new-connections` sends every request on a new connection (`Connection: close`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import write_results
from routers import (
    MODEL,
    PROXIES,
    ROOT,
    ROUTERS_VENV,
    EngineOptions,
    Process,
    Proxy,
    RunningProxy,
    StartError,
    Tenant,
    get_proxy,
    running_proxy,
    start_engines,
)

from fairpool.sim.metrics import percentile
from fairpool_cli.load import (
    OutgoingRequest,
    RequestResult,
    Sender,
    closed_loop,
    now,
    open_loop,
    poisson,
)

GOAL_ADDED_P99_MS = 1.0
GOAL_RATE = 500.0
#: What a run measures unless `--cases` says otherwise (the sweep is its own run).
DEFAULT_CASES = ("latency", "max", "fairness")
SYSTEM = "You are a helpful assistant who answers questions about the report below. " * 8
VOCABULARY = (
    "report revenue quarter growth margin region customer product market share cost "
    "forecast risk supply demand price team plan launch budget audit policy review "
    "service contract partner channel brand survey target metric trend"
)
WORDS = VOCABULARY.split()
LATENCY_TENANTS = [Tenant("tenant-a"), Tenant("tenant-b")]
#: the latency worker's KV memory, small, so that its prefix cache (and the heap that
#: its garbage collector walks) stops growing early in the warm-up: the profile's 400,000
#: tokens would still be filling at the end of the last rate
LATENCY_MEMORY_TOKENS = 32768
FLOOD_MEMORY_TOKENS = 2048
FLOOD_MAX_MODEL_LEN = 1024
FLOOD_MAX_TOKENS = 64
FLOOD_QUESTION_WORDS = 120


@dataclass
class Settings:
    """What one run measures (from the command line)."""

    rates: list[float] = field(default_factory=lambda: [GOAL_RATE, 200.0])
    duration: float = 30.0
    warmup: float = 5.0
    max_tokens: int = 4
    latency_memory_tokens: int | None = LATENCY_MEMORY_TOKENS
    concurrency: int = 32
    max_duration: float = 15.0
    #: the concurrency sweep: closed loops of these many streams, `sweep_duration` s each
    sweep: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    sweep_duration: float = 10.0
    max_tokens_max: int = 4
    flood_workers: int = 4
    flood: int = 96
    light: int = 24
    flood_warmup: float = 15.0
    flood_window: float = 40.0
    #: every fairness case on this endpoint (None: chat, and completions too for SGLang)
    flood_endpoint: str | None = None
    flood_policy: str = "dlpm"
    new_connections: bool = False
    proxy_cores: str | None = "1"
    worker_cores: str | None = "0"
    load_cores: str | None = "0"
    quick: bool = False
    keep_logs: bool = False
    logs: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench-gateway-")))


# ---------------------------------------------------------------------- requests

MakeRequest = Callable[[int], OutgoingRequest]


def question(number: int, words: int) -> str:
    draw = random.Random(number)
    return f"Question {number}: " + " ".join(draw.choice(WORDS) for _ in range(words)) + "?"


def request_maker(
    proxy: Proxy,
    tenants: list[Tenant],
    endpoint: str,
    max_tokens: int,
    words: int,
    system: Callable[[Tenant], str] = lambda tenant: SYSTEM,
    new_connections: bool = False,
) -> MakeRequest:
    """Requests `number` = 0, 1, ... of the tenants in turn, as `proxy` wants them (each
    on a new connection, `Connection: close`, if `new_connections`)."""
    fields = {tenant.name: proxy.tenant_fields(tenant) for tenant in tenants}
    if new_connections:
        fields = {
            name: (extra, {**headers, "Connection": "close"})
            for name, (extra, headers) in fields.items()
        }

    def make(number: int) -> OutgoingRequest:
        tenant = tenants[number % len(tenants)]
        extra, headers = fields[tenant.name]
        body: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **extra,
        }
        if endpoint == "chat":
            body["messages"] = [
                {"role": "system", "content": system(tenant)},
                {"role": "user", "content": question(number, words)},
            ]
        else:
            body["prompt"] = f"{system(tenant)}\n{question(number, words)}"
        return OutgoingRequest(tenant.name, endpoint, json.dumps(body).encode(), headers)

    return make


def sender(host: str, port: int) -> Sender:
    """The load generator's client of one target: reads a stream's first byte, its end
    and its usage, not every event."""
    return Sender(f"http://{host}:{port}/v1", parse_events=False)


async def open_loop_results(
    client: Sender, make: MakeRequest, rate: float, duration: float, seed: int
) -> list[RequestResult]:
    """Poisson arrivals at `rate` per second for `duration` seconds, each request in its
    own task; every result, once the last request has ended."""
    results: list[RequestResult] = []

    async def one(number: int, due: float) -> None:
        results.append(await client.send(make(number), due))

    start = now()
    await open_loop(one, poisson(rate, seed, start, start + duration))
    return results


async def closed_loop_results(
    client: Sender, make: MakeRequest, concurrency: int, duration: float
) -> list[RequestResult]:
    """`concurrency` requests in flight for `duration` seconds (starts spread over the
    first tenth of a second); the results of the requests that started in that time."""
    end = now() + duration
    numbers = itertools.count()
    results: list[RequestResult] = []

    async def one(_: int) -> None:
        results.append(await client.send(make(next(numbers))))

    await closed_loop(one, concurrency, lambda: now() < end, stagger=0.1)
    return results


@dataclass
class Flood:
    """Closed-loop streams of several tenants at once, each tenant with its concurrency
    and each stream with its own client; every request that ends lands in `results`
    until the flood is cancelled."""

    streams: dict[str, tuple[int, MakeRequest]]
    results: list[RequestResult] = field(default_factory=list)

    async def run(self, client_for: Callable[[int], Sender]) -> None:
        """Run until cancelled; `client_for(index)` gives each tenant's stream `index`
        its client. Stream `index` of a tenant with concurrency C sends its requests
        number index, index + C, ..., starting after 2 × index / C seconds."""

        async def tenant_streams(concurrency: int, make: MakeRequest) -> None:
            clients = [client_for(index) for index in range(concurrency)]
            numbers = [itertools.count(index, concurrency) for index in range(concurrency)]

            async def one(index: int) -> None:
                request = make(next(numbers[index]))
                self.results.append(await clients[index].send(request))

            try:
                await closed_loop(one, concurrency, stagger=2.0)
            finally:
                for client in clients:
                    await client.close()

        async with asyncio.TaskGroup() as group:
            for concurrency, make in self.streams.values():
                group.create_task(tenant_streams(concurrency, make))


def summary_ms(values: list[float | None]) -> dict[str, float]:
    """p50/p90/p99/max of seconds (nearest rank), in milliseconds; 0 for none."""
    known = [value for value in values if value is not None]
    return {
        f"{name}_ms": round(1000 * (percentile(known, fraction) or 0.0), 3)
        for name, fraction in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
    }


# ---------------------------------------------------------------------- measuring


@dataclass
class Cpu:
    """CPU seconds of the proxy, the workers, this process and the whole machine."""

    proxy: float
    workers: float
    client: float
    machine: float
    steal: float
    wall: float

    @classmethod
    def now(cls, running: RunningProxy | None, engines: list[Process]) -> Cpu:
        machine, steal = machine_cpu()
        return cls(
            running.cpu() if running is not None else 0.0,
            sum(engine.cpu() for engine in engines),
            time.process_time(),
            machine,
            steal,
            time.perf_counter(),
        )

    def since(self, before: Cpu) -> dict[str, float]:
        """Cores busy in between; `other`: the machine's busy time that is none of ours
        (other programs, and kernel work not charged to a process), `steal`: time the
        hypervisor gave to other guests."""
        wall = self.wall - before.wall
        ours = (
            self.proxy - before.proxy + self.workers - before.workers + self.client - before.client
        )
        return {
            "proxy_cpu_cores": round((self.proxy - before.proxy) / wall, 3),
            "worker_cpu_cores": round((self.workers - before.workers) / wall, 3),
            "client_cpu_cores": round((self.client - before.client) / wall, 3),
            "other_cpu_cores": round((self.machine - before.machine - ours) / wall, 3),
            "steal_cores": round((self.steal - before.steal) / wall, 3),
        }


def machine_cpu() -> tuple[float, float]:
    """Busy and stolen CPU seconds of the whole machine since boot (Linux /proc/stat)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    steal = fields[7] if len(fields) > 7 else 0
    guest = sum(fields[8:10])  # already counted in user and nice
    return (sum(fields) - guest - idle - steal) / tick, steal / tick


def quiet_check(seconds: float = 2.0) -> float:
    """Cores busy on this machine while the benchmark does nothing (should be ~0)."""
    before = Cpu.now(None, [])
    time.sleep(seconds)
    return Cpu.now(None, []).since(before)["other_cpu_cores"]


def latency_row(results: list[RequestResult], duration: float) -> dict[str, Any]:
    """TTFT is the first byte of the answer's body (the first chunk of a stream goes out
    with the first token), total the end of the stream."""
    ok = [result for result in results if result.ok]
    errors = [f"{result.error}: {result.detail}" for result in results if not result.ok]
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(errors),
        "first_errors": sorted(set(errors))[:3],
        "achieved_per_s": round(len(ok) / duration, 1),
        "ttft": summary_ms([result.ttfb for result in ok]),
        "total": summary_ms([result.latency for result in ok]),
        "client_lag": summary_ms([result.lag for result in results]),
        "completion_tokens_mean": round(
            statistics.fmean(result.completion_tokens for result in ok), 2
        )
        if ok
        else 0,
    }


async def measure_latency(
    running: RunningProxy, engines: list[Process], settings: Settings, rate: float
) -> dict[str, Any]:
    """Open-loop Poisson arrivals at `rate` through `running` (one target)."""
    client = sender(*running.targets[0])
    make = request_maker(
        running.proxy,
        LATENCY_TENANTS,
        "chat",
        settings.max_tokens,
        8,
        new_connections=settings.new_connections,
    )
    try:
        if settings.warmup:
            await open_loop_results(client, make, rate, settings.warmup, seed=7)
        before = Cpu.now(running, engines)
        results = await open_loop_results(client, make, rate, settings.duration, seed=1)
        cpu = Cpu.now(running, engines).since(before)
    finally:
        await client.close()
    return {"rate": rate, **latency_row(results, settings.duration), **cpu}


async def measure_max(
    running: RunningProxy, engines: list[Process], settings: Settings
) -> dict[str, Any]:
    """Closed loop with `settings.concurrency` streams through `running`."""
    make = request_maker(
        running.proxy,
        LATENCY_TENANTS,
        "chat",
        settings.max_tokens_max,
        8,
        new_connections=settings.new_connections,
    )
    row = await closed_loop_row(
        running,
        engines,
        make,
        settings.concurrency,
        warmup=min(3.0, settings.max_duration),
        duration=settings.max_duration,
    )
    row["req_per_s_per_proxy_core"] = (
        round(row["achieved_per_s"] / row["proxy_cpu_cores"]) if row["proxy_cpu_cores"] else None
    )
    return row


async def measure_sweep(
    running: RunningProxy, engines: list[Process], settings: Settings, concurrency: int
) -> dict[str, Any]:
    """Closed loop with `concurrency` streams through `running`, the latency case's
    requests (streamed chat, `settings.max_tokens` output tokens)."""
    make = request_maker(running.proxy, LATENCY_TENANTS, "chat", settings.max_tokens, 8)
    return await closed_loop_row(
        running,
        engines,
        make,
        concurrency,
        warmup=min(1.0, settings.sweep_duration),
        duration=settings.sweep_duration,
    )


async def closed_loop_row(
    running: RunningProxy,
    engines: list[Process],
    make: MakeRequest,
    concurrency: int,
    warmup: float,
    duration: float,
) -> dict[str, Any]:
    """`concurrency` streams through `running` for `warmup` seconds, then measured for
    `duration`: the latency row and the CPU each part used."""
    client = sender(*running.targets[0])
    try:
        await closed_loop_results(client, make, concurrency, warmup)
        before = Cpu.now(running, engines)
        started = now()
        results = await closed_loop_results(client, make, concurrency, duration)
        elapsed = now() - started
        cpu = Cpu.now(running, engines).since(before)
    finally:
        await client.close()
    return {"concurrency": concurrency, **latency_row(results, elapsed), **cpu}


def add_differences(rows: list[dict[str, Any]], key: str) -> None:
    """Each proxy's row gets `added_ms`: its p50 and p99 minus the first direct run's at
    the same `key` (rate, or concurrency)."""
    for row in rows:
        base = next(
            (
                other
                for other in rows
                if other["proxy"] == "direct" and other.get(key) == row.get(key)
            ),
            None,
        )
        if base is not None and "ttft" in row and row is not base:
            row["added_ms"] = {
                f"{metric}_{q}": round(row[metric][f"{q}_ms"] - base[metric][f"{q}_ms"], 3)
                for metric in ("ttft", "total")
                for q in ("p50", "p99")
            }


# ---------------------------------------------------------------------- fairness


Scrape = dict[str, dict[str, list[float]]]


async def scrape(http: httpx.AsyncClient, engines: list[Process]) -> Scrape:
    """Per-tenant engine metrics, one value per worker: {metric: {tenant: [value, ...]}}."""
    wanted = {
        "fairpool_engine_tenant_service_total": "service",
        "fairpool_engine_tenant_requests_running": "running",
        "fairpool_engine_tenant_requests_waiting": "waiting",
    }
    values: Scrape = {name: {} for name in wanted.values()}
    for index, engine in enumerate(engines):
        text = (await http.get(f"{engine.url}/metrics")).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = wanted.get(sample.name)
                if name is not None:
                    tenant = sample.labels.get("tenant", "?")
                    per_worker = values[name].setdefault(tenant, [0.0] * len(engines))
                    per_worker[index] += sample.value
    return values


def served_between(before: Scrape, after: Scrape, tenant: str) -> float:
    """`tenant`'s service in the engines between two scrapes, summed over the workers."""
    return sum(after["service"].get(tenant, [0.0])) - sum(before["service"].get(tenant, [0.0]))


def client_service(
    results: list[RequestResult], start: float, end: float
) -> dict[str, dict[str, float]]:
    """Per tenant, from the clients' usage: service and output tokens in [start, end],
    prompts charged when their first token came, outputs pro rata over the stream."""
    totals: dict[str, dict[str, float]] = {}
    for result in results:
        first, ended = result.first_byte, result.ended
        if not result.ok or first is None or ended is None:
            continue
        mine = totals.setdefault(result.tenant, {"service": 0.0, "output": 0.0, "requests": 0})
        if start <= first < end:
            mine["service"] += result.prompt_tokens - result.cached_tokens
        span = ended - first
        overlap = min(end, ended) - max(start, first)
        fraction = max(0.0, overlap) / span if span > 0 else float(start <= ended < end)
        mine["output"] += result.completion_tokens * fraction
        mine["service"] += 2 * result.completion_tokens * fraction
        if start <= ended < end:
            mine["requests"] += 1
    return totals


def shares(values: dict[str, float]) -> dict[str, float]:
    total = sum(values.values())
    return {key: round(value / total, 4) if total else 0.0 for key, value in values.items()}


async def measure_fairness(
    running: RunningProxy,
    engines: list[Process],
    tenants: list[Tenant],
    endpoint: str,
    settings: Settings,
) -> dict[str, Any]:
    """The two-tenant flood through `running`; shares of service while both are backlogged."""
    flood, light = tenants
    streams = {flood.name: settings.flood, light.name: settings.light}
    flood_run = Flood(
        {
            tenant.name: (
                streams[tenant.name],
                request_maker(
                    running.proxy,
                    [tenant],
                    endpoint,
                    FLOOD_MAX_TOKENS,
                    FLOOD_QUESTION_WORDS,
                    lambda tenant: f"You answer for {tenant.name}. " + SYSTEM,
                    settings.new_connections,
                ),
            )
            for tenant in tenants
        }
    )

    def client_for(index: int) -> Sender:
        return sender(*running.targets[index % len(running.targets)])

    task = asyncio.create_task(flood_run.run(client_for))
    occupancy: list[Scrape] = []
    async with httpx.AsyncClient(timeout=10) as http:
        try:
            await asyncio.sleep(settings.flood_warmup)
            before_cpu = Cpu.now(running, engines)
            before, start = await scrape(http, engines), now()
            end = start + settings.flood_window
            while now() < end:
                await asyncio.sleep(min(1.0, max(0.0, end - now())))
                occupancy.append(await scrape(http, engines))
            after, end = await scrape(http, engines), now()
            cpu = Cpu.now(running, engines).since(before_cpu)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    by_worker = {
        tenant: [
            value - old
            for value, old in zip(
                values, before["service"].get(tenant, [0.0] * len(values)), strict=True
            )
        ]
        for tenant, values in after["service"].items()
    }
    by_worker = {tenant: values for tenant, values in by_worker.items() if sum(values) > 0}
    engine_service = {tenant: sum(values) for tenant, values in by_worker.items()}
    client = client_service(flood_run.results, start, end)
    per_tenant: dict[str, Any] = {}
    for tenant in tenants:
        mine = [
            result
            for result in flood_run.results
            if result.tenant == tenant.name and result.ok and start <= result.started < end
        ]
        seen = tenant.name in engine_service
        running_counts = [sum(snap["running"].get(tenant.name, [])) for snap in occupancy]
        waiting_counts = [sum(snap["waiting"].get(tenant.name, [])) for snap in occupancy]
        if not seen:
            running_counts = waiting_counts = []
        per_tenant[tenant.name] = {
            "weight": tenant.weight,
            "streams": streams[tenant.name],
            "requests_done": int(client.get(tenant.name, {}).get("requests", 0)),
            "errors": sum(
                1
                for result in flood_run.results
                if result.tenant == tenant.name and not result.ok and start <= result.started < end
            ),
            "ttft": summary_ms([result.ttfb for result in mine]),
            "total": summary_ms([result.latency for result in mine]),
            "engine_running_mean": round(statistics.fmean(running_counts), 1)
            if running_counts
            else None,
            "engine_waiting_mean": round(statistics.fmean(waiting_counts), 1)
            if waiting_counts
            else None,
            "backlogged": round(
                sum(1 for count in running_counts if count < streams[tenant.name])
                / len(running_counts),
                2,
            )
            if running_counts
            else None,
        }
    client_service_share = shares({name: values["service"] for name, values in client.items()})
    client_output_share = shares({name: values["output"] for name, values in client.items()})
    entitled = {
        tenant.name: tenant.weight / sum(other.weight for other in tenants) for tenant in tenants
    }
    engine_share = shares(engine_service)
    measured = (
        engine_share if all(tenant.name in engine_share for tenant in tenants) else None
    ) or client_service_share
    return {
        "endpoint": endpoint,
        "workers": len(engines),
        "window_s": round(end - start, 1),
        "entitled_share": {name: round(value, 4) for name, value in entitled.items()},
        "service_share": {name: measured.get(name, 0.0) for name in entitled},
        "service_share_source": "engines" if measured is engine_share else "client",
        "engine_service_share": engine_share,
        "engine_service_by_worker": {
            tenant: [round(value / sum(values), 3) for value in values]
            for tenant, values in by_worker.items()
        },
        "client_service_share": client_service_share,
        "client_output_share": client_output_share,
        "tenants": per_tenant,
        **cpu,
    }


# ---------------------------------------------------------------------- the runs


def latency_engine_options(settings: Settings) -> EngineOptions:
    return EngineOptions(speedup=1000.0, memory_tokens=settings.latency_memory_tokens)


def flood_engine_options(weights: dict[str, float], policy: str) -> EngineOptions:
    return EngineOptions(
        speedup=1.0,
        policy=policy,
        memory_tokens=FLOOD_MEMORY_TOKENS,
        max_model_len=FLOOD_MAX_MODEL_LEN,
        weights=weights,
    )


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_latency_and_max(
    proxies: list[Proxy], settings: Settings, cases: set[str]
) -> dict[str, list[dict[str, Any]]]:
    """A fresh worker for each proxy (same state for all); `direct` first and again last."""
    rows: dict[str, list[dict[str, Any]]] = {"latency": [], "max": [], "sweep": []}
    order = [PROXIES["direct"], *[p for p in proxies if p.name != "direct"], PROXIES["direct"]]
    for index, proxy in enumerate(order):
        label = "direct (again)" if index == len(order) - 1 else proxy.label
        say(f"{label}: starting")
        engines = start_engines(
            1, latency_engine_options(settings), settings.worker_cores, settings.logs
        )
        try:
            with running_proxy(
                proxy, [engines[0].url], LATENCY_TENANTS, settings.proxy_cores, settings.logs
            ) as running:
                for rate in settings.rates if "latency" in cases else []:
                    say(f"{label}: {rate:g} req/s for {settings.duration:g} s")
                    row = asyncio.run(measure_latency(running, engines, settings, rate))
                    rows["latency"].append({"proxy": label, **row})
                    say(f"  {brief(row)}")
                for concurrency in settings.sweep if "sweep" in cases else []:
                    say(f"{label}: closed loop, {concurrency} streams")
                    row = asyncio.run(measure_sweep(running, engines, settings, concurrency))
                    rows["sweep"].append({"proxy": label, **row})
                    say(f"  {brief(row)}")
                if "max" in cases and index < len(order) - 1:
                    say(f"{label}: closed loop, {settings.concurrency} streams")
                    row = asyncio.run(measure_max(running, engines, settings))
                    rows["max"].append({"proxy": label, **row})
                    say(f"  {brief(row)}")
        except StartError as error:
            say(f"{label}: did not start: {error}")
            rows["latency"].append({"proxy": label, "failed": str(error)[:2000]})
        finally:
            for engine in engines:
                engine.stop()
    add_differences(rows["latency"], "rate")
    add_differences(rows["sweep"], "concurrency")
    return rows


def fairness_cases(
    proxies: list[Proxy], settings: Settings
) -> list[tuple[Proxy, list[Tenant], str]]:
    """Every proxy with equal weights on chat; fairpool also at 1:2; SGLang's router also
    on completions, the endpoint through which `vllm_xargs` reaches the engines."""
    equal = [Tenant("flood"), Tenant("light")]
    cases: list[tuple[Proxy, list[Tenant], str]] = []
    for proxy in proxies:
        cases.append((proxy, equal, settings.flood_endpoint or "chat"))
        if proxy.name == "sglang-router" and settings.flood_endpoint is None:
            cases.append((proxy, equal, "completions"))
        if proxy.name == "fairpool":
            cases.append(
                (
                    proxy,
                    [Tenant("flood", 1.0), Tenant("light", 2.0)],
                    settings.flood_endpoint or "chat",
                )
            )
    return cases


def run_fairness(proxies: list[Proxy], settings: Settings) -> list[dict[str, Any]]:
    """Each case with fresh workers."""
    rows: list[dict[str, Any]] = []
    for proxy, tenants, endpoint in fairness_cases(proxies, settings):
        weights = {tenant.name: tenant.weight for tenant in tenants}
        label = f"{proxy.label} (flood:light {weights['flood']:g}:{weights['light']:g}, {endpoint})"
        say(
            f"{label}: {settings.flood_workers} workers, flood {settings.flood} streams, "
            f"light {settings.light}"
        )
        engine_weights = weights if len(set(weights.values())) > 1 else {}
        engines = start_engines(
            settings.flood_workers,
            flood_engine_options(engine_weights, settings.flood_policy),
            settings.worker_cores,
            settings.logs,
        )
        try:
            with running_proxy(
                proxy,
                [engine.url for engine in engines],
                tenants,
                settings.proxy_cores,
                settings.logs,
            ) as running:
                row = asyncio.run(measure_fairness(running, engines, tenants, endpoint, settings))
                rows.append({"proxy": proxy.label, "weights": weights, **row})
                say(
                    f"  share {row['service_share']} ({row['service_share_source']}), "
                    f"engines saw {row['engine_service_share']}, client output share "
                    f"{row['client_output_share']}"
                )
                for name, tenant in row["tenants"].items():
                    say(
                        f"  {name}: {tenant['requests_done']} done, running "
                        f"{tenant['engine_running_mean']}, waiting {tenant['engine_waiting_mean']} "
                        f"(engine means), total {tenant['total']}"
                    )
        except StartError as error:
            say(f"{label}: did not start: {error}")
            rows.append({"proxy": proxy.label, "weights": weights, "failed": str(error)[:2000]})
        finally:
            for engine in engines:
                engine.stop()
    return rows


def brief(row: dict[str, Any]) -> str:
    return (
        f"{row['achieved_per_s']} req/s ok, {row['errors']} errors, TTFT p50/p99 "
        f"{row['ttft']['p50_ms']}/{row['ttft']['p99_ms']} ms, total "
        f"{row['total']['p50_ms']}/{row['total']['p99_ms']} ms, proxy "
        f"{row['proxy_cpu_cores']} cores, workers {row['worker_cpu_cores']}, client "
        f"{row['client_cpu_cores']}, others {row['other_cpu_cores']}, lag p99 "
        f"{row['client_lag']['p99_ms']} ms" + (f" {row['first_errors']}" if row["errors"] else "")
    )


def calibrate(settings: Settings) -> None:
    """The load generator, direct to a fresh worker at each rate: its CPU per request."""
    options = latency_engine_options(settings)
    engines = start_engines(1, options, settings.worker_cores, settings.logs)
    try:
        with running_proxy(
            PROXIES["direct"], [engines[0].url], LATENCY_TENANTS, None, settings.logs
        ) as running:
            for rate in settings.rates:
                row = asyncio.run(measure_latency(running, engines, settings, rate))
                cpu = row["client_cpu_cores"] * settings.duration / max(1, row["requests"])
                say(f"{rate:g} req/s: {1e6 * cpu:.0f} µs client CPU per request")
                say(f"  {brief(row)}")
    finally:
        for engine in engines:
            engine.stop()


# ---------------------------------------------------------------------- report


def ms(row: dict[str, Any], metric: str) -> str:
    return f"{row[metric]['p50_ms']:.2f} / {row[metric]['p99_ms']:.2f}"


def added_cells(row: dict[str, Any]) -> tuple[str, str]:
    """The added TTFT and total latency cells (p50 / p99) of a row, or dashes."""
    added = row.get("added_ms")
    if not added:
        return "—", "—"
    return (
        f"{added['ttft_p50']:+.2f} / {added['ttft_p99']:+.2f}",
        f"{added['total_p50']:+.2f} / **{added['total_p99']:+.2f}**",
    )


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []
    latency = results.get("latency") or []
    for rate in results["settings"]["rates"] if latency else []:
        lines += [
            f"### Added latency: {rate:g} req/s, Poisson, streamed chat, "
            f"{results['settings']['max_tokens']} output tokens, one worker",
            "",
            "| proxy | req/s done | errors | TTFT p50 / p99 ms | total p50 / p99 ms "
            "| added TTFT p50 / p99 ms | added total p50 / p99 ms | proxy CPU | "
            "worker + client CPU | client lag p99 | other CPU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in latency:
            if "failed" in row:
                if rate == results["settings"]["rates"][0]:
                    lines.append(f"| {row['proxy']} | did not start |" + " |" * 9)
                continue
            if row["rate"] != rate:
                continue
            added_ttft, added_total = added_cells(row)
            lines.append(
                f"| {row['proxy']} | {row['achieved_per_s']:g} | {row['errors']} | "
                f"{ms(row, 'ttft')} | {ms(row, 'total')} | {added_ttft} | {added_total} | "
                f"{row['proxy_cpu_cores']:.2f} | "
                f"{row['worker_cpu_cores'] + row['client_cpu_cores']:.2f} | "
                f"{row['client_lag']['p99_ms']:.1f} ms | {row['other_cpu_cores']:.2f} |"
            )
        lines.append("")
    sweep = results.get("sweep") or []
    if sweep:
        lines += [
            f"### Added latency vs concurrency: closed loop, streamed chat, "
            f"{results['settings']['max_tokens']} output tokens, one worker",
            "",
            "| proxy | streams | req/s | errors | TTFT p50 / p99 ms | total p50 / p99 ms "
            "| added TTFT p50 / p99 ms | added total p50 / p99 ms | proxy CPU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in sweep:
            added_ttft, added_total = added_cells(row)
            lines.append(
                f"| {row['proxy']} | {row['concurrency']} | {row['achieved_per_s']:g} | "
                f"{row['errors']} | {ms(row, 'ttft')} | {ms(row, 'total')} | {added_ttft} | "
                f"{added_total} | {row['proxy_cpu_cores']:.2f} |"
            )
        lines.append("")
    most = results.get("max") or []
    if most:
        lines += [
            f"### Most requests/s: closed loop, {results['settings']['concurrency']} streams, "
            f"{results['settings']['max_tokens_max']} output tokens, one worker",
            "",
            "| proxy | req/s | errors | total p50 / p99 ms | proxy CPU | req/s per proxy core "
            "| worker CPU | client CPU | other CPU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in most:
            per_core = row["req_per_s_per_proxy_core"]
            lines.append(
                f"| {row['proxy']} | {row['achieved_per_s']:g} | {row['errors']} | "
                f"{ms(row, 'total')} | {row['proxy_cpu_cores']:.2f} | "
                f"{f'**{per_core:,}**' if per_core else '—'} | "
                f"{row['worker_cpu_cores']:.2f} | {row['client_cpu_cores']:.2f} | "
                f"{row['other_cpu_cores']:.2f} |"
            )
        lines.append("")
    fairness = results.get("fairness") or []
    if fairness:
        settings = results["settings"]
        lines += [
            f"### Two-tenant flood: {settings['flood_workers']} workers (real time, "
            f"{FLOOD_MEMORY_TOKENS}-token KV), flood {settings['flood']} streams, light "
            f"{settings['light']}, {FLOOD_MAX_TOKENS} output tokens, "
            f"engines' policy {settings['flood_policy']}",
            "",
            "| proxy | endpoint | weights flood:light | light's share (entitled) | from "
            "| engines saw | per worker, % of the tenant's service | light TTFT p50 / p99 ms "
            "| light total p50 / p99 ms | flood total p50 ms | done flood / light "
            "| backlogged flood / light | other CPU |",
            "|---|---|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        lines[-2:-2] = [
            "A tenant's fair share is min(its weighted share, its demand). 'entitled' is the "
            "light tenant's weighted share where both tenants stayed backlogged in at least "
            f"{BACKLOGGED_ENOUGH:.0%} of the samples (demand then exceeds the share, so the "
            "two agree); elsewhere it reads '≤ share', as this run does not measure the "
            "tenant's demand alone: `kv_fairness.md` does, against each tenant's rate alone.",
            "",
        ]
        for row in fairness:
            weights = f"{row['weights']['flood']:g}:{row['weights']['light']:g}"
            if "failed" in row:
                lines.append(f"| {row['proxy']} | | {weights} | did not start |" + " |" * 9)
                continue
            light, flood = row["tenants"]["light"], row["tenants"]["flood"]
            seen = ", ".join(
                f"{tenant} {share:.0%}" for tenant, share in row["engine_service_share"].items()
            )
            where = "; ".join(
                f"{tenant} " + " ".join(f"{100 * share:.0f}" for share in shares)
                for tenant, shares in sorted(row["engine_service_by_worker"].items())
            )

            def backlog(tenant: dict[str, Any]) -> str:
                return "—" if tenant["backlogged"] is None else f"{tenant['backlogged']:.0%}"

            lines.append(
                f"| {row['proxy']} | {row['endpoint']} | {weights} | "
                f"**{row['service_share']['light']:.1%}** "
                f"({entitled(row)}) | {row['service_share_source']} | "
                f"{seen} | {where} | {ms(light, 'ttft')} | {ms(light, 'total')} | "
                f"{flood['total']['p50_ms']:.0f} | {flood['requests_done']} / "
                f"{light['requests_done']} | {backlog(flood)} / {backlog(light)} | "
                f"{row['other_cpu_cores']:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


#: Both tenants backlogged in this share of the samples: the weighted share is the fair one.
BACKLOGGED_ENOUGH = 0.9


def entitled(row: dict[str, Any]) -> str:
    """The light tenant's fair share as far as the run shows it (see the table's note)."""
    share = row["entitled_share"]["light"]
    backlogs = [tenant["backlogged"] for tenant in row["tenants"].values()]
    if all(backlog is not None and backlog >= BACKLOGGED_ENOUGH for backlog in backlogs):
        return f"{share:.0%}"
    return f"≤ {share:.0%}"


# ---------------------------------------------------------------------- main


def pin_self(cores: str | None) -> None:
    if cores is None or not hasattr(os, "sched_setaffinity"):
        return
    chosen: set[int] = set()
    for part in cores.split(","):
        low, _, high = part.partition("-")
        chosen.update(range(int(low), int(high or low) + 1))
    os.sched_setaffinity(0, chosen)


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, Settings]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds a case, no record")
    parser.add_argument(
        "--only", default=None, help=f"proxies, comma-separated: {', '.join(PROXIES)}"
    )
    parser.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help="what to measure: latency, max, fairness (the default), sweep (the "
        "concurrency sweep, recorded as gateway-sweep when run alone)",
    )
    parser.add_argument(
        "--sweep", default="1,4,16,64", help="sweep: streams, comma-separated (1,4,16,64)"
    )
    parser.add_argument(
        "--rate", default="500,200", help="latency: requests/s, comma-separated (500,200)"
    )
    parser.add_argument("--duration", type=float, default=30.0, help="latency seconds (30)")
    parser.add_argument("--max-tokens", type=int, default=4, help="latency output tokens (4)")
    parser.add_argument(
        "--latency-memory",
        type=int,
        default=LATENCY_MEMORY_TOKENS,
        help=f"KV tokens of the latency worker ({LATENCY_MEMORY_TOKENS})",
    )
    parser.add_argument("--concurrency", type=int, default=32, help="max: streams (32)")
    parser.add_argument("--flood-workers", type=int, default=4, help="fairness workers (4)")
    parser.add_argument("--flood", type=int, default=96, help="flooding tenant's streams (96)")
    parser.add_argument("--light", type=int, default=24, help="light tenant's streams (24)")
    parser.add_argument("--flood-window", type=float, default=40.0, help="seconds (40)")
    parser.add_argument(
        "--flood-endpoint",
        choices=("chat", "completions"),
        default=None,
        help="fairness on this endpoint only (default: chat, and completions for SGLang)",
    )
    parser.add_argument("--flood-policy", default="dlpm", help="the workers' policy (dlpm)")
    parser.add_argument(
        "--new-connections", action="store_true", help="Connection: close on every request"
    )
    parser.add_argument("--proxy-cores", default="1", help="taskset list for the proxy (1)")
    parser.add_argument("--worker-cores", default="0", help="taskset list for workers (0)")
    parser.add_argument("--load-cores", default="0", help="cores of this process (0)")
    parser.add_argument("--calibrate", action="store_true", help="the client's CPU per request")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    args = parser.parse_args(argv)
    settings = Settings(
        rates=[float(rate) for rate in args.rate.split(",") if rate],
        duration=args.duration,
        max_tokens=args.max_tokens,
        latency_memory_tokens=args.latency_memory,
        concurrency=args.concurrency,
        sweep=[int(streams) for streams in args.sweep.split(",") if streams],
        flood_workers=args.flood_workers,
        flood=args.flood,
        light=args.light,
        flood_window=args.flood_window,
        flood_endpoint=args.flood_endpoint,
        flood_policy=args.flood_policy,
        new_connections=args.new_connections,
        proxy_cores=args.proxy_cores or None,
        worker_cores=args.worker_cores or None,
        load_cores=args.load_cores or None,
        quick=args.quick,
        keep_logs=args.keep_logs,
    )
    if (os.cpu_count() or 1) < 2:
        say("one core only: nothing is pinned")
        settings.proxy_cores = settings.worker_cores = settings.load_cores = None
    if args.quick:
        settings.rates = [min(rate, 100.0) for rate in settings.rates[:1]]
        settings.duration, settings.warmup = 2.0, 0.5
        settings.max_duration = settings.sweep_duration = 2.0
        settings.flood_workers, settings.flood, settings.light = 2, 16, 4
        settings.flood_warmup, settings.flood_window = 2.0, 4.0
    return args, settings


def main(argv: list[str] | None = None) -> None:
    args, settings = parse(argv)
    pin_self(settings.load_cores)
    gc.disable()  # the load generator's own pauses would read as latency; it frees little
    if args.calibrate:
        calibrate(settings)
        return
    wanted = [get_proxy(spec) for spec in (args.only or ",".join(PROXIES)).split(",") if spec]
    cases = {case.strip() for case in args.cases.split(",") if case.strip()}
    skipped: dict[str, str] = {}
    proxies: list[Proxy] = []
    for proxy in wanted:
        reason = proxy.unavailable()
        if reason is None:
            proxies.append(proxy)
        else:
            skipped[proxy.label] = reason
            say(f"skipping {proxy.label}: {reason}")
    busy = quiet_check()
    if busy > 0.05:
        say(
            f"warning: {busy:.2f} cores busy before the benchmark starts: other programs "
            "disturb the numbers (see other_cpu_cores in the results)"
        )
    results: dict[str, Any] = {
        "goal_added_p99_ms": GOAL_ADDED_P99_MS,
        "busy_before_cores": busy,
        "settings": {
            key: value
            for key, value in vars(settings).items()
            if key not in ("logs", "keep_logs", "quick")
        },
        "pinning": {
            "proxy": f"taskset -c {settings.proxy_cores}" if settings.proxy_cores else None,
            "workers": f"taskset -c {settings.worker_cores}" if settings.worker_cores else None,
            "load generator": f"sched_setaffinity {settings.load_cores}"
            if settings.load_cores
            else None,
        },
        "versions": {proxy.label: proxy.version() for proxy in proxies},
        "routers_venv": os.path.relpath(ROUTERS_VENV, ROOT),  # no machine paths in results
        "skipped": skipped,
    }
    try:
        if cases & {"latency", "max", "sweep"}:
            results.update(run_latency_and_max(proxies, settings, cases))
        if "fairness" in cases:
            results["fairness"] = run_fairness(proxies, settings)
    except BaseException:
        say(f"logs of the processes in {settings.logs}")
        raise
    if settings.keep_logs:
        say(f"logs of the processes in {settings.logs}")
    else:
        shutil.rmtree(settings.logs, ignore_errors=True)
    print(table(results))
    if settings.quick:
        return
    name = "gateway-sweep" if cases == {"sweep"} else "gateway"
    partial = bool(skipped) or args.only is not None or cases - {"sweep"} != set(DEFAULT_CASES)
    if name == "gateway-sweep":
        partial = bool(skipped) or args.only is not None
    results["partial"] = partial
    notes = [
        "",
        f"- Goal: the gateway adds at most {GOAL_ADDED_P99_MS:g} ms p99 at {GOAL_RATE:g} "
        "req/s on one core. Proxy pinned with `taskset -c "
        f"{settings.proxy_cores}`; workers (`taskset -c {settings.worker_cores}`) and the "
        f"load generator (core {settings.load_cores}) share the other core.",
        "- Added = the proxy's quantile minus the direct run's; `direct (again)` repeats "
        "the baseline at the end: its difference is the noise. `other CPU`: cores busy on "
        "the machine outside the benchmark's processes (other programs, kernel work not "
        f"charged to a process); {busy:.2f} before the start.",
        "- Method and workloads: the docstring of `bench/bench_gateway.py`; how each "
        "router is started and what it asks of the workers: `bench/routers.py`.",
        "- SGLang's router (0.3.2) reads a request that follows a streamed response on the "
        "same keep-alive connection about 40 ms late (not on a new connection, nor after a "
        "whole response): its latency rows are that stall (`--new-connections` measures "
        "without it). It also drops `vllm_xargs` from chat requests, so the engines see one "
        "tenant, `default`, and the shares come from the clients' usage.",
        "- vllm-router (0.1.17) with `cache_aware` sends `POST /v1/chat/completions/render` "
        "and `POST /tokenize` to the chosen worker before each request (engine-sim answers "
        "404, the router then routes on the text): two more worker round trips per request.",
        f"- Versions: {results['versions']}.",
    ]
    if partial:
        notes.insert(
            1,
            "- **Partial run**: "
            + "; ".join(
                [f"{name} skipped ({reason})" for name, reason in skipped.items()]
                + ([f"only {args.only}"] if args.only else [])
                + (
                    [f"cases {', '.join(sorted(cases))}"]
                    if name == "gateway" and not cases >= set(DEFAULT_CASES)
                    else []
                )
            )
            + ".",
        )
    path = write_results(name, results, table(results) + "\n".join(notes))
    print(f"wrote {path.name} and {path.with_suffix('.md').name} in bench/results/")


if __name__ == "__main__":
    main()
