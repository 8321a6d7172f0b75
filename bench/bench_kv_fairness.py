"""Fairness under KV-memory pressure: a pool of four small engines behind the gateway's
front, in the simulator (virtual time: the numbers do not depend on this machine).

The pool: four workers of 2,048 KV tokens (16-token blocks; Llama-3-8B-on-H100 step
times), the gateway's front (D2LPM routing, its fair queue, its saturation hold) and
fair engines; closed-loop clients (each stream sends its next request when its last one
ends), every request a 512-token system prompt its tenant shares, a 32-token question and
a 64-token answer. Weights flood 1 : light 2 (and 1 : 1 for the second backlogged case).

Cases, each for the engines' policy at `vtc`, `dlpm` and `fcfs` (and VTC and DLPM with
memory sharing off, fairpool's behaviour before it: `vtc-noshare`, `dlpm-noshare`):

- `both` — both tenants flooding (96 streams each), weights 1 : 2 and 1 : 1: each
  tenant's part of the service against its weighted share;
- `below` — the light tenant below its share (24 streams against the flood's 96): its
  TTFT p50 against the same 24 streams alone on the pool, measured in the same run
  (goal: ≤ 2× alone + 25 ms), and each tenant's part of the service against its
  entitlement. A tenant's fair share is min(its weighted share, its demand): the light
  tenant's is what it is served alone (as a part of the service of the run beside the
  flood), the flood's the rest;
- each front: the gateway's default saturation hold (`default`), a tighter cap of 16
  requests per worker (`cap16`), and no hold at all (`none`, every request goes to the
  engines at once); throughput is compared with the uncapped run and with FCFS engines.

Fair is two-sided: every share is reported for both tenants against their entitlements,
and its goal holds only if each is within `TOLERANCE` (10 %) of its own — a tenant served
more than its share takes it from the other. Service counts what the engines computed for
each tenant (uncached prompt tokens and 2×
output tokens); throughput is requests finished per second (every request has the same
lengths; service would count a cache miss's recomputation as work done). The window is
[warm-up, end). Run: `python bench/bench_kv_fairness.py`
(`--quick` for a short smoke run that records nothing).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import RESULTS, write_results

from fairpool.api.inference_pool import Saturation
from fairpool.sched.cost import TenantWeights
from fairpool.sim.fleet import ClosedLoop, Fleet, FleetConfig
from fairpool.sim.metrics import percentile
from fairpool.sim.profiles import get_profile

WORKERS, MEMORY, BLOCK = 4, 2048, 16
PREFIX, QUESTION, OUTPUT = 512, 32, 64
FLOOD_STREAMS, LIGHT_BACKLOGGED, LIGHT_BELOW = 96, 96, 24
TENANTS = ("light", "flood")
#: How far, relative to its entitlement, each tenant's part of the service may be.
TOLERANCE = 0.10
POLICIES = {  # label → (engine policy, its parameters)
    "vtc": ("vtc", {}),
    "dlpm": ("dlpm", {}),
    "fcfs": ("fcfs", {}),
    "vtc-noshare": ("vtc", {"share_memory": False}),
    "dlpm-noshare": ("dlpm", {"share_memory": False}),
}
FRONTS: dict[str, Saturation | None] = {
    "default": Saturation(),
    "cap16": Saturation(maxOutstanding=16),
    "none": None,
}


@dataclass(frozen=True)
class Run:
    service: dict[str, float]  # per tenant, in the window
    light_ttft_p50: float | None  # seconds
    preemptions: int
    finished: int  # requests that finished in the window
    window: float

    @property
    def throughput(self) -> float:
        """Requests finished per second (all have the same prompt and answer lengths)."""
        return self.finished / self.window


def run(
    policy: str,
    front: str,
    flood: int,
    light: int,
    weights: dict[str, float],
    duration: float,
    warm: float,
) -> Run:
    name, params = POLICIES[policy]
    config = FleetConfig.from_profile(
        get_profile("llama3-8b-h100"),
        MEMORY,
        BLOCK,
        workers=WORKERS,
        policy=name,
        policy_params=params,
        router="d2lpm",
        saturation=FRONTS[front],
        weights=TenantWeights(weights),
    )
    fleet = Fleet(config)
    clients = [ClosedLoop("light", light, PREFIX, QUESTION, OUTPUT)]
    if flood:
        clients.append(ClosedLoop("flood", flood, PREFIX, QUESTION, OUTPUT))
    recorder = fleet.run([], duration=duration, clients=clients)
    service = {
        tenant: recorder.service_at(tenant, duration) - recorder.service_at(tenant, warm)
        for tenant in ("flood", "light")
    }
    ttft = [
        c.first_token_at - c.request.arrival
        for c in recorder.completions
        if c.request.tenant == "light" and c.request.arrival >= warm
    ]
    finished = sum(1 for c in recorder.completions if warm <= c.finished_at < duration)
    return Run(
        service,
        percentile(ttft, 0.5),
        sum(engine.preemptions for engine in fleet.engines),
        finished,
        duration - warm,
    )


def measure(policy: str, front: str, duration: float, warm: float) -> dict[str, Any]:
    both = run(
        policy, front, FLOOD_STREAMS, LIGHT_BACKLOGGED, {"flood": 1, "light": 2}, duration, warm
    )
    even = run(
        policy, front, FLOOD_STREAMS, LIGHT_BACKLOGGED, {"flood": 1, "light": 1}, duration, warm
    )
    below = run(policy, front, FLOOD_STREAMS, LIGHT_BELOW, {"flood": 1, "light": 2}, duration, warm)
    alone = run(policy, front, 0, LIGHT_BELOW, {"flood": 1, "light": 2}, duration, warm)
    return {
        "policy": policy,
        "front": front,
        "both_light_share": _share(both),
        "both_light_share_1to1": _share(even),
        "both_sides": sides(both, {"light": 2 / 3, "flood": 1 / 3}),
        "both_sides_1to1": sides(even, {"light": 1 / 2, "flood": 1 / 2}),
        "below_sides": sides(below, below_entitlements(below, alone)),
        "both_throughput": round(both.throughput, 1),
        "both_preemptions": both.preemptions,
        "below_light_ttft_p50_ms": _ms(below.light_ttft_p50),
        "alone_light_ttft_p50_ms": _ms(alone.light_ttft_p50),
        "below_light_rate_vs_alone": round(below.service["light"] / alone.service["light"], 3),
        "below_light_share": _share(below),
        "below_throughput": round(below.throughput, 1),
    }


def _share(result: Run) -> float:
    return round(result.service["light"] / sum(result.service.values()), 3)


def sides(result: Run, entitled: dict[str, float]) -> dict[str, dict[str, float]]:
    """Each tenant's part of the service in `result` beside its entitlement."""
    total = sum(result.service.values())
    return {
        tenant: {
            "share": round(result.service[tenant] / total, 3),
            "entitled": round(entitled[tenant], 3),
        }
        for tenant in TENANTS
    }


