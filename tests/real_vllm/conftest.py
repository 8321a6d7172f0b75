"""Real vLLM (CPU build) with the fairpool scheduler: a tiny model built here, servers
started on loopback, stopped at the end. Nothing is downloaded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from polling import wait_until

from fairpool_engine.vllm.tiny_model import build

MODEL_NAME = "tiny"
STARTUP_TIMEOUT = 240.0


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM leaves sockets in TMPDIR and caches in VLLM_CACHE_ROOT: keep both here."""
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="session")
def tiny_model(scratch: Path) -> Path:
    return build(scratch / "tiny-llama")


def vllm_environment(scratch: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
    (scratch / "tmp").mkdir(exist_ok=True)
    env.update(
        TMPDIR=str(scratch / "tmp"),
        VLLM_CACHE_ROOT=str(scratch / "vllm-cache"),
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        **extra,
    )
    return env


def run_child(script: str, scratch: Path, *args: str) -> dict[str, object]:
    """Run a driver script of this directory that works a real in-process engine in its
    own process (vLLM's engine is set up once per process) and prints JSON last."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name(script)), *args],
        capture_output=True, text=True, timeout=600, env=vllm_environment(scratch),
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    trace: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text


def start_server(
    scratch: Path,
    model: Path,
    name: str,
    fair: bool = True,
    config: Path | None = None,
    kv_bytes: int = 64 * 1024 * 1024,
    extra: tuple[str, ...] = (),
) -> Server:
    port = free_port()
    vllm_args = [
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL_NAME,
        "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
        "--kv-cache-memory-bytes", str(kv_bytes), "--max-num-batched-tokens", "1024",
        *extra,
    ]  # fmt: skip
    if fair:
        command = [str(Path(sys.executable).parent / "fairpool"), "engine", "--model", str(model)]
        if config is not None:
            command += ["--scheduler-config", str(config)]
    else:  # stock vLLM, same options
        command = [sys.executable, "-m", "fairpool_engine.vllm.main", "serve", str(model)]
    trace = scratch / f"{name}-trace.jsonl"
    log = scratch / f"{name}.log"
    env = vllm_environment(scratch, FAIRPOOL_SCHEDULER_TRACE=str(trace))
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, *vllm_args], stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    server = Server(f"http://127.0.0.1:{port}", process, log, trace)

    def healthy() -> bool:
        assert process.poll() is None, f"{name} exited with {process.returncode}"
        try:
            return httpx.get(f"{server.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, timeout=STARTUP_TIMEOUT, interval=0.5, what=f"{name} healthy")
    except AssertionError as error:
        stop_server(server)
        raise AssertionError(f"{error}:\n{server.log_text()[-4000:]}") from None
    return server


def stop_server(server: Server) -> None:
    """SIGTERM to the launcher (it passes it on); the whole process group if it hangs."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


@pytest.fixture(scope="session")
def server_factory(scratch: Path, tiny_model: Path) -> Iterator[object]:
    started: list[Server] = []

    def factory(name: str, **options: object) -> Server:
        server = start_server(scratch, tiny_model, name, **options)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield factory
    for server in started:
        stop_server(server)
