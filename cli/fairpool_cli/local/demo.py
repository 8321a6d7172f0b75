"""`fairpool demo`: fairpool doing its job on this machine, in about two minutes.

`fairpool up -f examples/local.yaml` starts a pool of two simulated engines and the
gateway; `fairpool load` then drives two tenants at once through the gateway: `flood`
(weight 1) keeps many requests in flight, `light` (weight 2) fewer, both more than the
pool can serve. With fairness on, each gets service in proportion to its weight, whatever
it sends. Then the same run with fairness off (FCFS in the engines and at the gateway,
least-load routing): each gets what it pushes. The table puts the two side by side.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from fairpool.sched.errors import ConfigError
from fairpool_cli.load import LoadResult, LoadSpec, TenantSpec, run_load
from fairpool_cli.load.tenants import tenants_from_manifests
from fairpool_cli.local.ports import free_port

EXAMPLE = Path("examples/local.yaml")
#: In flight per tenant: both well above what the pool serves at once (2 × 8), the flood
#: three times the light tenant's.
CONCURRENCY = {"flood": 72, "light": 24}
READY_TIMEOUT = 120.0


@dataclass(frozen=True)
class DemoRun:
    fairness: bool
    result: LoadResult


def run_demo(console: Console, duration: float = 25.0, warmup: float = 5.0) -> int:
    manifests = EXAMPLE if EXAMPLE.is_file() else None
    if manifests is None:
        raise ConfigError("examples/local.yaml", "not found: run the demo from the repository")
    known = tenants_from_manifests([str(manifests)])
    runs = []
    for fairness in (True, False):
        label = "on" if fairness else "off"
        console.rule(f"fairness {label}")
        with local_pool(manifests, fairness, console) as url:
            tenants = tuple(
                TenantSpec(
                    name,
                    key=str(known[name]["key"]),
                    weight=float(known[name]["weight"]),
                    concurrency=concurrency,
                )
                for name, concurrency in CONCURRENCY.items()
            )
            spec = LoadSpec(url, tenants, duration=duration, warmup=warmup)
            console.print(
                f"load: flood keeps {CONCURRENCY['flood']} requests in flight, light "
                f"{CONCURRENCY['light']}, for {duration:g} s (shares counted after {warmup:g} s)"
            )
            with console.status("running …"):
                result = asyncio.run(run_load(spec))
            runs.append(DemoRun(fairness, result))
            console.print(shares_line(result))
    console.print(comparison(runs))
    return 0


class local_pool:
    """`fairpool up` in the background for the length of a `with` block; its URL."""

    def __init__(self, manifests: Path, fairness: bool, console: Console) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "fairpool_cli", "up", "-f", str(manifests)]
        command += ["--port", str(self.port), "--fairness", "on" if fairness else "off"]
        self.command = command
        self.console = console
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        self.console.print("starting: " + " ".join(self.command[1:]))
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._ready():
            if self.process.poll() is not None:
                errors = self.process.stderr.read().decode() if self.process.stderr else ""
                raise ConfigError("fairpool up", f"exited early: {errors.strip()[-500:]}")
            if time.monotonic() > deadline:
                raise ConfigError("fairpool up", f"not ready after {READY_TIMEOUT:g} s")
            time.sleep(0.2)
        return f"http://127.0.0.1:{self.port}/v1"

    def _ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def __exit__(self, *exc_info: object) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)  # it stops its engines and gateway
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def shares_line(result: LoadResult) -> str:
    parts = []
    for name in CONCURRENCY:
        share, entitled = result.share(name), result.entitled_share(name)
        parts.append(f"{name} {_percent(share)} (entitled {_percent(entitled)})")
    return "service shares: " + ", ".join(parts)


def comparison(runs: list[DemoRun]) -> Table:
    table = Table(
        title="Share of the pool's service while both tenants wanted more, fairness on and off"
    )
    table.add_column("tenant")
    table.add_column("weight", justify="right")
    table.add_column("in flight", justify="right")
    table.add_column("entitled", justify="right")
    for run in runs:
        label = "on" if run.fairness else "off"
        table.add_column(f"share ({label})", justify="right")
        table.add_column(f"TTFT p50 ({label})", justify="right")
    first = runs[0].result
    for name in CONCURRENCY:
        row = [
            name,
            f"{first.spec.tenant(name).weight:g}",
            str(CONCURRENCY[name]),
            _percent(first.entitled_share(name)),
        ]
        for run in runs:
            stats = run.result.tenants[name]
            row += [_percent(run.result.share(name)), _seconds(stats.ttft(0.5))]
        table.add_row(*row)
    return table


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"