def below_entitlements(below: Run, alone: Run) -> dict[str, float]:
    """Beside the flood, the light tenant is entitled to its demand — what it is served
    alone, as a part of the service in `below` — and the flood to the rest."""
    demand = alone.service["light"] / sum(below.service.values())
    return {"light": demand, "flood": 1 - demand}


def both_sides_fair(sides: dict[str, dict[str, float]]) -> bool:
    """Is every tenant's part within `TOLERANCE` of its entitlement (above or below)?"""
    return all(abs(side["share"] / side["entitled"] - 1) <= TOLERANCE for side in sides.values())


def _sides_text(sides: dict[str, dict[str, float]]) -> str:
    return ", ".join(
        f"{tenant} {sides[tenant]['share']:.3f}/{sides[tenant]['entitled']:.3f}"
        for tenant in TENANTS
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def verdicts(rows: list[dict[str, Any]]) -> None:
    """Each row's goals, against FCFS engines and the uncapped front of the same run."""
    by_key = {(row["policy"], row["front"]): row for row in rows}
    for row in rows:
        fcfs = by_key.get(("fcfs", row["front"]))
        uncapped = by_key.get((row["policy"], "none"))
        row["goal_both_1to2"] = both_sides_fair(row["both_sides"])
        row["goal_both_1to1"] = both_sides_fair(row["both_sides_1to1"])
        row["goal_below_sides"] = both_sides_fair(row["below_sides"])
        alone = row["alone_light_ttft_p50_ms"]
        row["goal_ttft"] = (
            alone is not None
            and row["below_light_ttft_p50_ms"] is not None
            and row["below_light_ttft_p50_ms"] <= 2 * alone + 25
        )
        row["throughput_vs_fcfs"] = (
            None if fcfs is None else round(row["both_throughput"] / fcfs["both_throughput"], 3)
        )
        row["throughput_vs_uncapped"] = (
            None
            if uncapped is None
            else round(row["both_throughput"] / uncapped["both_throughput"], 3)
        )


def table(rows: list[dict[str, Any]]) -> str:
    within = f"goal: each within {TOLERANCE:.0%} of its own"
    header = (
        "| engines | front | both 1:2: share / entitled "
        f"({within}) | both 1:1: share / entitled | below: light TTFT p50 vs alone (goal ≤ 2× "
        "+ 25 ms) | below: share / entitled (light's: its demand alone) | both 1:2: "
        "requests/s | vs FCFS engines | vs no hold | preemptions |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )

    def mark(ok: bool) -> str:
        return "✓" if ok else "✗"

    lines = []
    for row in rows:
        lines.append(
            f"| {row['policy']} | {row['front']} "
            f"| {_sides_text(row['both_sides'])} {mark(row['goal_both_1to2'])} "
            f"| {_sides_text(row['both_sides_1to1'])} {mark(row['goal_both_1to1'])} "
            f"| {row['below_light_ttft_p50_ms']} ms vs {row['alone_light_ttft_p50_ms']} ms "
            f"{mark(row['goal_ttft'])} "
            f"| {_sides_text(row['below_sides'])} {mark(row['goal_below_sides'])} "
            f"| {row['both_throughput']:,.1f} "
            f"| {_ratio(row['throughput_vs_fcfs'])} | {_ratio(row['throughput_vs_uncapped'])} "
            f"| {row['both_preemptions']:,} |"
        )
    return header + "\n".join(lines) + "\n"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [row for row in rows if row["front"] == "default"]
    labels = [row["policy"] for row in shown]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    panels = (
        (left, "both_sides", "both flooding (1:2)"),
        (right, "below_sides", "light below its share"),
    )
    positions = range(len(shown))
    for axis, key, title in panels:
        bars = zip(TENANTS, (-0.2, 0.2), ("tab:blue", "tab:orange"), strict=True)
        for tenant, offset, color in bars:
            ratios = [row[key][tenant]["share"] / row[key][tenant]["entitled"] for row in shown]
            axis.bar([p + offset for p in positions], ratios, 0.4, color=color, label=tenant)
        axis.axhspan(1 - TOLERANCE, 1 + TOLERANCE, color="tab:green", alpha=0.15, label="goal")
        axis.axhline(1, color="black", linestyle="--", linewidth=0.8)
        axis.set_xticks(list(positions), labels)
        axis.set_title(f"{title}: share / entitlement", fontsize=10)
        axis.set_ylim(0, 1.6)
        axis.legend(loc="lower right", fontsize=8)
    for axis in (left, right):
        axis.tick_params(axis="x", labelrotation=20)
    figure.suptitle("4 engines × 2,048 KV tokens, gateway front with its default hold")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run, not recorded")
    parser.add_argument("--duration", type=float, default=120.0, help="virtual seconds a run")
    parser.add_argument("--warm", type=float, default=30.0, help="virtual seconds left out")
    args = parser.parse_args()
    if args.quick:
        plan = [("vtc", "default"), ("fcfs", "default"), ("vtc", "none")]
        duration, warm = 12.0, 4.0
    else:
        plan = [(policy, front) for front in FRONTS for policy in ("vtc", "dlpm", "fcfs")]
        plan += [("vtc-noshare", "default"), ("dlpm-noshare", "default")]
        duration, warm = args.duration, args.warm
    rows = []
    for index, (policy, front) in enumerate(plan, 1):
        print(f"[{index}/{len(plan)}] {policy} engines, front {front}", file=sys.stderr, flush=True)
        rows.append(measure(policy, front, duration, warm))
    verdicts(rows)
    text = table(rows)
    print(text)
    if args.quick:
        return
    settings = {
        "workers": WORKERS,
        "memory_tokens": MEMORY,
        "block_size": BLOCK,
        "profile": "llama3-8b-h100",
        "request": {"prefix": PREFIX, "question": QUESTION, "output": OUTPUT},
        "streams": {
            "flood": FLOOD_STREAMS,
            "light_backlogged": LIGHT_BACKLOGGED,
            "light_below": LIGHT_BELOW,
        },
        "duration_s": duration,
        "warm_s": warm,
    }
    write_results("kv_fairness", {"settings": settings, "rows": rows}, text)
    plot(rows, RESULTS / "kv_fairness.png")


if __name__ == "__main__":
    main()
