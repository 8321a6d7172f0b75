"""Reproductions of seeds 002 and 004: memory-safe admission and SLO-aware batching.

- [KV] Jaillet, Jiang, Podimata, Zhou, *Online Scheduling for LLM Inference with KV Cache
  Constraints* (arXiv 2502.07115 v1), §6: Algorithm 2 (MC-SF) against the vLLM-like
  α-protection baselines on LMSYS-like requests, Llama-2-70B on two A100s (M = 16,492).
  Headlines: memory never over M; average latency grows linearly with the arrival count,
  the best baseline's slope ≈ 3× MC-SF's at λ = 50/s and ≈ 8× at λ = 10/s.
- [RAD] Bari, Hegde, de Veciana, *Optimal Scheduling Algorithms for LLM Inference*, §7:
  SLAI against Sarathi-Serve, Mistral-7B on one RTX 6000 Ada, paying (TBT 0.1 s) and free
  (TBT 0.5 s) users. Headlines: median TTFT −53 %, capacity at median TTFT ≤ 0.5 s +26 %.

`fairpool_reproduce.results` runs these with the VTC and DLPM experiments and writes their
sections into `docs/results.md`.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from fairpool.sim.metrics import percentile
from fairpool.sim.plots import pyplot, save

KV_PROFILE = "llama2-70b-2xa100"
RAD_PROFILE = "mistral-7b-rtx6000"
KV_SCHEMES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("MC-SF (Alg. 2)", "mcsf", {}),
    ("α = 0.3 greedy", "alpha_protection", {"alpha": 0.3}),
    ("α = 0.25 greedy", "alpha_protection", {"alpha": 0.25}),
    ("α = 0.2, β = 0.2", "alpha_protection", {"alpha": 0.2, "beta": 0.2}),
    ("α = 0.1, β = 0.1", "alpha_protection", {"alpha": 0.1, "beta": 0.1}),
)


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


def memory_safe_vs_alpha(scale: float = 1.0) -> dict[str, Any]:
    """[KV] §6: each scheme at λ = 50/s (high demand) and λ = 10/s (low demand)."""
    from fairpool_reproduce.results import run_fleet

    results: dict[str, Any] = {}
    for demand, rate, arrivals in (("high", 50.0, 4000), ("low", 10.0, 2000)):
        duration = arrivals / rate * scale
        rows: list[dict[str, Any]] = []
        for label, policy, policy_params in KV_SCHEMES:
            run = run_fleet(
                "lmsys_like",
                duration,
                policy=policy,
                profile=KV_PROFILE,
                drain=True,
                params={"rate": rate},
                policy_params=policy_params,
            )
            slope, curve = latency_slope(run)
            assert run.fleet is not None
            engine = run.fleet.engines[0]
            rows.append(
                {
                    "label": label,
                    "policy": policy,
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
            )
        best_baseline: float = min(row["slope"] for row in rows[1:])
        ours: float = rows[0]["slope"]
        results[demand] = {
            "rate": rate,
            "duration": duration,
            "rows": rows,
            "slope_ratio": best_baseline / ours if ours > 0 else None,
        }
    return results


def slai_vs_sarathi(scale: float = 1.0) -> dict[str, Any]:
    """[RAD] §7: median TTFT and P99 TBT per class over a sweep of arrival rates."""
    from fairpool_reproduce.results import run_fleet

    duration = 60.0 * scale
    rates = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    rows: list[dict[str, Any]] = []
    for policy in ("sarathi", "slai"):
        for rate in rates:
            run = run_fleet(
                "slo_tiers",
                duration,
                policy=policy,
                profile=RAD_PROFILE,
                drain=True,  # every request's TTFT counts, not only those done in time
                params={"rate": rate, "paying_fraction": 0.05},
            )
            completions = run.recorder.completions
            ttfts = [c.first_token_at - c.request.arrival for c in completions]
            tbt = {
                tier: percentile(
                    [gap for c in completions if c.request.tenant == tier for gap in c.token_gaps],
                    0.99,
                )
                for tier in ("paying", "free")
            }
            rows.append(
                {
                    "policy": policy,
                    "rate": rate,
                    "median_ttft": statistics.median(ttfts) if ttfts else None,
                    "tbt_p99": tbt,
                    "finished": len(completions),
                }
            )
    return {
        "duration": duration,
        "rows": rows,
        "capacity": {policy: capacity(rows, policy) for policy in ("sarathi", "slai")},
    }


def capacity(rows: list[dict[str, Any]], policy: str, target: float = 0.5) -> float | None:
    """Largest arrival rate whose median TTFT stays ≤ `target`, interpolating linearly
    between the measured rates ([RAD]'s capacity definition)."""
    previous: tuple[float, float] | None = None
    for row in rows:
        if row["policy"] != policy:
            continue
        rate, ttft = float(row["rate"]), row["median_ttft"]
        if ttft is None or ttft > target:
            if previous is None or ttft is None:
                return None if previous is None else previous[0]
            low_rate, low_ttft = previous
            return low_rate + (rate - low_rate) * (target - low_ttft) / (float(ttft) - low_ttft)
        previous = (rate, float(ttft))
    return None if previous is None else previous[0]


def plot_memory_safe(data: dict[str, Any], path: Path) -> Path:
    figure, axes = pyplot().subplots(1, 2, figsize=(11, 4))
    for axis, demand in zip(axes, ("high", "low"), strict=True):
        for row in data[demand]["rows"]:
            counts = [count for count, _ in row["curve"]]
            means = [mean for _, mean in row["curve"]]
            axis.plot(counts, means, marker="o", markersize=3, label=row["label"])
        axis.set_title(f"λ = {data[demand]['rate']:.0f}/s", fontsize=9)
        axis.set_xlabel("arrivals N")
        axis.set_ylabel("average latency of the first N (s)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle("Memory-safe admission (MC-SF) vs α-protection, Llama-2-70B, M = 16,492")
    return save(figure, path)


def plot_slai(data: dict[str, Any], path: Path) -> Path:
    figure, axis = pyplot().subplots(figsize=(6, 4))
    for policy in ("sarathi", "slai"):
        rows = [r for r in data["rows"] if r["policy"] == policy]
        axis.plot(
            [r["rate"] for r in rows], [r["median_ttft"] for r in rows], marker="o", label=policy
        )
    axis.axhline(0.5, color="grey", linestyle="--", linewidth=1, label="0.5 s")
    axis.set_yscale("log")
    axis.set_xlabel("arrival rate (requests/s)")
    axis.set_ylabel("median TTFT (s)")
    axis.set_title("SLAI vs Sarathi-Serve, Mistral-7B, 5 % paying users", fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return save(figure, path)


def section_memory_safe(data: dict[str, Any]) -> list[str]:
    lines = [
        "## 6. Memory-safe admission vs α-protection (seed 002, §6)",
        "",
        f"Workload `lmsys_like` (LMSYS-Chat-like lengths, Poisson), profile `{KV_PROFILE}` "
        "(M = 16,492 tokens, paged admission with recompute on overflow), each scheme run "
        "until every request finished. Slope: least-squares slope of the average latency "
        "of the first N arrivals against N.",
        "",
        "| demand | scheme | slope (s/arrival) | mean latency | peak KV / M | preemptions |",
        "|---|---|---|---|---|---|",
    ]
    for demand in ("high", "low"):
        for row in data[demand]["rows"]:
            lines.append(
                f"| λ = {data[demand]['rate']:.0f}/s | {row['label']} | {row['slope']:.4f} | "
                f"{row['mean_latency']:.1f} s | {row['peak_memory']:,} / {row['memory']:,} | "
                f"{row['preemptions']:,} |"
            )
    high, low = data["high"]["slope_ratio"], data["low"]["slope_ratio"]
    lines += [
        "",
        "| measure | paper | ours |",
        "|---|---|---|",
        "| MC-SF's KV memory | never over M (Figs. 8, 11) | peak "
        f"{data['high']['rows'][0]['peak_memory']:,} and {data['low']['rows'][0]['peak_memory']:,}"
        " ≤ 16,492, no preemption |",
        f"| best baseline slope / MC-SF slope, λ = 50/s | ≈ 3 (§6) | {_ratio(high)} |",
        f"| best baseline slope / MC-SF slope, λ = 10/s | ≈ 8 (§6) | {_ratio(low)} |",
        "",
        "![memory-safe vs alpha-protection](img/results-memory-safe.png)",
        "",
        "The paper's request sizes are word counts from LMSYS-Chat-1M and its batch times "
        "come from Vidur; ours are lognormal lengths matched to the same means and medians "
        "and first-principles step times, so compare the ordering, not the absolute slopes "
        "(whose units the paper leaves unclear). At λ = 50/s our ratio is far larger than "
        "the paper's: with LMSYS's short outputs no α-protection run here ever overflowed "
        f"({sum(r['preemptions'] for r in data['high']['rows'])} preemptions), so the "
        "baselines lose only by admitting first-come-first-served and by leaving the "
        "watermark's share of memory idle, while shortest-first keeps MC-SF's queue short. "
        "At λ = 10/s our profile of two A100s serves the load without a queue (the average "
        "latency stays flat), so no scheme has a slope to compare; the paper's set-up was "
        "still overloaded there. Reproducing its ≈ 8× needs the profile calibrated to its "
        "Vidur batch times.",
        "",
    ]
    return lines


def section_slai(data: dict[str, Any]) -> list[str]:
    lines = [
        "## 7. SLAI vs Sarathi-Serve (seed 004, §7)",
        "",
        f"Workload `slo_tiers` (5 % paying users with TBT 0.1 s, the rest 0.5 s), profile "
        f"`{RAD_PROFILE}`, {data['duration']:.0f} s of arrivals per rate, run until every "
        "request finished, both with a 512-token budget.",
        "",
        "| rate (req/s) | Sarathi median TTFT | SLAI median TTFT | SLAI P99 TBT paying / free |",
        "|---|---|---|---|",
    ]
    by_rate: dict[float, dict[str, Any]] = {}
    for row in data["rows"]:
        by_rate.setdefault(row["rate"], {})[row["policy"]] = row
    reductions = []
    for rate, pair in sorted(by_rate.items()):
        sarathi, slai = pair["sarathi"], pair["slai"]
        if sarathi["median_ttft"] and slai["median_ttft"] is not None:
            reductions.append(1 - slai["median_ttft"] / sarathi["median_ttft"])
        lines.append(
            f"| {rate:.0f} | {_seconds(sarathi['median_ttft'])} | "
            f"{_seconds(slai['median_ttft'])} | {_seconds(slai['tbt_p99']['paying'])} / "
            f"{_seconds(slai['tbt_p99']['free'])} |"
        )
    cap_sarathi, cap_slai = data["capacity"]["sarathi"], data["capacity"]["slai"]
    gain = (cap_slai / cap_sarathi - 1) if cap_sarathi and cap_slai else None
    best = max(reductions) if reductions else None
    lines += [
        "",
        "| measure | paper | ours |",
        "|---|---|---|",
        f"| median TTFT, SLAI vs Sarathi | −53 % (§7) | "
        f"{'—' if best is None else f'−{best:.0%} at best'} |",
        f"| capacity at median TTFT ≤ 0.5 s | +26 % (§7) | "
        f"{_rate(cap_sarathi)} → {_rate(cap_slai)} req/s"
        f"{'' if gain is None else f' ({gain:+.0%})'} |",
        "",
        "![SLAI vs Sarathi](img/results-slai.png)",
        "",
        "SLAI defers free users' decodes until their TBT deadline nears and spends the "
        "budget on prefills shortest-first, so new requests start sooner; paying users' "
        "decodes stay due every step. Our Mistral-7B profile is a first-principles estimate, "
        "not the paper's measured RTX 6000 Ada, so the rates at which TTFT takes off differ.",
        "",
    ]
    return lines


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"
