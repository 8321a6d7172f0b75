"""Cost of fairpool's scheduler inside vLLM: time per `schedule()` call, against stock
vLLM's scheduler, with 256 requests waiting across 20 tenants.

Goal (issue): at most 1.05× stock's time per call.

Each configuration runs in its own process on vLLM's CPU build with the tiny local
model, its engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that the scheduler
object can be timed directly. Before every step the waiting queue is topped up to 256
requests (20 tenants in turn, each tenant's prompts sharing a preamble of two or more KV
blocks), so every timed call sees the steady state the goal is about; the first 20 calls
are not counted. Two scenarios (`SCENARIOS`): the issue's, with 16 output tokens per
request and `max_num_seqs` 16, and one with longer answers and a larger batch. The
model's forward pass is not timed; it is what a real GPU step spends most of its time in.

Two comparisons come out of it:

- **Same steps** (the goal's figure): within each call, the time spent in the plugin —
  its waiting queue's methods, which vLLM calls, and its own work before and after
  vLLM's `schedule()` — is timed apart from vLLM's own work on the requests that call
  admitted. The ratio is (vLLM's work + the plugin's) / (vLLM's work + stock's FCFS
  queue's), the cost of making the same decisions with the plugin. Both parts come from
  the same calls, so machine noise largely cancels.
- **Whole calls**: mean time per call against stock's. A fair policy admits different
  requests at different steps than FCFS does (DLPM admits a tenant's prefix-sharing
  requests together), so this mixes the plugin's cost with a different workload, and
  on a shared 2-core machine it drifts ±10 % between runs. The configurations run in
  interleaved rounds and each figure is the median over rounds.

Run with the vLLM environment: `python bench/bench_vllm_scheduler.py` (`--quick`: a
small run that records nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results

from fairpool.sim.metrics import percentile

CONFIGURATIONS = {
    "stock": None,
    "fairpool dlpm": "dlpm",
    "fairpool vtc": "vtc",
    "fairpool lpm": "lpm",
    # FCFS through the plugin: what the plugin's queue and charging cost on their own.
    "fairpool fcfs": "fcfs",
}
TENANTS = 20
WARMUP_STEPS = 20
GOAL_RATIO = 1.05


@dataclass(frozen=True)
class Scenario:
    max_num_seqs: int
    output_tokens: int
    kv_cache_mib: int


SCENARIOS = {
    # The issue's: short answers and a small batch, so admissions (where the plugin
    # works) are a large part of every step.
    "issue": Scenario(max_num_seqs=16, output_tokens=16, kv_cache_mib=64),
    # Answers of 128 tokens in a batch of 64: fewer admissions per step.
    "longer answers": Scenario(max_num_seqs=64, output_tokens=128, kv_cache_mib=256),
}
#: What vLLM's scheduler calls on its waiting queue (`RequestQueue`).
QUEUE_METHODS = (
    "add_request", "pop_request", "peek_request", "prepend_request", "prepend_requests",
    "remove_request", "remove_requests", "__bool__", "__len__", "__iter__",
)  # fmt: skip


def measure(
    policy: str | None, scenario: Scenario, waiting: int, steps: int, model: str
) -> dict[str, float]:
    """Runs in a child process: time every schedule() call of one engine, and the parts
    of it spent in the waiting queue and in the plugin."""
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    os.environ["VLLM_NO_USAGE_STATS"] = "1"
    from vllm import LLM, SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

    options = {}
    if policy is not None:
        config = Path(tempfile.mkdtemp()) / "scheduler.json"
        config.write_text(json.dumps({"policy": policy}))
        os.environ["FAIRPOOL_SCHEDULER_CONFIG"] = str(config)
        options["scheduler_cls"] = "fairpool_engine.vllm.scheduler.FairScheduler"
    llm = LLM(
        model=model, dtype="float32", max_model_len=512, enforce_eager=True, seed=0,
        max_num_seqs=scenario.max_num_seqs, max_num_batched_tokens=1024,
        kv_cache_memory_bytes=scenario.kv_cache_mib << 20,
        **options,
    )  # fmt: skip
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    clock = time.perf_counter_ns
    calls: list[tuple[int, int, int]] = []  # (whole call, vLLM's schedule(), queue) in ns
    queue_ns = 0
    inside = False

    def timed_queue_method(method: Callable[..., object]) -> Callable[..., object]:
        def timed(*args: object, **kwargs: object) -> object:
            nonlocal queue_ns
            if not inside:  # requests added between steps are not part of schedule()
                return method(*args, **kwargs)
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                queue_ns += clock() - start

        return timed

    queue_type = type(scheduler.waiting)
    scheduler.waiting.__class__ = type(
        "Timed" + queue_type.__name__,
        (queue_type,),
        {name: timed_queue_method(getattr(queue_type, name)) for name in QUEUE_METHODS},
    )
    vllm_schedule = Scheduler.schedule
    inner_ns = 0

    def timed_vllm_schedule(self: object, *args: object, **kwargs: object) -> object:
        nonlocal inner_ns
        start = clock()
        try:
            return vllm_schedule(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            inner_ns = clock() - start

    Scheduler.schedule = timed_vllm_schedule  # type: ignore[method-assign]
    whole_call = scheduler.schedule

    def timed_call(*args: object, **kwargs: object) -> object:
        nonlocal inside, queue_ns
        inside, queue_ns = True, 0
        start = clock()
        try:
            return whole_call(*args, **kwargs)
        finally:
            calls.append((clock() - start, inner_ns, queue_ns))
            inside = False

    scheduler.schedule = timed_call
    # update_from_output, where the plugin charges every output token: the whole call,
    # and vLLM's own method inside it.
    updates: list[tuple[int, int]] = []
    vllm_update = Scheduler.update_from_output
    update_inner_ns = 0

    def timed_vllm_update(self: object, *args: object, **kwargs: object) -> object:
        nonlocal update_inner_ns
        start = clock()
        try:
            return vllm_update(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            update_inner_ns = clock() - start

    Scheduler.update_from_output = timed_vllm_update  # type: ignore[method-assign]
    whole_update = scheduler.update_from_output

    def timed_update(*args: object, **kwargs: object) -> object:
        start = clock()
        try:
            return whole_update(*args, **kwargs)
        finally:
            updates.append((clock() - start, update_inner_ns))

    scheduler.update_from_output = timed_update
    added = 0
    # Every tenant's requests share a preamble of two whole KV blocks or more, so that the
    # prefix cache has hits for LPM and DLPM to order by (and to look up).
    preambles = {
        f"t{index}": " ".join(f"tenant t{index} rule {line};" for line in range(40))
        for index in range(TENANTS)
    }

    def top_up() -> None:
        nonlocal added
        while len(scheduler.waiting) < waiting:
            tenant = f"t{added % TENANTS}"
            params = SamplingParams(
                max_tokens=scenario.output_tokens,
                ignore_eos=True,
                extra_args={"fairpool_tenant": tenant},
            )
            prompt = preambles[tenant] + f" request {added}: def f(x): return x * {added}"
            engine.add_request(str(added), prompt, params)
            added += 1

    for _ in range(steps):  # the queue is kept at `waiting` requests all along
        top_up()
        engine.step()
    counted = calls[WARMUP_STEPS:]
    whole = [total / 1000 for total, _, _ in counted]
    return {
        "calls": len(counted),
        "mean_us": statistics.fmean(whole),
        "p50_us": percentile(whole, 0.5),
        "p90_us": percentile(whole, 0.9),
        # vLLM's own work: its schedule() less the waiting queue's methods it called.
        "vllm_us": statistics.fmean((inner - queue) / 1000 for _, inner, queue in counted),
        # The queue's methods plus whatever the plugin does around vLLM's schedule().
        "queue_us": statistics.fmean(
            (total - inner + queue) / 1000 for total, inner, queue in counted
        ),
        # update_from_output: vLLM's own method, and what the plugin adds around it.
        "update_vllm_us": statistics.fmean(inner / 1000 for _, inner in updates[WARMUP_STEPS:]),
        "update_plugin_us": statistics.fmean(
            (total - inner) / 1000 for total, inner in updates[WARMUP_STEPS:]
        ),
    }


def run_child(name: str, scenario: str, waiting: int, steps: int, model: str) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", name, "--scenario", scenario]
    command += ["--waiting", str(waiting), "--steps", str(steps), "--model", model]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} ({scenario}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per configuration, the median over rounds of each figure and of both ratios."""
    results: dict[str, dict[str, float]] = {}
    for name in CONFIGURATIONS:
        runs = [measured[name] for measured in rounds]
        stock_runs = [measured["stock"] for measured in rounds]
        summary = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        summary["same_steps_ratio"] = statistics.median(
            (run["vllm_us"] + run["queue_us"]) / (run["vllm_us"] + stock["queue_us"])
            for run, stock in zip(runs, stock_runs, strict=True)
        )
        summary["update_ratio"] = statistics.median(
            (run["update_vllm_us"] + run["update_plugin_us"])
            / (run["update_vllm_us"] + stock["update_plugin_us"])
            for run, stock in zip(runs, stock_runs, strict=True)
        )
        summary["whole_call_ratio"] = statistics.median(
            run["mean_us"] / stock["mean_us"] for run, stock in zip(runs, stock_runs, strict=True)
        )
        summary["rounds"] = len(runs)
        results[name] = summary
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small run, records nothing")
    parser.add_argument("--waiting", type=int, default=256)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--model", help="model directory (default: build the tiny model)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        scenario = SCENARIOS[args.scenario]
        measured = measure(
            CONFIGURATIONS[args.child], scenario, args.waiting, args.steps, args.model
        )
        print(json.dumps(measured))
        return
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    from fairpool_engine.vllm.tiny_model import build

    model = args.model or str(build(Path(tempfile.gettempdir()) / "fairpool-tiny-llama"))
    steps, rounds = (40, 1) if args.quick else (args.steps, args.rounds)
    scenarios = list(SCENARIOS)[:1] if args.quick else list(SCENARIOS)
    results: dict[str, dict[str, dict[str, float]]] = {}
    tables = []
    for scenario in scenarios:
        measured_rounds = []
        for round_number in range(rounds):
            names = list(CONFIGURATIONS)
            names = names[round_number % len(names) :] + names[: round_number % len(names)]
            measured = {}
            for name in names:
                print(f"{scenario}, round {round_number + 1}/{rounds}: {name} …", file=sys.stderr)
                measured[name] = run_child(name, scenario, args.waiting, steps, model)
            measured_rounds.append(measured)
        results[scenario] = summarize(measured_rounds)
        tables.append(scenario_table(scenario, results[scenario]))
    table = (
        "\n".join(tables)
        + f"\nGoal: ≤ {GOAL_RATIO}× stock per call (the issue's scenario), {args.waiting} "
        + f"waiting, {TENANTS} tenants. Medians over {rounds} interleaved round(s) of "
        + f"{steps} steps ({steps - WARMUP_STEPS} timed calls each).\n"
    )
    print(table)
    if not args.quick:
        write_results("vllm_scheduler", results, table)


def scenario_table(scenario: str, results: dict[str, dict[str, float]]) -> str:
    settings = SCENARIOS[scenario]
    rows = [
        f"### {scenario}: max_num_seqs {settings.max_num_seqs}, "
        f"{settings.output_tokens} output tokens per request\n",
        "| scheduler | vLLM's work µs | queue + plugin µs | **same steps vs stock** "
        "| whole call mean µs | p50 µs | p90 µs | whole call vs stock "
        "| update_from_output: vLLM µs | + plugin µs | same steps vs stock |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        rows.append(
            f"| {name} | {result['vllm_us']:.0f} | {result['queue_us']:.1f} "
            f"| **{result['same_steps_ratio']:.3f}×** | {result['mean_us']:.0f} "
            f"| {result['p50_us']:.0f} | {result['p90_us']:.0f} "
            f"| {result['whole_call_ratio']:.2f}× | {result['update_vllm_us']:.0f} "
            f"| {result['update_plugin_us']:.1f} | {result['update_ratio']:.3f}× |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    main()
