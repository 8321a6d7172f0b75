"""`fairpool up` end to end: the example manifests run as processes on loopback, serve
through the gateway, pick up edits, and leave no process behind however they are stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from polling import wait_until

pytestmark = pytest.mark.subprocess

EXAMPLE = Path("examples/local.yaml")
LIGHT_KEY = "sk-local-light-0002"


def children_of(pid: int) -> set[int]:
    """Processes whose parent is `pid` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Up:
    def __init__(self, manifests: Path, port: int, *flags: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/v1"
        command = [sys.executable, "-m", "fairpool_cli", "up", "-f", str(manifests)]
        self.process = subprocess.Popen(
            [*command, "--port", str(port), *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)

    def wait_ready(self) -> None:
        """Until `fairpool up` says it is up (it has seen every process answer) and has
        printed the whole banner, whose last line is how to stop it."""
        wait_until(lambda: any("Ctrl-C stops everything" in line for line in self.output))

    def ready(self) -> bool:
        assert self.process.poll() is None, "".join(self.output)
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz").status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    manifests = tmp_path / "local.yaml"
    manifests.write_text(EXAMPLE.read_text())
    running = Up(manifests, free_port())
    try:
        running.wait_ready()
        yield running
    finally:
        running.process.kill()
        running.process.wait()


def chat(url: str, key: str) -> httpx.Response:
    body = {"model": "demo-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(
        f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )


def test_sigterm_stops_every_process_and_leaves_none_behind(up: Up):
    assert chat(up.url, LIGHT_KEY).status_code == 200
    children = children_of(up.process.pid)
    assert len(children) == 3  # two engines and the gateway
    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(timeout=30) == 0
    wait_until(lambda: not any(alive(pid) for pid in children))


def test_sigkill_of_up_still_takes_its_children_down(up: Up):
    children = children_of(up.process.pid)
    assert children
    up.process.kill()
    up.process.wait()
    wait_until(lambda: not any(alive(pid) for pid in children))


def test_a_dead_engine_is_reported_and_restarted(up: Up):
    engines = [pid for pid in children_of(up.process.pid) if b"engine-sim" in cmdline(pid)]
    os.kill(engines[0], signal.SIGKILL)
    wait_until(lambda: len(engine_pids(up)) == 2 and engines[0] not in engine_pids(up))
    wait_until(up.ready)
    assert chat(up.url, LIGHT_KEY).status_code == 200


def test_edited_manifests_reach_the_running_gateway(up: Up, tmp_path: Path):
    manifests = tmp_path / "local.yaml"
    documents = list(yaml.safe_load_all(manifests.read_text()))
    for document in documents:
        if document["kind"] == "Secret" and document["metadata"]["name"] == "light-keys":
            document["stringData"] = {"key": "sk-rotated-light"}
    manifests.write_text(yaml.safe_dump_all(documents))
    wait_until(lambda: chat(up.url, "sk-rotated-light").status_code == 200)
    assert chat(up.url, LIGHT_KEY).status_code == 401


def test_a_malformed_manifest_fails_before_anything_starts(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("weight: 2", "weight: -2"))
    done = subprocess.run(
        [sys.executable, "-m", "fairpool_cli", "up", "-f", str(bad), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "bad.yaml, document 5: spec.weight" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def engine_pids(up: Up) -> set[int]:
    return {pid for pid in children_of(up.process.pid) if b"engine-sim" in cmdline(pid)}


def test_fairpool_load_through_fairpool_up_gets_shares_close_to_the_weights(tmp_path: Path):
    """Both tenants closed-loop with 32 requests in flight, four times what the pool
    serves at once (2 engines × 4). The engines answer /health with 503 until all 64 wait
    in the gateway's fair queue, so both are backlogged from the first unit of service.

    Judged on the gateway's own account (its admin API): the service each tenant got and
    its VTC counter. While both wait, the counters (service / weight, plus any lift) stay
    within U = L + S·2O + S·L of each other (S = 8 slots, L and O the prompt and output
    tokens as charged; tests/test_gateway_fair_queue.py), and the requests in the pool
    when the run ends add at most S·(L + 2O). A tenant whose client fell behind (no
    request waiting for a moment) is lifted when its next request comes, by what it did
    not get meanwhile: the lifts, reported as counter − service / weight, widen the
    bound by what they are, so a slow client on a busy machine loosens the claim
    instead of breaking it."""
    import asyncio

    from fairpool_cli.load import LoadSpec, PromptShape, TenantSpec, run_load
    from fairpool_cli.load.prompts import prompt_source

    # The example, at a pace this machine keeps up with beside the load generator: real-time
    # engines, 4 requests per engine before requests wait in the gateway's fair queue, and
    # the pool holding requests while no engine is in rotation (as the test makes it).
    manifests = tmp_path / "slow.yaml"
    text = EXAMPLE.read_text().replace("speedup: 4", "speedup: 1")
    text = text.replace(
        "saturation: {maxOutstanding: 8}",
        "saturation: {maxOutstanding: 4}\n    waitForWorkers: true",
    )
    manifests.write_text(text)
    admin = f"http://127.0.0.1:{free_port()}"
    running = Up(manifests, free_port(), "--admin-port", admin.rsplit(":", 1)[1])
    tenants = (
        TenantSpec("flood", key="sk-local-flood-0001", weight=1.0, concurrency=32),
        TenantSpec("light", key=LIGHT_KEY, weight=2.0, concurrency=32),
    )
    shape = PromptShape("shared-prefix", prompt_tokens=128, question_tokens=16, output_tokens=32)

    def pool() -> dict:
        return httpx.get(f"{admin}/admin/pools").json()["chat"]

    def set_health(healthy: bool) -> None:
        for url in pool()["workers"]:
            httpx.post(f"{url}/admin/health", json={"healthy": healthy}).raise_for_status()

    def release_when_all_wait() -> None:
        try:
            wait_until(lambda: pool()["queued"] == 64, what="64 requests queued at the gateway")
        finally:
            set_health(True)

    try:
        running.wait_ready()
        set_health(False)
        wait_until(lambda: not any(w["healthy"] for w in pool()["workers"].values()))
        releaser = threading.Thread(target=release_when_all_wait, daemon=True)
        releaser.start()
        spec = LoadSpec(running.url, tenants, duration=20.0, shape=shape)
        result = asyncio.run(run_load(spec))
        releaser.join()
        state = {
            tenant.name: httpx.get(f"{admin}/admin/tenants/{tenant.name}").json()
            for tenant in tenants
        }
    finally:
        running.process.kill()
        running.process.wait()
    assert state["light"]["weight"] == 2.0 and state["flood"]["weight"] == 1.0
    served = {name: tenant["state"]["chat"]["served"] for name, tenant in state.items()}
    lifts = {
        name: tenant["state"]["chat"]["counter"] - served[name] / tenant["weight"]
        for name, tenant in state.items()
    }
    # The gateway charges a prompt at its estimate (4 characters a token) until the engine
    # reports its usage: L is the larger of the two.
    prompt = prompt_source(spec, tenants[0]).next()
    estimate = sum(len(f"<|{role}|>\n{text}\n") for role, text in prompt.messages) // 4 + 1
    slots, output = 2 * 4, shape.output_tokens
    longest = max(estimate, shape.prompt_tokens + shape.question_tokens + 8)
    bound = longest + slots * 2 * output + slots * longest + slots * (longest + 2 * output)
    gap = served["flood"] - served["light"] / 2
    share = served["light"] / sum(served.values())
    print(
        f"light's share {share:.3f} of {sum(served.values()):.0f} (weight 2 of 3; the client "
        f"measured {result.share('light'):.3f}); gap {gap:.0f}, bound {bound} + lifts {lifts}"
    )
    assert all(value >= -1e-6 for value in lifts.values())
    assert abs(gap) <= bound + sum(lifts.values())


def test_two_gateway_replicas_share_a_tenants_limits(tmp_path: Path):
    """`--gateway-replicas 2`: two gateways on their own ports and the Valkey server they
    share; a limit holds across them, and stopping `fairpool up` stops all of it."""
    documents = list(yaml.safe_load_all(EXAMPLE.read_text()))
    for document in documents:
        if document["kind"] == "TenantQuota" and document["metadata"]["name"] == "light":
            document["spec"]["limits"] = {"requestsPerMinute": 4}
    manifests = tmp_path / "local.yaml"
    manifests.write_text(yaml.safe_dump_all(documents))
    running = Up(manifests, free_port(), "--gateway-replicas", "2")
    try:
        running.wait_ready()
        urls = [
            line.split()[1]
            for line in running.output
            if line.strip().startswith("gateway ") and "/v1" in line
        ]
        assert len(urls) == 2 and urls[0] == running.url
        assert any(line.strip().startswith("shared ") for line in running.output)
        children = children_of(running.process.pid)
        assert len(children) == 5  # the shared state, two engines, two gateways
        statuses = [chat(urls[index % 2], LIGHT_KEY).status_code for index in range(8)]
        assert sorted(statuses) == [200] * 4 + [429] * 4
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=30) == 0
        wait_until(lambda: not any(alive(pid) for pid in children))
    finally:
        running.process.kill()
        running.process.wait()
