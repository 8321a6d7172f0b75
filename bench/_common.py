"""Shared helpers of the benchmarks: machine description and result files."""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fairpool.sim.metrics import percentile

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "system": f"{platform.system()} {platform.release()}",
        "commit": _commit(),
    }


def _commit() -> str | None:
    """The commit measured, with " + uncommitted changes" when the code differs from it
    (results files aside)."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=here)
        return run.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--", "..", ":(exclude)results")
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + (" + uncommitted changes" if changed else "")


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """p50/p90/p99 (nearest rank), max and mean of nanosecond samples, in microseconds."""
    ordered = sorted(samples_ns)

    def at(fraction: float) -> float:
        return (percentile(ordered, fraction) or 0.0) / 1000

    return {
        "p50_us": round(at(0.50), 2),
        "p90_us": round(at(0.90), 2),
        "p99_us": round(at(0.99), 2),
        "max_us": round(ordered[-1] / 1000, 2),
        "mean_us": round(statistics.fmean(ordered) / 1000, 2),
        "samples": len(ordered),
    }


def write_results(name: str, results: dict[str, Any], table: str) -> Path:
    """Write bench/results/NAME.json (numbers) and NAME.md (the table), with context."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = " ".join(shlex.quote(arg) for arg in [Path(sys.executable).name, *sys.argv])
    record = {
        "benchmark": name,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine(),
        "results": results,
    }
    json_path = RESULTS / f"{name}.json"
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    header = (
        f"# {name}\n\n"
        f"- command: `{command}`\n"
        f"- date: {record['date']}\n"
        f"- machine: {record['machine']['cpu']}, {record['machine']['cores']} cores, "
        f"Python {record['machine']['python']}, commit {record['machine']['commit']}\n\n"
    )
    (RESULTS / f"{name}.md").write_text(header + table.rstrip() + "\n")
    return json_path
