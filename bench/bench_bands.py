"""Priority bands through the real processes: an interactive tenant beside a batch flood.

The simulator's measure 1 of bench/bench_tree.py, run as a user runs it: `fairpool
engine-sim` workers at real time (`--speedup 1`, Llama-3-8B-on-H100 step times, DLPM, the
tenants' bands in their scheduler configuration), one `fairpool gateway` process with the
pool's default saturation (the engines hold queues, as in the simulator's pool), and
`fairpool load`'s client. Tenant `chat` is in the interactive band (`slo.class`), tenant
`batch` in the batch band; both send the gateway benchmark's streamed chat requests (a
shared system prompt, a 120-word question, 64 output tokens).

Four phases, each on fresh processes or after the last drained:

1. the batch flood alone (`--streams` closed-loop streams): its service rate (1 ×
   uncached prompt + 2 × output tokens, from the engines' own counters) and requests per
   second — the capacity;
2. the interactive tenant alone: Poisson arrivals at `--load` (30 %) of the flood's
   requests per second, TTFT from each request's scheduled time to the first byte of its
   answer;
3. both, bands on: the interactive TTFT p99 against alone (goal ≤ 1.5× alone + 25 ms),
   and the flood's service rate against the capacity the interactive tenant leaves (the
   flood's rate alone minus the interactive tenant's rate in the same run; goal ≥ 0.9×);
4. both, bands off (both tenants standard, the engines without bands): the same figures.

Times here are wall-clock on a shared machine, so the table states the machine; the
simulator's run of the same shape (bench/results/tree.md) is the one that does not
depend on it. Results: bench/results/bands.json and .md. `--quick` runs short phases
and records nothing.
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
from _common import write_results
from bench_gateway import (
    FLOOD_MAX_MODEL_LEN,
    FLOOD_MAX_TOKENS,
    FLOOD_QUESTION_WORDS,
    Flood,
    open_loop_results,
    request_maker,
    scrape,
    sender,
)
from bench_replicas import gateways, spread_over, started_engines
from routers import EngineOptions, RunningProxy, Tenant

from fairpool.sim.metrics import percentile

ENGINES = 2
MEMORY_TOKENS = 8192  # per engine, as the simulator's pool (bench_tree.py)
TTFT_FACTOR, TTFT_SLACK = 1.5, 0.025
LEFT_GOAL = 0.9


def say(message: str) -> None:
    print(f"bench_bands: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Phase:
    """What one phase measured."""

    ttft_p99: float | None  # seconds, the interactive tenant's
    ttft_p50: float | None
    chat_requests: int
    chat_errors: int
    service_per_s: dict[str, float]  # per tenant, from the engines' counters
    requests_per_s: dict[str, float]  # per tenant, answered in the window


def tenants(bands: bool) -> tuple[Tenant, Tenant]:
    if bands:
        return Tenant("chat", 1.0, "interactive"), Tenant("batch", 1.0, "batch")
    return Tenant("chat", 1.0), Tenant("batch", 1.0)


@contextlib.contextmanager
def pool(bands: bool, logs: Path) -> Iterator[tuple[list[RunningProxy], list[Any]]]:
    chat, batch = tenants(bands)
    options = EngineOptions(
        speedup=1.0,
        memory_tokens=MEMORY_TOKENS,
        max_model_len=FLOOD_MAX_MODEL_LEN,
        bands={t.name: t.band for t in (chat, batch) if t.band},
    )
    with (
        started_engines(ENGINES, options, None, logs) as engines,
        gateways(1, [e.url for e in engines], [chat, batch], None, logs, None) as running,
    ):
        yield running, engines


def ttft(result: Any) -> float | None:
    """From the request's scheduled time (open loop: the client's own lag counts)."""
    return None if result.first_byte is None else result.first_byte - result.scheduled


async def run_phase(
    settings: argparse.Namespace,
    running: list[RunningProxy],
    engines: list[Any],
    streams: int,
    chat_rate: float,
    bands: bool,
) -> Phase:
    chat, batch = tenants(bands)
    make = {
        t.name: request_maker(running[0].proxy, [t], "chat", FLOOD_MAX_TOKENS, FLOOD_QUESTION_WORDS)
        for t in (chat, batch)
    }
    flood = Flood({batch.name: (streams, make[batch.name])} if streams else {})
    flooding = asyncio.create_task(flood.run(spread_over(running)))
    client = sender(*running[0].targets[0])
    async with httpx.AsyncClient(timeout=10) as http:
        await asyncio.sleep(settings.warmup)
        before, start = await scrape(http, engines), time.monotonic()
        chat_results = (
            await open_loop_results(client, make[chat.name], chat_rate, settings.window, seed=11)
            if chat_rate
            else await asyncio.sleep(settings.window) or []
        )
        after, end = await scrape(http, engines), time.monotonic()
    flooding.cancel()
    await asyncio.gather(flooding, return_exceptions=True)
    await client.close()
    seconds = end - start
    service = {
        name: (sum(after["service"].get(name, [0.0])) - sum(before["service"].get(name, [0.0])))
        / seconds
        for name in (chat.name, batch.name)
    }
    answered = {
        batch.name: sum(1 for r in flood.results if r.ok and r.ended and start <= r.ended < end),
        chat.name: sum(1 for r in chat_results if r.ok),
    }
    ttfts = [ttft(r) for r in chat_results if r.ok]
    known = [t for t in ttfts if t is not None]
    return Phase(
        percentile(known, 0.99),
        percentile(known, 0.5),
        len(chat_results),
        sum(1 for r in chat_results if not r.ok),
        {name: round(value, 1) for name, value in service.items()},
        {name: round(count / seconds, 2) for name, count in answered.items()},
    )


def measure(settings: argparse.Namespace, logs: Path) -> dict[str, Any]:
    phases: dict[str, Phase] = {}
    with pool(True, logs) as (running, engines):
        say("1/4 the batch flood alone")
        phases["flood alone"] = asyncio.run(
            run_phase(settings, running, engines, settings.streams, 0.0, True)
        )
    chat_rate = settings.load * phases["flood alone"].requests_per_s["batch"]
    with pool(True, logs) as (running, engines):
        say(f"2/4 the interactive tenant alone, {chat_rate:.2f} requests/s")
        phases["interactive alone"] = asyncio.run(
            run_phase(settings, running, engines, 0, chat_rate, True)
        )
    with pool(True, logs) as (running, engines):
        say("3/4 both, bands on")
        phases["bands on"] = asyncio.run(
            run_phase(settings, running, engines, settings.streams, chat_rate, True)
        )
    with pool(False, logs) as (running, engines):
        say("4/4 both, bands off")
        phases["bands off"] = asyncio.run(
            run_phase(settings, running, engines, settings.streams, chat_rate, False)
        )
    return verdicts(phases, chat_rate)


def verdicts(phases: dict[str, Phase], chat_rate: float) -> dict[str, Any]:
    alone = phases["interactive alone"].ttft_p99 or 0.0
    limit = TTFT_FACTOR * alone + TTFT_SLACK
    capacity = phases["flood alone"].service_per_s["batch"]
    rows = []
    for name in ("bands on", "bands off"):
        phase = phases[name]
        left = capacity - phase.service_per_s["chat"]
        kept = phase.service_per_s["batch"] / left if left > 0 else None
        rows.append(
            {
                "phase": name,
                "ttft_p99_s": phase.ttft_p99,
                "ttft_vs_alone": (phase.ttft_p99 or 0.0) / alone if alone else None,
                "ttft_goal_s": limit,
                "ttft_met": phase.ttft_p99 is not None and phase.ttft_p99 <= limit,
                "batch_vs_left": kept,
                "left_met": kept is not None and kept >= LEFT_GOAL,
            }
        )
    return {
        "chat_rate_per_s": round(chat_rate, 3),
        "phases": {name: vars(phase) for name, phase in phases.items()},
        "rows": rows,
    }


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{1000 * seconds:.1f} ms"


def table(result: dict[str, Any]) -> str:
    phases = result["phases"]
    alone = phases["interactive alone"]
    capacity = phases["flood alone"]["service_per_s"]["batch"]
    lines = [
        "Real processes on loopback: two `fairpool engine-sim` workers at real time "
        f"({MEMORY_TOKENS:,} KV tokens each, DLPM), one `fairpool gateway` at its default "
        "saturation; wall-clock times on this machine (bench/bench_bands.py's docstring).",
        "",
        "| phase | interactive TTFT p50 / p99 | vs alone (p99) | goal | met | batch service/s "
        "| vs capacity left | met | interactive errors |",
        "|---|---:|---:|---|:-:|---:|---:|:-:|---:|",
        f"| batch flood alone | — | — | — | — | {capacity:,.0f} | — | — | — |",
        f"| interactive alone ({result['chat_rate_per_s']:.2f} req/s) | "
        f"{_ms(alone['ttft_p50'])} / {_ms(alone['ttft_p99'])} | 1.00× | — | — | — | — | — | "
        f"{alone['chat_errors']} of {alone['chat_requests']} |",
    ]
    for row in result["rows"]:
        phase = phases[row["phase"]]
        goal = f"≤ {_ms(row['ttft_goal_s'])}" if row["phase"] == "bands on" else "—"
        kept = row["batch_vs_left"]
        lines.append(
            f"| {row['phase']} | {_ms(phase['ttft_p50'])} / {_ms(phase['ttft_p99'])} | "
            f"{row['ttft_vs_alone']:.2f}× | {goal} | "
            f"{('yes' if row['ttft_met'] else '**no**') if row['phase'] == 'bands on' else '—'} | "
            f"{phase['service_per_s']['batch']:,.0f} | "
            f"{'—' if kept is None else f'{kept:.3f}×'} | "
            f"{('yes' if row['left_met'] else '**no**') if row['phase'] == 'bands on' else '—'} | "
            f"{phase['chat_errors']} of {phase['chat_requests']} |"
        )
    on, off = result["rows"]
    lines += [
        "",
        f"With bands the interactive TTFT p99 was {on['ttft_vs_alone']:.2f}× its p99 alone, "
        f"without them {off['ttft_vs_alone']:.2f}×; the goal (≤ {TTFT_FACTOR:g}× alone + "
        f"{1000 * TTFT_SLACK:g} ms = {_ms(on['ttft_goal_s'])}) is "
        f"{'met' if on['ttft_met'] else 'not met'} with bands and "
        f"{'met' if off['ttft_met'] else 'not met'} without.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--streams", type=int, default=96, help="the batch flood's streams")
    parser.add_argument("--load", type=float, default=0.3, help="interactive rate / flood's")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=40.0)
    parser.add_argument("--quick", action="store_true", help="short phases, no record")
    settings = parser.parse_args(argv)
    if settings.quick:
        settings.streams, settings.warmup, settings.window = 16, 2.0, 4.0
    logs = Path(tempfile.mkdtemp(prefix="bench-bands-"))
    try:
        result = measure(settings, logs)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    print(table(result))
    if not settings.quick:
        write_results("bands", json.loads(json.dumps(result)), table(result))


if __name__ == "__main__":
    main()
