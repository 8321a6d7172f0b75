"""Cost of fairpool's scheduler inside vLLM: time per `schedule()` call, against stock
vLLM's scheduler, with 256 requests waiting across 20 tenants.

Goal (issue): at most 1.05× stock's time per call.

Each configuration runs in its own process on vLLM's CPU build with the tiny local
model, its engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that the scheduler
object can be timed directly. Before every step the waiting queue is topped up to 256
requests (20 tenants in turn, each tenant's prompts sharing a preamble of two or more KV
blocks, 16 output tokens each, `max_num_seqs` 16), so every timed
call sees the steady state the goal is about; the first 20 calls are not counted. The
model's forward pass is not timed; it is what a real GPU step
spends most of its time in, and the ratio of schedule() times is what the goal asks.

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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results

CONFIGURATIONS = {
    "stock": None,
    "fairpool dlpm": "dlpm",
    "fairpool vtc": "vtc",
    "fairpool lpm": "lpm",
}
TENANTS = 20
WARMUP_STEPS = 20
GOAL_RATIO = 1.05


def measure(policy: str | None, waiting: int, steps: int, model: str) -> dict[str, float]:
    """Runs in a child process: time every schedule() call of one engine."""
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    os.environ["VLLM_NO_USAGE_STATS"] = "1"
    from vllm import LLM, SamplingParams

    options = {}
    if policy is not None:
        config = Path(tempfile.mkdtemp()) / "scheduler.json"
        config.write_text(json.dumps({"policy": policy}))
        os.environ["FAIRPOOL_SCHEDULER_CONFIG"] = str(config)
        options["scheduler_cls"] = "fairpool_engine.vllm_scheduler.FairScheduler"
    llm = LLM(
        model=model, dtype="float32", max_model_len=512, enforce_eager=True, seed=0,
        max_num_seqs=16, max_num_batched_tokens=1024, kv_cache_memory_bytes=64 << 20,
        **options,
    )  # fmt: skip
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    all_calls: list[float] = []
    original = scheduler.schedule

    def timed(*args: object, **kwargs: object) -> object:
        start = time.perf_counter_ns()
        output = original(*args, **kwargs)
        all_calls.append((time.perf_counter_ns() - start) / 1000)
        return output

    scheduler.schedule = timed
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
                max_tokens=16, ignore_eos=True, extra_args={"fairpool_tenant": tenant}
            )
            prompt = preambles[tenant] + f" request {added}: def f(x): return x * {added}"
            engine.add_request(str(added), prompt, params)
            added += 1

    for _ in range(steps):  # the queue is kept at `waiting` requests all along
        top_up()
        engine.step()
    all_calls[:WARMUP_STEPS] = []
    return {
        "calls": len(all_calls),
        "mean_us": statistics.fmean(all_calls),
        "p50_us": statistics.median(all_calls),
        "p90_us": statistics.quantiles(all_calls, n=10)[-1],
    }


def run_child(name: str, waiting: int, steps: int, model: str) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", name, "--waiting", str(waiting)]
    command += ["--steps", str(steps), "--model", model]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small run, records nothing")
    parser.add_argument("--waiting", type=int, default=256)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--model", help="model directory (default: build the tiny model)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measured = measure(CONFIGURATIONS[args.child], args.waiting, args.steps, args.model)
        print(json.dumps(measured))
        return
    from fairpool_engine.tiny_model import build

    model = args.model or str(build(Path(tempfile.gettempdir()) / "fairpool-tiny-llama"))
    steps = 40 if args.quick else args.steps
    results = {}
    for name in CONFIGURATIONS:
        print(f"{name} …", file=sys.stderr)
        results[name] = run_child(name, args.waiting, steps, model)
    stock = results["stock"]
    rows = [
        "| scheduler | timed calls | mean µs | p50 µs | p90 µs | mean vs stock |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        ratio = result["mean_us"] / stock["mean_us"]
        result["ratio_to_stock"] = round(ratio, 3)
        rows.append(
            f"| {name} | {result['calls']} | {result['mean_us']:.0f} | {result['p50_us']:.0f} "
            f"| {result['p90_us']:.0f} | {ratio:.2f}× |"
        )
    table = (
        "\n".join(rows)
        + f"\n\nGoal: ≤ {GOAL_RATIO}× stock per call, {args.waiting} waiting, {TENANTS} tenants.\n"
    )
    print(table)
    if not args.quick:
        write_results("vllm_scheduler", results, table)


if __name__ == "__main__":
    main()
