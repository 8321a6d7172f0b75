"""`fairpool engine-sim` under load: concurrent streams per core and tokens per second.

Goal (issue): one server process holds at least 200 concurrent streams on one core.

The server runs as `fairpool engine-sim` in its own process, pinned to one core, without
access log; the clients run in this process (httpx, asyncio, one connection each) on the
other cores. Each of N clients streams completions back to back (starts staggered over
two seconds): a shared 150-token system prompt plus its own question, `max_tokens` 128,
four tenants, the default DLPM policy, the `llama3-8b-h100` profile. After a warm-up
with all N streams open, a measured window:

- tokens/s: output tokens the server generated in the window (`vllm:generation_tokens_total`);
- server CPU: the server process's CPU seconds / window seconds (1.0 = one core busy);
- server tokens/s per core: tokens/s / server CPU;
- streams per core: N / server CPU, how many such streams one core would hold at the
  same per-stream token rate;
- mean inter-token latency from the server's histogram (model time, which includes any
  lag of the host) next to the cost model's step for N decodes: while the server keeps
  up, the two are close (prefills of new arrivals add a little);
- mean time to first token (server histogram); the clients' CPU and time to first byte
  are in the JSON.

Levels: N = 100, 200, 400, 800 at `--speedup 1` (real time: each stream gets the
profile's token rate for its batch size), and N = 200 at `--speedup 1000` (model time is
negligible: the most tokens one core serves, or the clients take).

Run: `python bench/bench_engine_sim.py` (`--quick` for a smoke run that records nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import write_results

from fairpool.sim.metrics import percentile
from fairpool.sim.profiles import get_profile
from fairpool_engine.sim.text import tokenize

GOAL_STREAMS_PER_CORE = 200
PROFILE = "llama3-8b-h100"
SYSTEM = "You are a helpful assistant who answers questions about the report below. " * 10
MAX_TOKENS = 128
TENANTS = 4


@dataclass(frozen=True)
class Level:
    streams: int
    speedup: float


LEVELS = [Level(100, 1.0), Level(200, 1.0), Level(400, 1.0), Level(800, 1.0), Level(200, 1000.0)]
QUICK_LEVELS = [Level(20, 1.0)]
STAGGER_S = 2.0


@dataclass
class ClientStats:
    requests: int = 0
    errors: int = 0
    chunks: int = 0
    first_byte: list[float] = field(default_factory=list)
    measuring: bool = False


# ---------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_server(level: Level, port: int, core: int) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "fairpool_cli",
        "engine-sim",
        "--port",
        str(port),
        "--profile",
        PROFILE,
        "--speedup",
        str(level.speedup),
        "--disable-uvicorn-access-log",
    ]

    def pin() -> None:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {core})

    server = subprocess.Popen(command, stderr=subprocess.DEVNULL, preexec_fn=pin)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("engine-sim did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


# ---------------------------------------------------------------------- the clients


async def client(
    url: str, index: int, streams: int, stop: asyncio.Event, stats: ClientStats
) -> None:
    """One client with its own connection (a shared httpx pool costs O(connections) of
    bookkeeping per request, which made the clients the bottleneck)."""
    await asyncio.sleep(STAGGER_S * index / streams)
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await _client_requests(http, index, stop, stats)


async def _client_requests(
    http: httpx.AsyncClient, index: int, stop: asyncio.Event, stats: ClientStats
) -> None:
    number = 0
    while not stop.is_set():
        number += 1
        body = {
            "model": "sim",
            "prompt": question(index, number),
            "max_tokens": MAX_TOKENS,
            "stream": True,
            "vllm_xargs": {"fairpool_tenant": f"tenant-{index % TENANTS}"},
        }
        started = time.perf_counter()
        first: float | None = None
        tail = b""
        try:
            async with http.stream("POST", "/v1/completions", json=body) as response:
                async for chunk in response.aiter_raw():
                    if first is None:
                        first = time.perf_counter() - started
                    if stats.measuring:
                        stats.chunks += chunk.count(b"\n\n")
                    tail = (tail + chunk)[-32:]
        except httpx.HTTPError as error:
            stats.errors += 1
            print(f"  client {index}: {error!r}", file=sys.stderr)
            continue
        if response.status_code != 200 or not tail.endswith(b"data: [DONE]\n\n"):
            stats.errors += 1
        elif stats.measuring:
            stats.requests += 1
            if first is not None:
                stats.first_byte.append(first)


async def drive(url: str, level: Level, warmup: float, window: float, pid: int) -> dict[str, Any]:
    stats = ClientStats()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(client(url, index, level.streams, stop, stats))
        for index in range(level.streams)
    ]
    await asyncio.sleep(warmup)
    before, cpu_before, client_before = scrape(url), cpu_seconds(pid), time.process_time()
    stats.measuring, started = True, time.perf_counter()
    await asyncio.sleep(window)
    stats.measuring, elapsed = False, time.perf_counter() - started
    after, cpu_after, client_after = scrape(url), cpu_seconds(pid), time.process_time()
    stop.set()
    await asyncio.gather(*tasks)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    tokens = delta("vllm:generation_tokens_total")
    server_cpu = (cpu_after - cpu_before) / elapsed
    itl_count = delta("vllm:inter_token_latency_seconds_count")
    ttft_count = delta("vllm:time_to_first_token_seconds_count")
    first_bytes = sorted(stats.first_byte) or [0.0]
    return {
        "streams": level.streams,
        "speedup": level.speedup,
        "window_s": round(elapsed, 2),
        "requests": stats.requests,
        "errors": stats.errors,
        "tokens_per_s": round(tokens / elapsed),
        "tokens_per_s_per_stream": round(tokens / elapsed / level.streams, 1),
        "chunks_per_s": round(stats.chunks / elapsed),
        "server_cpu_cores": round(server_cpu, 3),
        "server_tokens_per_s_per_core": round(tokens / elapsed / server_cpu)
        if server_cpu
        else None,
        "streams_per_core": round(level.streams / server_cpu) if server_cpu else None,
        "client_cpu_cores": round((client_after - client_before) / elapsed, 3),
        "mean_itl_ms": round(1000 * delta("vllm:inter_token_latency_seconds_sum") / itl_count, 2)
        if itl_count
        else None,
        "model_itl_ms": round(1000 * modelled_step(level.streams), 2),
        "ttft_mean_ms": round(1000 * delta("vllm:time_to_first_token_seconds_sum") / ttft_count, 1)
        if ttft_count
        else None,
        "client_ttfb_p50_ms": round(1000 * (percentile(first_bytes, 0.5) or 0.0), 1),
        "client_ttfb_p99_ms": round(1000 * (percentile(first_bytes, 0.99) or 0.0), 1),
    }


def modelled_step(streams: int) -> float:
    """The cost model's step for `streams` decodes at a mid-output context (prefills of
    new arrivals add to it)."""
    step = get_profile(PROFILE).step_time
    context = len(tokenize(question(0, 0))) + MAX_TOKENS // 2
    return step.base + streams * (step.per_decode + step.per_context_token * context)


def question(client: int, number: int) -> str:
    return f"{SYSTEM}\nClient {client}, question {number}: what does it say?"


def run_level(level: Level, warmup: float, window: float) -> dict[str, Any]:
    port = free_port()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    server = start_server(level, port, cores[0])
    if len(cores) > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores[1:]))
    try:
        url = f"http://127.0.0.1:{port}"
        return asyncio.run(drive(url, level, warmup, window, server.pid))
    finally:
        server.terminate()
        server.wait(timeout=30)
        if len(cores) > 1 and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, set(cores))


# ---------------------------------------------------------------------- report


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| streams | speedup | tokens/s per stream | tokens/s | server CPU | server tokens/s "
        "per core | streams per core | client CPU | mean ITL (decode-only step) | mean TTFT "
        "| errors |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['streams']} | {row['speedup']:g} | {row['tokens_per_s_per_stream']} | "
            f"{row['tokens_per_s']:,} | {row['server_cpu_cores']:.2f} | "
            f"**{row['server_tokens_per_s_per_core']:,}** | **{row['streams_per_core']:,}** | "
            f"{row['client_cpu_cores']:.2f} | {row['mean_itl_ms']} ms ({row['model_itl_ms']} ms) "
            f"| {row['ttft_mean_ms']} ms | {row['errors']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="toy sizes, records nothing")
    parser.add_argument("--window", type=float, default=10.0, help="measured seconds (10)")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds before (4)")
    args = parser.parse_args()
    levels = QUICK_LEVELS if args.quick else LEVELS
    if args.quick:
        args.window, args.warmup = 1.0, 0.5
    rows = []
    for level in levels:
        print(f"{level.streams} streams, speedup {level.speedup:g} ...", file=sys.stderr)
        rows.append(run_level(level, args.warmup, args.window))
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    print(table(rows))
    if args.quick:
        return
    notes = f"""

- Goal: {GOAL_STREAMS_PER_CORE} concurrent streams on one core. The server process is
  pinned to one core; the clients (httpx, one connection each) run on the others.
- Streams per core = streams / server CPU, at the per-stream token rate of the row: at
  speedup 1 each stream gets the cost model's rate for its batch while the server keeps
  up (mean ITL next to the model's decode step). Once a core is saturated, streams still
  complete, with tokens later and several per chunk.
- Workload and measures: see the docstring of `bench/bench_engine_sim.py`.
"""
    path = write_results(
        "engine_sim",
        {"goal_streams_per_core": GOAL_STREAMS_PER_CORE, "profile": PROFILE, "rows": rows},
        table(rows) + notes,
    )
    print(f"wrote {path.name} and {path.with_suffix('.md').name} in bench/results/")


if __name__ == "__main__":
    main()
