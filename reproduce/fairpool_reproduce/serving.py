"""Reproductions of seeds 002 and 004: memory-safe admission and SLO-aware batching.

- [KV] Jaillet, Jiang, Podimata, Zhou, *Online Scheduling for LLM Inference with KV Cache
  Constraints* (arXiv 2502.07115 v1), §6: Algorithm 2 (MC-SF) against the six vLLM-like
  α-protection baselines on about 10,000 LMSYS-like requests, Llama-2-70B on two A100s
  (M = 16,492). Headlines: memory never over M; average latency grows linearly with the
  arrival count, the best baseline's slope ≈ 3× MC-SF's at λ = 50/s and ≈ 8× at λ = 10/s.
- [RAD] Bari, Hegde, de Veciana, *Optimal Scheduling Algorithms for LLM Inference*, §7
  and App. F.2: SLAI (and RAD, the paper's Algorithm 1) against Sarathi-Serve, Mistral-7B
  on one RTX 6000 Ada, paying (TBT 0.1 s) and free (TBT 0.5 s) users. Headlines: median
  TTFT 1.5 s → 0.7 s (−53 %) under high load, capacity at median TTFT ≤ 0.5 s with the
  TBT targets met 1.15 → 1.45 req/s. RAD's Theorem 2 (stability below its capacity) in
  the simulator.

Every configuration runs over `stats.SEEDS` (own arrivals and lengths per seed); tables
print means with 95 % intervals and every sentence is chosen from those numbers.
`fairpool_reproduce.results` writes these sections into `docs/results.md`;
`python -m fairpool_reproduce --only serving` regenerates just them.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fairpool.sim.metrics import percentile
from fairpool.sim.plots import pyplot, save
from fairpool.sim.stability import StabilityExperiment
from fairpool_reproduce.stats import SEEDS, Estimate, estimate

KV_PROFILE = "llama2-70b-2xa100"
KV_ARRIVALS = 10_000
#: The paper's two rates, and two between them (see the section's text for why).
KV_RATES = (10.0, 15.0, 20.0, 50.0)
KV_SCHEMES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("MC-SF (Alg. 2)", "mcsf", {}),
    ("α = 0.3 greedy", "alpha_protection", {"alpha": 0.3}),
    ("α = 0.25 greedy", "alpha_protection", {"alpha": 0.25}),
    ("α = 0.2, β = 0.2", "alpha_protection", {"alpha": 0.2, "beta": 0.2}),
    ("α = 0.2, β = 0.1", "alpha_protection", {"alpha": 0.2, "beta": 0.1}),
    ("α = 0.1, β = 0.2", "alpha_protection", {"alpha": 0.1, "beta": 0.2}),
    ("α = 0.1, β = 0.1", "alpha_protection", {"alpha": 0.1, "beta": 0.1}),
)
PAPER_SLOPE_RATIO = {50.0: 3.0, 10.0: 8.0}

SLO_PROFILE = "mistral-7b-rtx6000"
SLO_RATES = tuple(0.5 + 0.25 * step for step in range(11))  # 0.5 … 3.0 req/s
SLO_TARGETS = {"paying": 0.1, "free": 0.5}
TTFT_TARGET = 0.5
#: [RAD] Fig. 6: Sarathi-Serve's median TTFT "under high load", where SLAI's is 0.7 s.
PAPER_SARATHI_TTFT = 1.5
BASELINE = "Sarathi-Serve (FCFS)"
HEADLINE = "SLAI (SPF, dynamic δ)"
PRIORITY = "SLAI (SPF, dynamic δ, paying first)"
RAD = "RAD (Alg. 1)"
SLO_SCHEMES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (BASELINE, "sarathi", {}),
    ("SLAI (SPF, fixed δ = 10)", "slai", {"offset": 10.0}),
    (HEADLINE, "slai", {"offset": "dynamic"}),
    (PRIORITY, "slai", {"offset": "dynamic", "tighter_slo_first": True}),
    (RAD, "rad", {}),
)


# --------------------------------------------------------------------------- [KV] §6


def latency_slope(run: Any, points: int = 8) -> tuple[float, list[tuple[int, float]]]:
    """Average end-to-end latency of the first N arrivals, for growing N, and its
    least-squares slope in seconds per arrival ([KV] Figs. 7 and 10's axes)."""
    finished = sorted(run.recorder.completions, key=lambda c: c.request.arrival)
    latencies = [c.finished_at - c.request.arrival for c in finished]
    total = len(latencies)
    curve = []
    for index in range(1, points + 1):
        count = max(1, total * index // points)
        curve.append((count, statistics.fmean(latencies[:count])))
    xs = [float(count) for count, _ in curve]
    ys = [value for _, value in curve]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return slope, curve


def _kv_run(rate: float, policy: str, params: dict[str, Any], seed: int, scale: float) -> dict:  # type: ignore[type-arg]
    from fairpool_reproduce.results import run_fleet

    run = run_fleet(
        "lmsys_like",
        KV_ARRIVALS / rate * scale,
        policy=policy,
        profile=KV_PROFILE,
        drain=True,
        seed=seed,
        params={"rate": rate},
        policy_params={**params, "seed": seed} if "beta" in params else params,
    )
    slope, curve = latency_slope(run)
    assert run.fleet is not None
    engine = run.fleet.engines[0]
    return {
        "slope": slope,
        "curve": curve,
        "mean_latency": statistics.fmean(
            c.finished_at - c.request.arrival for c in run.recorder.completions
        ),
        "finished": len(run.recorder.completions),
        "requests": len(run.trace),
        "peak_memory": engine.peak_memory,
        "memory": engine.memory_tokens,
        "preemptions": engine.preemptions,
    }


def memory_safe_vs_alpha(
    scale: float = 1.0, seeds: Sequence[int] = SEEDS, rates: Sequence[float] = KV_RATES
) -> dict[str, Any]:
    """[KV] §6: every scheme at each rate, about 10,000 arrivals (× `scale`) per seed."""
    results: dict[str, Any] = {"seeds": list(seeds), "arrivals": KV_ARRIVALS * scale, "rates": []}
    for rate in rates:
        rows = []
        for label, policy, params in KV_SCHEMES:
            runs = [_kv_run(rate, policy, params, seed, scale) for seed in seeds]
            rows.append(
                {
                    "label": label,
                    "policy": policy,
                    "runs": runs,
                    "slope": estimate(r["slope"] for r in runs),
                    "mean_latency": estimate(r["mean_latency"] for r in runs),
                    "peak_memory": max(r["peak_memory"] for r in runs),
                    "memory": runs[0]["memory"],
                    "preemptions": sum(r["preemptions"] for r in runs),
                    "overflowed_runs": sum(r["preemptions"] > 0 for r in runs),
                    "finished": sum(r["finished"] for r in runs),
                    "requests": sum(r["requests"] for r in runs),
                }
            )
        results["rates"].append({"rate": rate, "rows": rows, **_kv_comparison(rows)})
    results["simulations"] = len(rates) * len(KV_SCHEMES) * len(seeds)
    return results


def _kv_comparison(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The best baseline (lowest mean latency) against MC-SF, per seed: the ratio of mean
    latencies always, the ratio of slopes only where MC-SF's slope is measurably above 0
    (a ratio over a slope whose interval holds 0 says nothing)."""
    ours, baselines = rows[0], rows[1:]
    best = min(baselines, key=lambda row: row["mean_latency"].mean)
    pairs = list(zip(best["runs"], ours["runs"], strict=True))
    slope_ratio = (
        estimate(b["slope"] / o["slope"] for b, o in pairs) if ours["slope"].above(0) else None
    )
    return {
        "best": best["label"],
        "latency_ratio": estimate(b["mean_latency"] / o["mean_latency"] for b, o in pairs),
        "slope_ratio": slope_ratio,
        "ours_grows": ours["slope"].above(0),
        "best_grows": best["slope"].above(0),
    }


def plot_memory_safe(data: dict[str, Any], path: Path) -> Path:
    shown = [entry for entry in data["rates"] if entry["rate"] in (10.0, 50.0)] or data["rates"]
    figure, axes = pyplot().subplots(1, len(shown), figsize=(5.5 * len(shown), 4), squeeze=False)
    for axis, entry in zip(axes[0], shown, strict=True):
        for row in entry["rows"]:
            curve = row["runs"][0]["curve"]
            axis.plot(
                [count for count, _ in curve],
                [mean for _, mean in curve],
                marker="o",
                markersize=3,
                label=row["label"],
            )
        axis.set_title(f"λ = {entry['rate']:.0f}/s (seed {data['seeds'][0]})", fontsize=9)
        axis.set_xlabel("arrivals N")
        axis.set_ylabel("average latency of the first N (s)")
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    figure.suptitle("Memory-safe admission (MC-SF) vs α-protection, Llama-2-70B, M = 16,492")
    return save(figure, path)


def section_memory_safe(data: dict[str, Any]) -> list[str]:
    seeds = len(data["seeds"])
    lines = [
        "## 6. Memory-safe admission vs α-protection (seed 002, §6)",
        "",
        f"Workload `lmsys_like` (LMSYS-Chat-like lengths, Poisson), about "
        f"{data['arrivals']:,.0f} arrivals per run (the paper: 10,000), profile "
        f"`{KV_PROFILE}` (M = 16,492 tokens, paged admission with recompute on overflow), "
        f"each scheme run until every request finished, over {seeds} seeds (mean ± 95 % "
        "interval). The schemes are the paper's seven: MC-SF and its six α-protection "
        "baselines. Slope: least-squares slope of the average latency of the first N "
        "arrivals against N. Overflows: runs (of "
        f"{seeds}) in which memory ran out and running requests were cleared.",
        "",
        "| λ | scheme | slope (ms/arrival) | mean latency (s) | peak KV / M | overflows (runs) |",
        "|---|---|---|---|---|---|",
    ]
    for entry in data["rates"]:
        for row in entry["rows"]:
            slope = row["slope"]
            lines.append(
                f"| {entry['rate']:.0f}/s | {row['label']} | "
                f"{Estimate(slope.mean * 1e3, slope.half_width * 1e3, slope.n).format(3)} | "
                f"{row['mean_latency'].format(1)} | {row['peak_memory']:,} / {row['memory']:,} "
                f"| {row['preemptions']:,} ({row['overflowed_runs']}) |"
            )
    lines += ["", "| measure | paper | ours |", "|---|---|---|"]
    ours_rows = [entry["rows"][0] for entry in data["rates"]]
    peak = max(row["peak_memory"] for row in ours_rows)
    memory = ours_rows[0]["memory"]
    cleared = sum(row["preemptions"] for row in ours_rows)
    lines.append(
        f"| MC-SF's KV memory | never over M (Figs. 8, 11) | peak {peak:,} "
        f"{'≤' if peak <= memory else '>'} {memory:,}, "
        f"{'no overflow' if cleared == 0 else f'{cleared:,} requests cleared'} |"
    )
    for entry in data["rates"]:
        paper = PAPER_SLOPE_RATIO.get(entry["rate"])
        if paper is None:
            continue
        lines.append(
            f"| best baseline slope / MC-SF slope, λ = {entry['rate']:.0f}/s | ≈ {paper:.0f} (§6) "
            f"| {_slope_ratio(entry)} |"
        )
        lines.append(
            f"| best baseline mean latency / MC-SF's, λ = {entry['rate']:.0f}/s | — "
            f"| {entry['latency_ratio'].format(2)} ({entry['best']}) |"
        )
    for entry in data["rates"]:
        if entry["rate"] not in PAPER_SLOPE_RATIO and entry["slope_ratio"] is not None:
            lines.append(
                f"| best baseline slope / MC-SF slope, λ = {entry['rate']:.0f}/s (both grow) "
                f"| — | {_slope_ratio(entry)} |"
            )
    lines += [
        "",
        "![memory-safe vs alpha-protection](img/results-memory-safe.png)",
        "",
        *_memory_safe_notes(data),
    ]
    return lines


def _slope_ratio(entry: dict[str, Any]) -> str:
    if entry["slope_ratio"] is None:
        return "undefined: MC-SF's slope interval includes 0"
    return f"{entry['slope_ratio'].format(2)} ({entry['best']})"


def _memory_safe_notes(data: dict[str, Any]) -> list[str]:
    notes = [
        "The paper's request sizes are word counts from LMSYS-Chat-1M and its batch times "
        "come from Vidur; ours are lognormal lengths matched to the same means and medians "
        "and first-principles step times, so compare orderings and ratios, not absolute "
        "slopes (whose units the paper leaves unclear)."
    ]
    calm = [e for e in data["rates"] if not any(row["overflowed_runs"] for row in e["rows"])]
    if calm:
        notes.append(f"At {_lambdas(calm)} no scheme ever overflowed memory.")
    for entry in data["rates"]:
        overflowing = [row["label"] for row in entry["rows"] if row["overflowed_runs"]]
        if overflowing:
            notes.append(
                f"At {_lambdas([entry])} memory overflowed under {_join(overflowing)}: the "
                "paper's failure mode, running requests cleared and recomputed."
            )
    flat = [e for e in data["rates"] if not e["ours_grows"] and not e["best_grows"]]
    if flat:
        notes.append(
            f"At {_lambdas(flat)} neither MC-SF's nor the best baseline's slope is measurably "
            "above 0, so there is no growth rate to compare."
        )
    for entry in data["rates"]:
        ours, best = entry["rows"][0], _row(entry, entry["best"])
        if entry["ours_grows"] and entry["best_grows"]:
            notes.append(
                f"At {_lambdas([entry])} both queues grow: the best baseline's slope "
                f"({entry['best']}) is {entry['slope_ratio'].format(1)}× MC-SF's, seed by seed."
            )
        elif entry["best_grows"]:
            low = data["rates"][0]["rows"][0]["mean_latency"]
            notes.append(
                f"At {_lambdas([entry])} only the baselines' slopes are measurably above 0 "
                f"({entry['best']}: {_ms(best['slope'])}); MC-SF's is {_ms(ours['slope'])}"
                + (
                    ", below 0, though its mean latency is "
                    f"{ours['mean_latency'].mean / low.mean:.0f}× its "
                    f"{data['rates'][0]['rate']:.0f}/s value: shortest-first serves later "
                    "short requests ahead of earlier long ones, so the average over the "
                    "first N arrivals does not rise with N, and the slope stops measuring "
                    "its overload"
                    if ours["slope"].mean < 0
                    else ""
                )
                + f". The paired mean-latency ratio there is {entry['latency_ratio'].format(1)}."
            )
    paper_low = next((e for e in data["rates"] if e["rate"] == 10.0), None)
    growing = [e for e in data["rates"] if e["best_grows"]]
    if paper_low is not None and not paper_low["best_grows"] and growing:
        notes.append(
            "The paper's λ = 10/s was still overloaded on its hardware; on our profile the "
            f"lowest rate of the sweep at which the best baseline's queue grows is "
            f"{growing[0]['rate']:.0f}/s, which is why the sweep includes rates between the "
            "paper's two."
        )
    return [" ".join(notes), ""]


def _lambdas(entries: Sequence[dict[str, Any]]) -> str:
    return "λ = " + _join([f"{entry['rate']:.0f}/s" for entry in entries])


def _row(entry: dict[str, Any], label: str) -> dict[str, Any]:
    return next(row for row in entry["rows"] if row["label"] == label)


def _ms(slope: Estimate) -> str:
    return Estimate(slope.mean * 1e3, slope.half_width * 1e3, slope.n).format(3, " ms/arrival")


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# --------------------------------------------------------------------------- [RAD] §7


def _slo_run(rate: float, policy: str, params: dict[str, Any], seed: int, scale: float) -> dict:  # type: ignore[type-arg]
    from fairpool_reproduce.results import run_fleet

    run = run_fleet(
        "slo_tiers",
        60.0 * scale,
        policy=policy,
        profile=SLO_PROFILE,
        drain=True,  # every request's TTFT counts, not only those done in time
        seed=seed,
        params={"rate": rate, "paying_fraction": 0.05},
        policy_params=params,
    )
    completions = run.recorder.completions
    ttfts = [c.first_token_at - c.request.arrival for c in completions]
    by_tier = {tier: [c for c in completions if c.request.tenant == tier] for tier in SLO_TARGETS}
    return {
        "median_ttft": statistics.median(ttfts) if ttfts else None,
        "mean_ttft": {
            tier: statistics.fmean(c.first_token_at - c.request.arrival for c in done)
            if done
            else None
            for tier, done in by_tier.items()
        },
        "tbt_p99": {
            tier: percentile((gap for c in done for gap in c.token_gaps), 0.99)
            for tier, done in by_tier.items()
        },
        "finished": len(completions),
        "requests": len(run.trace),
    }


def slai_vs_sarathi(
    scale: float = 1.0,
    seeds: Sequence[int] = SEEDS,
    rates: Sequence[float] = SLO_RATES,
    schemes: Sequence[tuple[str, str, dict[str, Any]]] = SLO_SCHEMES,
) -> dict[str, Any]:
    """[RAD] §7: median TTFT and P99 TBT per tier for each scheme over a grid of rates,
    `60 × scale` s of arrivals per run, each (scheme, rate) over `seeds`."""
    results: dict[str, Any] = {
        "duration": 60.0 * scale,
        "seeds": list(seeds),
        "rates": list(rates),
        "schemes": {},
    }
    for label, policy, params in schemes:
        per_seed = {
            seed: [_slo_run(rate, policy, params, seed, scale) for rate in rates] for seed in seeds
        }
        points = []
        for index, rate in enumerate(rates):
            runs = [per_seed[seed][index] for seed in seeds]
            points.append(
                {
                    "rate": rate,
                    "median_ttft": _estimate_some(r["median_ttft"] for r in runs),
                    "tbt_p99": {
                        tier: _estimate_some(r["tbt_p99"][tier] for r in runs)
                        for tier in SLO_TARGETS
                    },
                    "mean_ttft": {
                        tier: _estimate_some(r["mean_ttft"][tier] for r in runs)
                        for tier in SLO_TARGETS
                    },
                    "finished": sum(r["finished"] for r in runs),
                    "requests": sum(r["requests"] for r in runs),
                }
            )
        results["schemes"][label] = {
            "policy": policy,
            "points": points,
            "capacity": estimate(
                _capacity(rates, per_seed[seed], with_tbt=False) for seed in seeds
            ),
            "capacity_tbt": estimate(
                _capacity(rates, per_seed[seed], with_tbt=True) for seed in seeds
            ),
        }
    results["stability"] = rad_stability(scale, seeds)
    results["simulations"] = (
        len(schemes) * len(rates) * len(seeds) + results["stability"]["simulations"]
    )
    return results


def _estimate_some(values: Any) -> Estimate | None:
    present = [value for value in values if value is not None]
    return estimate(present) if present else None


def _capacity(rates: Sequence[float], runs: Sequence[dict[str, Any]], with_tbt: bool) -> float:
    """One seed's largest rate with median TTFT ≤ 0.5 s (interpolated between grid rates,
    [RAD] §7's capacity); `with_tbt`: and no larger than the last grid rate before the
    first at which a tier's P99 TBT misses its target (0 if the first already does)."""
    curve = [
        (rate, run["median_ttft"])
        for rate, run in zip(rates, runs, strict=True)
        if run["median_ttft"] is not None
    ]
    if with_tbt:
        meets = [
            all(
                run["tbt_p99"][tier] is None or run["tbt_p99"][tier] <= target
                for tier, target in SLO_TARGETS.items()
            )
            for run in runs
        ]
        first_miss = meets.index(False) if False in meets else len(meets)
        if first_miss == 0:
            return 0.0
        return min(capacity(curve[:first_miss]), rates[first_miss - 1])
    return capacity(curve)


def capacity(curve: Sequence[tuple[float, float]], target: float = TTFT_TARGET) -> float:
    """The largest rate whose median TTFT stays ≤ `target` on a curve of (rate, median
    TTFT), interpolating linearly between the measured rates; 0 when the first rate already
    misses, the last rate when none does."""
    previous: tuple[float, float] | None = None
    for rate, ttft in curve:
        if ttft > target:
            if previous is None:
                return 0.0
            low_rate, low_ttft = previous
            return low_rate + (rate - low_rate) * (target - low_ttft) / (ttft - low_ttft)
        previous = (rate, ttft)
    return 0.0 if previous is None else previous[0]


def crossing(curve: Sequence[tuple[float, float]], level: float) -> float | None:
    """The first rate at which a rising curve reaches `level` (interpolated), or None."""
    for (low_rate, low), (high_rate, high) in itertools.pairwise(curve):
        if low <= level <= high and high > low:
            return low_rate + (high_rate - low_rate) * (level - low) / (high - low)
    return None


def value_at(curve: Sequence[tuple[float, float]], rate: float) -> float:
    """A curve's value at `rate`, interpolated between its grid rates."""
    for (low_rate, low), (high_rate, high) in itertools.pairwise(curve):
        if low_rate <= rate <= high_rate:
            return low + (high - low) * (rate - low_rate) / (high_rate - low_rate)
    raise ValueError(f"{rate} is outside the curve's rates")


def ttft_curve(scheme: dict[str, Any]) -> list[tuple[float, float]]:
    return [
        (point["rate"], point["median_ttft"].mean)
        for point in scheme["points"]
        if point["median_ttft"] is not None
    ]


def plot_slai(data: dict[str, Any], path: Path) -> Path:
    figure, (ttft_axis, tbt_axis) = pyplot().subplots(1, 2, figsize=(11, 4))
    for label, scheme in data["schemes"].items():
        points = [p for p in scheme["points"] if p["median_ttft"] is not None]
        rates = [p["rate"] for p in points]
        ttft_axis.errorbar(
            rates,
            [p["median_ttft"].mean for p in points],
            yerr=[p["median_ttft"].half_width for p in points],
            marker="o",
            markersize=3,
            capsize=2,
            label=label,
        )
        paying = [p["tbt_p99"]["paying"] for p in points]
        tbt_axis.plot(
            [r for r, e in zip(rates, paying, strict=True) if e is not None],
            [e.mean for e in paying if e is not None],
            marker="o",
            markersize=3,
            label=label,
        )
    ttft_axis.axhline(TTFT_TARGET, color="grey", linestyle="--", linewidth=1)
    ttft_axis.set_yscale("log")
    ttft_axis.set_xlabel("arrival rate (requests/s)")
    ttft_axis.set_ylabel("median TTFT (s), mean ± 95 % over seeds")
    tbt_axis.axhline(SLO_TARGETS["paying"], color="grey", linestyle="--", linewidth=1)
    tbt_axis.set_xlabel("arrival rate (requests/s)")
    tbt_axis.set_ylabel("paying users' P99 TBT (s)")
    for axis in (ttft_axis, tbt_axis):
        axis.grid(alpha=0.3)
    ttft_axis.legend(fontsize=7)
    figure.suptitle("SLAI vs Sarathi-Serve, Mistral-7B, 5 % paying users", fontsize=9)
    return save(figure, path)


def section_slai(data: dict[str, Any]) -> list[str]:
    schemes = data["schemes"]
    labels = list(schemes)
    lines = [
        "## 7. SLAI vs Sarathi-Serve (seed 004, §7 and App. F.2)",
        "",
        f"Workload `slo_tiers` (5 % paying users with TBT 0.1 s, the rest 0.5 s; "
        f"openchat_shareGPT4-like lengths), profile `{SLO_PROFILE}`, "
        f"{data['duration']:.0f} s of arrivals per run, run until every request finished, "
        f"each point over {len(data['seeds'])} seeds (mean ± 95 % interval). Every scheme "
        "uses the paper's 512-token budget; SLAI its α = β = 128. The headline variant is "
        f"{HEADLINE} (δ = 5 below 96 % KV use, else 10); {PRIORITY} is App. F.2's; "
        f"{RAD} is the paper's throughput-optimal scheduler (its A100 tiles: 256-token "
        "prefill chunks, decode batches of at most 128), which the paper analyses but does "
        "not run in §7. "
        "Not run: Sarathi-Serve (SPF) and vLLM's prefill-first scheduler.",
        "",
        "Median TTFT (s):",
        "",
        *_table(
            ["rate (req/s)", *labels, f"{HEADLINE} vs {BASELINE}"],
            [
                [
                    f"{rate:.2f}",
                    *(_seconds(schemes[label]["points"][index]["median_ttft"]) for label in labels),
                    _change(
                        schemes[HEADLINE]["points"][index]["median_ttft"],
                        schemes[BASELINE]["points"][index]["median_ttft"],
                    ),
                ]
                for index, rate in enumerate(data["rates"])
            ],
        ),
        "",
        "P99 time between tokens (ms), paying (target 100) / free (target 500); — where a "
        "tier had no request; ✗ where the mean over seeds misses the target:",
        "",
        *_table(
            ["rate (req/s)", *labels],
            [
                [f"{rate:.2f}", *(_tbt_cell(schemes[label]["points"][index]) for label in labels)]
                for index, rate in enumerate(data["rates"])
            ],
        ),
        "",
        *_slai_headlines(data),
        "",
        "![SLAI vs Sarathi](img/results-slai.png)",
        "",
        *_slai_notes(data),
        *(section_rad_stability(data["stability"]) if "stability" in data else []),
    ]
    return lines


def _tbt_cell(point: dict[str, Any]) -> str:
    cells = []
    for tier, target in SLO_TARGETS.items():
        value = point["tbt_p99"][tier]
        mark = "" if value is None or value.mean <= target else " ✗"
        cells.append("—" if value is None else f"{value.mean * 1e3:.1f}{mark}")
    return " / ".join(cells)


def _seconds(value: Estimate | None) -> str:
    return "—" if value is None else value.format(2)


def _change(ours: Estimate | None, theirs: Estimate | None) -> str:
    if ours is None or theirs is None or not theirs.mean:
        return "—"
    return f"{ours.mean / theirs.mean - 1:+.0%}"


def _slai_headlines(data: dict[str, Any]) -> list[str]:
    schemes = data["schemes"]
    baseline, headline = schemes[BASELINE], schemes[HEADLINE]
    at = crossing(ttft_curve(baseline), PAPER_SARATHI_TTFT)
    reduction = (
        "— (the baseline's median TTFT never reaches 1.5 s on the grid)"
        if at is None
        else f"{value_at(ttft_curve(headline), at):.2f} s at {at:.2f} req/s, where the baseline's "
        f"is 1.5 s ({value_at(ttft_curve(headline), at) / PAPER_SARATHI_TTFT - 1:+.0%})"
    )
    rows = [
        ["measure", "paper", "ours"],
        [
            f"median TTFT, {HEADLINE}, where {BASELINE}'s is 1.5 s",
            "0.7 s, −53 % (Fig. 6)",
            reduction,
        ],
        [
            "capacity, median TTFT ≤ 0.5 s",
            "1.15 → 1.45 req/s, +26 % (§7)",
            _capacity_cell(baseline["capacity"], headline["capacity"]),
        ],
        [
            "capacity, median TTFT ≤ 0.5 s and both tiers' P99 TBT met",
            "1.15 → 1.45 req/s (§7: targets met)",
            _capacity_cell(baseline["capacity_tbt"], headline["capacity_tbt"]),
        ],
    ]
    return _table(rows[0], rows[1:])


def _capacity_cell(baseline: Estimate, ours: Estimate) -> str:
    """The two capacities and the gain — as a ratio only where the baseline is told apart
    from 0 (its interval above it): a ratio over a baseline that may be 0 measures
    nothing, so there the cell gives the direction only."""
    if baseline.low > 0:
        gain = f" ({ours.mean / baseline.mean - 1:+.0%})"
    elif ours.mean != baseline.mean:
        direction = "higher" if ours.mean > baseline.mean else "lower"
        gain = f" ({direction}; direction only: the baseline's interval includes 0)"
    else:
        gain = ""
    return f"{baseline.format(2)} → {ours.format(2)} req/s{gain}"


def _slai_notes(data: dict[str, Any]) -> list[str]:
    schemes = data["schemes"]
    notes = []
    for label, scheme in schemes.items():
        measured = [p for p in scheme["points"] if p["tbt_p99"]["paying"] is not None]
        met = [p["rate"] for p in measured if p["tbt_p99"]["paying"].mean <= SLO_TARGETS["paying"]]
        missed = [p["rate"] for p in measured if p["rate"] not in met]
        if not missed:
            notes.append(f"{label} meets the paying tier's 0.1 s P99 TBT at every rate.")
        elif not met:
            notes.append(f"{label} misses the paying tier's 0.1 s P99 TBT at every rate.")
        else:
            notes.append(
                f"{label} meets the paying tier's 0.1 s P99 TBT at {_rates(met)} and misses it "
                f"at {_rates(missed)}."
            )
    notes.append(
        "A paying decode is due whenever δ·t̄_batch ≥ 0.1 s, so its P99 TBT is the P99 batch "
        "time: where it misses 0.1 s, a 512-token batch takes longer than that on this "
        "profile (a first-principles estimate of the paper's GPU, not a measurement)."
    )
    if RAD in schemes and BASELINE in schemes:
        rad, baseline = schemes[RAD], schemes[BASELINE]
        top = len(data["rates"]) - 1
        rad_ttft, base_ttft = (
            rad["points"][top]["median_ttft"],
            baseline["points"][top]["median_ttft"],
        )
        if rad_ttft is not None and base_ttft is not None:
            notes.append(
                f"{RAD} has no TBT targets and is built for throughput, not latency: at "
                f"{data['rates'][top]:.2f} req/s its median TTFT is {rad_ttft.mean:.2f} s "
                f"against {BASELINE}'s {base_ttft.mean:.2f} s, and its capacity at median TTFT "
                f"≤ 0.5 s is {rad['capacity'].format(2)} req/s against "
                f"{baseline['capacity'].format(2)}. Its own claim, stability up to its "
                "capacity (Theorem 2), is checked below."
            )
    if PRIORITY in schemes and HEADLINE in schemes:
        top = len(data["rates"]) - 1
        with_priority = schemes[PRIORITY]["points"][top]["mean_ttft"]
        without = schemes[HEADLINE]["points"][top]["mean_ttft"]
        if with_priority["paying"] is not None and with_priority["free"] is not None:
            paying, free = with_priority["paying"].mean, with_priority["free"].mean
            plain = without["paying"].mean if without["paying"] is not None else None
            notes.append(
                f"App. F.2 at {data['rates'][top]:.2f} req/s: with paying users first, their "
                f"mean TTFT is {paying:.2f} s against the free tier's {free:.2f} s"
                + ("" if plain is None else f" (without the priority: {plain:.2f} s)")
                + (
                    "; the paper: paying users' mean TTFT below the free tier's, by a "
                    "relatively small margin."
                )
            )
    return [" ".join(notes), ""]


STABILITY_LOADS = (0.5, 0.7, 0.9, 1.1, 1.3, 1.6, 2.0)


def rad_stability(scale: float = 1.0, seeds: Sequence[int] = SEEDS) -> dict[str, Any]:
    """[RAD] Theorem 2 in the simulator: pending requests Q(t) at half and at the end of a
    `300 × scale` s run, RAD and Sarathi-Serve, at loads relative to RAD's capacity
    r/T̄^R (`fairpool.sim.stability.StabilityExperiment`)."""
    experiment = StabilityExperiment()
    horizon = 300.0 * scale
    rows = []
    for load in STABILITY_LOADS:
        row: dict[str, Any] = {"load": load, "rate": load * experiment.rad_capacity}
        for policy in ("rad", "sarathi"):
            halves, ends = [], []
            for seed in seeds:
                pending, _ = experiment.queue(policy, load, horizon, seed, samples=2)
                halves.append(pending[0])
                ends.append(pending[1])
            row[policy] = {
                "half": estimate(halves),
                "end": estimate(ends),
                "growth": estimate(end - half for half, end in zip(halves, ends, strict=True)),
            }
        rows.append(row)
    return {
        "horizon": horizon,
        "seeds": list(seeds),
        "rows": rows,
        "rad_capacity": experiment.rad_capacity,
        "sarathi_capacity": experiment.sarathi_capacity,
        "cycle": experiment.cycle,
        "epsilon": experiment.epsilon,
        "t_bar": experiment.t_bar,
        "simulations": 2 * len(STABILITY_LOADS) * len(seeds),
    }


def section_rad_stability(data: dict[str, Any]) -> list[str]:
    horizon = data["horizon"]
    rows = data["rows"]
    lines = [
        "### RAD's Theorem 2 in the simulator",
        "",
        f"One node, Poisson arrivals, prompts of 16–64 tokens and 1–24 output tokens "
        f"(uniform), t*_lcm = 16 and t*_col = 4, the simulator's default step time: T̄^R = "
        f"{data['t_bar'] * 1e3:.1f} ms, so RAD's capacity r/T̄^R is "
        f"{data['rad_capacity']:.2f} requests/s; ε = {data['epsilon']} asks for n ≥ "
        f"{data['cycle']}. Sarathi-Serve runs with the same per-step token budget (16), under "
        f"which no scheduler exceeds {data['sarathi_capacity']:.2f} requests/s. Pending "
        f"requests at {horizon / 2:.0f} s and {horizon:.0f} s, {len(data['seeds'])} seeds:",
        "",
        *_table(
            [
                "load (× r/T̄^R)",
                "λ (req/s)",
                f"RAD Q({horizon / 2:.0f} s)",
                f"RAD Q({horizon:.0f} s)",
                f"Sarathi Q({horizon / 2:.0f} s)",
                f"Sarathi Q({horizon:.0f} s)",
            ],
            [
                [
                    f"{row['load']:.1f}",
                    f"{row['rate']:.1f}",
                    row["rad"]["half"].format(1),
                    row["rad"]["end"].format(1),
                    row["sarathi"]["half"].format(1),
                    row["sarathi"]["end"].format(1),
                ]
                for row in rows
            ],
        ),
        "",
    ]
    notes = []
    for policy, name, capacity in (
        ("rad", "RAD", data["rad_capacity"]),
        ("sarathi", "Sarathi-Serve", data["sarathi_capacity"]),
    ):
        growing = [row for row in rows if row[policy]["growth"].above(0)]
        steady = [row for row in rows if not row[policy]["growth"].above(0)]
        if growing:
            loads = _join([f"{row['load']:.1f}" for row in growing])
            calm = _join([f"{row['load']:.1f}" for row in steady]) if steady else "none"
            above = all(row["rate"] > capacity for row in growing)
            notes.append(
                f"{name}'s queue grows measurably between the two times (the growth's "
                f"interval above 0) at loads {loads}, not at {calm}; "
                + (
                    f"every growing load is above its bound of {capacity:.2f} req/s."
                    if above
                    else f"some growing loads are below its bound of {capacity:.2f} req/s."
                )
            )
        else:
            notes.append(f"{name}'s queue does not grow measurably at any load here.")
    stable_rad = all(not row["rad"]["growth"].above(0) for row in rows if row["load"] < 1)
    notes.append(
        "Theorem 2 predicts RAD stable below load 1 − ε = "
        f"{1 - data['epsilon']:.1f} and the work bound growth above 1"
        + (
            ", and RAD's queue does not grow at any load below 1."
            if stable_rad
            else "; RAD's queue grows at some load below 1, against the theorem."
        )
    )
    only_rad = [row for row in rows if row["rad"]["growth"].above(0)
                and not row["sarathi"]["growth"].above(0)]  # fmt: skip
    if only_rad:
        where = _join([f"{row['load']:.1f}" for row in only_rad])
        notes.append(
            f"At loads {where} Sarathi-Serve's queue "
            "holds where RAD's grows: in our linear step-time model a larger decode batch "
            "shares each step's fixed cost more widely, and Sarathi-Serve decodes up to 16 "
            "requests a step where RAD decodes at most t*_col = 4; the paper's "
            "throughput-optimality rests on its tiled cost model, where batches larger than "
            "t*_col buy nothing."
        )
    return [*lines, " ".join(notes), ""]


def _rates(rates: Sequence[float]) -> str:
    if len(rates) > 2 and all(b - a == rates[1] - rates[0] for a, b in itertools.pairwise(rates)):
        return f"{rates[0]:.2f}–{rates[-1]:.2f} req/s"
    return ", ".join(f"{rate:.2f}" for rate in rates) + " req/s"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def regenerate(out: Path, scale: float = 1.0) -> Path:
    """Run sections 6 and 7's experiments and write them into `out`/results.md in place."""
    from fairpool_reproduce.chains import replace_section
    from fairpool_reproduce.results import _log

    results_md = out / "results.md"
    text = results_md.read_text()
    images = out / "img"
    experiments: tuple[
        tuple[Callable[..., dict[str, Any]], Callable[..., Path], Callable[..., list[str]], str],
        ...,
    ] = (
        (memory_safe_vs_alpha, plot_memory_safe, section_memory_safe, "results-memory-safe.png"),
        (slai_vs_sarathi, plot_slai, section_slai, "results-slai.png"),
    )
    for run, plot, section, image in experiments:
        data = run(scale)
        _log(f"wrote {plot(data, images / image)}")
        text = replace_section(text, section(data))
    results_md.write_text(text)
    _log(f"wrote sections 6 and 7 of {results_md}")
    return results_md
