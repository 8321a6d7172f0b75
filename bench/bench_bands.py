"""The fair order through the real processes: priority bands, nested groups, weights.

First the simulator's measure 1 of bench/bench_tree.py (an interactive tenant beside a
batch flood), run as a user runs it: `fairpool engine-sim` workers at real time
(`--speedup 1`, Llama-3-8B-on-H100 step times, DLPM, the tenants' bands in their
scheduler configuration), one `fairpool gateway` process with the pool's default
saturation and `fairEngines` on, as the operator renders a DLPM pool (the engines hold
queues, as in the simulator's pool), and `fairpool load`'s client. Tenant `chat` is in
the interactive band (`slo.class`), tenant `batch` in the batch band; both send the
gateway benchmark's streamed chat requests (a shared system prompt, a 120-word question,
64 output tokens).

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

Then the tree's shares, through the same processes (engines and gateway configured with
the groups, as the operator renders them), every tenant flooding (`--share-streams`
closed-loop streams each), each tenant's service from the engines' counters over the
window:

5. **Nesting**: org A (a TenantGroup of weight 1) holds ten tenants, org B (weight 1) one,
   whose tenant floods with as many streams as org A's ten together (fewer could not keep
   it backlogged at half the pool): A against B, goal 1 : 1 within 5 % (flat weights
   would give 10 : 1).
6. **Twelve tenants**, weights 1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8: each tenant's part of
   the service against its weighted share, goal every tenant within 10 %.

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
    served_between,
)
from bench_replicas import gateways, spread_over, started_engines
from routers import EngineOptions, RunningProxy, Tenant

from fairpool.sim.metrics import percentile

ENGINES = 2
MEMORY_TOKENS = 8192  # per engine, as the simulator's pool (bench_tree.py)
TTFT_FACTOR, TTFT_SLACK = 1.5, 0.025
LEFT_GOAL = 0.9
NEST_TENANTS = 10
NEST_TOLERANCE = 0.05
TWELVE_WEIGHTS = (1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8)
TWELVE_TOLERANCE = 0.10


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
def pool(
    members: list[Tenant], logs: Path, groups: dict[str, dict[str, Any]] | None = None
) -> Iterator[tuple[list[RunningProxy], list[Any]]]:
    """Engines with `members`' weights, bands and groups in their scheduler configuration
    and one gateway with the same (`fairEngines` on, as the operator sets it for DLPM)."""
    options = EngineOptions(
        speedup=1.0,
        memory_tokens=MEMORY_TOKENS,
        max_model_len=FLOOD_MAX_MODEL_LEN,
        weights={t.name: t.weight for t in members},
        bands={t.name: t.band for t in members if t.band},
        groups=groups or {},
        tenant_groups={t.name: t.group for t in members if t.group},
    )
    with (
        started_engines(ENGINES, options, None, logs) as engines,
        gateways(
            1,
            [e.url for e in engines],
            members,
            None,
            logs,
            None,
            fair_engines=True,
            groups=groups,
        ) as running,
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
        name: served_between(before, after, name) / seconds for name in (chat.name, batch.name)
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
    with pool(list(tenants(True)), logs) as (running, engines):
        say("1/4 the batch flood alone")
        phases["flood alone"] = asyncio.run(
            run_phase(settings, running, engines, settings.streams, 0.0, True)
        )
    chat_rate = settings.load * phases["flood alone"].requests_per_s["batch"]
    with pool(list(tenants(True)), logs) as (running, engines):
        say(f"2/4 the interactive tenant alone, {chat_rate:.2f} requests/s")
        phases["interactive alone"] = asyncio.run(
            run_phase(settings, running, engines, 0, chat_rate, True)
        )
    with pool(list(tenants(True)), logs) as (running, engines):
        say("3/4 both, bands on")
        phases["bands on"] = asyncio.run(
            run_phase(settings, running, engines, settings.streams, chat_rate, True)
        )
    with pool(list(tenants(False)), logs) as (running, engines):
        say("4/4 both, bands off")
        phases["bands off"] = asyncio.run(
            run_phase(settings, running, engines, settings.streams, chat_rate, False)
        )
    return verdicts(phases, chat_rate)


async def flood_service(
    settings: argparse.Namespace,
    running: list[RunningProxy],
    engines: list[Any],
    members: list[Tenant],
    streams: dict[str, int],
) -> dict[str, float]:
    """Every member flooding with its `streams`: each one's service over the window, from
    the engines."""
    flood = Flood(
        {
            t.name: (
                streams[t.name],
                request_maker(
                    running[0].proxy, [t], "chat", FLOOD_MAX_TOKENS, FLOOD_QUESTION_WORDS
                ),
            )
            for t in members
        }
    )
    flooding = asyncio.create_task(flood.run(spread_over(running)))
    async with httpx.AsyncClient(timeout=10) as http:
        await asyncio.sleep(settings.warmup)
        before = await scrape(http, engines)
        await asyncio.sleep(settings.window)
        after = await scrape(http, engines)
    flooding.cancel()
    await asyncio.gather(flooding, return_exceptions=True)
    return {t.name: served_between(before, after, t.name) for t in members}


def nesting(settings: argparse.Namespace, logs: Path) -> dict[str, Any]:
    groups = {"org-a": {"weight": 1.0}, "org-b": {"weight": 1.0}}
    org_a = [Tenant(f"org-a-{i}", 1.0, None, "org-a") for i in range(NEST_TENANTS)]
    members = [*org_a, Tenant("org-b-0", 1.0, None, "org-b")]
    say(f"5 nesting: org A ({NEST_TENANTS} tenants) against org B (1)")
    # org B's one tenant floods with as many streams as org A's ten together: a tenant
    # with fewer requests than its half of the engines runs could not be backlogged
    streams = {t.name: settings.share_streams for t in org_a}
    streams["org-b-0"] = NEST_TENANTS * settings.share_streams
    with pool(members, logs, groups) as (running, engines):
        service = asyncio.run(flood_service(settings, running, engines, members, streams))
    a = sum(service[t.name] for t in org_a)
    ratio = a / max(service["org-b-0"], 1.0)
    return {
        "service": {name: round(value) for name, value in service.items()},
        "a_to_b": round(ratio, 4),
        "met": abs(ratio - 1.0) <= NEST_TOLERANCE,
    }


def twelve(settings: argparse.Namespace, logs: Path) -> dict[str, Any]:
    members = [Tenant(f"t{i}-w{w}", float(w)) for i, w in enumerate(TWELVE_WEIGHTS)]
    say("6 twelve tenants, weights " + ", ".join(map(str, TWELVE_WEIGHTS)))
    streams = {t.name: settings.share_streams for t in members}
    with pool(members, logs) as (running, engines):
        service = asyncio.run(flood_service(settings, running, engines, members, streams))
    total, weights = sum(service.values()), sum(TWELVE_WEIGHTS)
    parts = {
        t.name: (service[t.name] / total) / (t.weight / weights) if total else 0.0 for t in members
    }
    return {
        "service": {name: round(value) for name, value in service.items()},
        "part_over_share": {name: round(value, 4) for name, value in parts.items()},
        "met": all(abs(value - 1.0) <= TWELVE_TOLERANCE for value in parts.values()),
    }


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
    nest, many = result["nesting"], result["twelve"]
    parts = many["part_over_share"]
    lines += [
        "",
        "| tree's shares, every tenant flooding | measured | goal | met |",
        "|---|---|---|:-:|",
        f"| org A ({NEST_TENANTS} tenants) : org B (1), groups of weight 1 | "
        f"{nest['a_to_b']:.3f} : 1 | 1 : 1 within {NEST_TOLERANCE:.0%} | "
        f"{'yes' if nest['met'] else '**no**'} |",
        f"| {len(parts)} tenants, weights {', '.join(map(str, TWELVE_WEIGHTS))}: each "
        f"tenant's part / its weighted share | {min(parts.values()):.3f} to "
        f"{max(parts.values()):.3f} | 1 within {TWELVE_TOLERANCE:.0%} | "
        f"{'yes' if many['met'] else '**no**'} |",
    ]
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
    parser.add_argument(
        "--share-streams", type=int, default=8, help="nesting, twelve: streams per tenant"
    )
    parser.add_argument("--quick", action="store_true", help="short phases, no record")
    settings = parser.parse_args(argv)
    if settings.quick:
        settings.streams, settings.warmup, settings.window = 16, 2.0, 4.0
        settings.share_streams = 2
    logs = Path(tempfile.mkdtemp(prefix="bench-bands-"))
    try:
        result = measure(settings, logs)
        result["nesting"] = nesting(settings, logs)
        result["twelve"] = twelve(settings, logs)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    print(table(result))
    if not settings.quick:
        write_results("bands", json.loads(json.dumps(result)), table(result))


if __name__ == "__main__":
    main()
