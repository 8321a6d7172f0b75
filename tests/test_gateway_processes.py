"""`fairpool gateway --workers N`: N processes behind one tenant port (SO_REUSEPORT), each
with its own admin port, stopping together; and what each process runs with (limits and
saturation divided among them, or counted as replicas of the shared state)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from gateway_helpers import KEYS, completion, engines, gateway_config, tenant_entry
from polling import wait_until
from sim_http import metric

from fairpool.api.gateway_config import GatewayConfig
from fairpool_gateway.processes import config_for_worker

pytestmark = pytest.mark.subprocess


class Running:
    """A `fairpool gateway` process and the URLs it printed."""

    def __init__(self, process: subprocess.Popen[str], workers: int) -> None:
        self.process = process
        self.url = ""
        self.admin_urls: list[str] = []
        assert process.stdout is not None
        while len(self.admin_urls) < workers:
            line = process.stdout.readline()
            assert line, f"the gateway exited: {process.wait()}"
            url = line.split(" on ", 1)[1].split()[0] if " on " in line else ""
            if "tenant API" in line:
                self.url = url.removesuffix("/v1")
            elif "admin API" in line:
                self.admin_urls.append(url)

    def children(self) -> list[int]:
        pid = self.process.pid
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(child) for child in text.split()]


def write_config(path: Path, config: GatewayConfig) -> Path:
    document = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    path.write_text(yaml.safe_dump(document))
    return path


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def started(config_file: Path, workers: int) -> Iterator[Running]:
    command = [sys.executable, "-m", "fairpool_cli", "gateway", "--config", str(config_file)]
    command += ["--port", "0", "--admin-port", "0", "--workers", str(workers)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        running = Running(process, workers)
        for admin in running.admin_urls:
            wait_until(lambda a=admin: ready(a), what=f"{admin} ready")
        yield running
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def config_file(tmp_path: Path) -> Iterator[Path]:
    with engines(1) as workers:
        config = gateway_config([workers[0].url], [tenant_entry("light")])
        yield write_config(tmp_path / "gateway.yaml", config)


def test_two_workers_serve_one_port_and_stop_together_on_sigterm(config_file):
    with started(config_file, workers=2) as running:
        headers = {"Authorization": f"Bearer {KEYS['light']}", "Connection": "close"}
        for index in range(40):  # a new connection each: the kernel spreads them
            response = httpx.post(
                f"{running.url}/v1/completions",
                json=completion(f"q{index}", 2),
                headers=headers,
                timeout=30,
            )
            assert response.status_code == 200, response.text
        served = [metric(url, "fairpool_gateway_requests_total") for url in running.admin_urls]
        assert sum(served) == 40 and all(count > 0 for count in served), served
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=60) == 0


def test_a_worker_that_dies_stops_the_gateway_with_an_error(config_file):
    with started(config_file, workers=2) as running:
        first, second = running.children()
        subprocess.run(["kill", "-KILL", str(first)], check=True)
        assert running.process.wait(timeout=60) == 1
        assert not Path(f"/proc/{second}").exists() or _zombie(second)


def _zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_each_worker_gets_its_part_of_the_limits_and_the_saturation():
    config = gateway_config(
        ["http://127.0.0.1:9"],
        [tenant_entry("light", limits={"requestsPerMinute": 10, "concurrent": 3})],
        routing={"saturation": {"maxOutstanding": 9}},
    )
    alone = config_for_worker(config, 2)
    limits = alone.tenants[0].limits
    assert (limits.requests_per_minute, limits.concurrent) == (5, 1)
    assert alone.pools[0].routing.saturation.max_outstanding == 5  # 9 / 2, rounded up
    shared = config.model_copy(
        update={
            "shared_state": GatewayConfig.model_validate(
                {"sharedState": {"url": "redis://127.0.0.1:6379/0", "replicas": 3}}
            ).shared_state
        }
    )
    counted = config_for_worker(shared, 2)
    assert counted.shared_state is not None and counted.shared_state.replicas == 6
    assert counted.tenants[0].limits.requests_per_minute == 10  # the shared state counts
    assert counted.pools[0].routing.saturation.max_outstanding == 9  # ... and the cap,
    # with fair engines too: each replica counts its peers' requests in flight against it
    fair = shared.model_copy(
        update={"pools": [shared.pools[0].model_copy(update={"fair_engines": True})]}
    )
    assert config_for_worker(fair, 2).pools[0].routing.saturation.max_outstanding == 9
    assert config_for_worker(config, 1) is config
