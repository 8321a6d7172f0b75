"""The proxies `bench_gateway.py` compares, and the engines behind them, as subprocesses.

`PROXIES` is the table of what is under test; each entry knows how to start its proxy in
front of a list of worker URLs (pinned to given cores with `taskset -c`), how a client
names its tenant through it, and whether it can run here at all:

| name | process | tenant named by |
|---|---|---|
| `direct` | none: clients talk to the workers (one: the latency baseline) | `vllm_xargs` |
| `sglang-router` | `python -m sglang_router.launch_router` (`sglang-router`) | `vllm_xargs` |
| `vllm-router` | `vllm-router` (PyPI `vllm-router`) | `vllm_xargs` |
| `fairpool` | `fairpool gateway --config FILE` (`fairpool.api.gateway_config`) | API key |

The external routers run from their own virtual environment, `.venv-routers` at the
repository root (`$FAIRPOOL_ROUTERS_VENV` overrides it), never from the project's:

    python3 -m venv .venv-routers
    .venv-routers/bin/pip install sglang-router==0.3.2 vllm-router==0.1.17

Both routers use their cache-aware policy by default (`cache_aware`: a prefix tree of
request text per worker, shortest queue when the load is imbalanced); `NAME:POLICY`
(`vllm-router:round_robin`) picks another. What each one asks of its workers, and what it
does to a request's body, is in the docstrings of `SglangRouter` and `VllmRouter`.

A proxy counts as ready when a real request through it succeeds, not when its port
opens: SGLang's router answers `/health` before it has registered any worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
import yaml

from fairpool.api.gateway_config import GatewayConfig, key_digest

ROOT = Path(__file__).resolve().parent.parent
ROUTERS_VENV = Path(os.environ.get("FAIRPOOL_ROUTERS_VENV", ROOT / ".venv-routers"))
FAIRPOOL = Path(sys.executable).parent / "fairpool"
MODEL = "sim"
HOST = "127.0.0.1"


# ---------------------------------------------------------------------- processes


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def free_ports_from(count: int) -> int:
    """A port P such that nothing listens on P .. P+count-1 right now (`fairpool gateway
    --workers N` binds its N admin ports from its admin port up)."""
    while True:
        first = free_port()
        sockets = []
        try:
            for port in range(first, first + count):
                probe = socket.socket()
                sockets.append(probe)
                probe.bind((HOST, port))
            return first
        except OSError:
            continue
        finally:
            for probe in sockets:
                probe.close()


def pinned(command: list[str], cores: str | None) -> list[str]:
    """`command` under `taskset -c CORES` (as given, when there is no taskset or no cores)."""
    if cores is None or shutil.which("taskset") is None:
        return command
    return ["taskset", "-c", cores, *command]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(entry.name)] = int(fields[1])
        used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, total = {pid}, 0.0
    changed = True
    while changed:
        changed = False
        for child, parent in parents.items():
            if parent in tree and child not in tree:
                tree.add(child)
                changed = True
    for member in tree:
        total += used.get(member, 0.0)
    return total


@dataclass
class Process:
    """A started subprocess with its log file; `stop` ends it (TERM, then KILL)."""

    name: str
    command: list[str]
    popen: subprocess.Popen[bytes]
    log: Path
    url: str = ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        if not self.alive():
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)


def spawn(name: str, command: list[str], cores: str | None, logs: Path) -> Process:
    """Start `command` pinned to `cores`, its output in `logs/NAME.log`."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    full = pinned(command, cores)
    with open(log, "wb") as out:
        popen = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    return Process(name, full, popen, log)


class StartError(RuntimeError):
    """A process that did not come up; the message has the end of its log."""


def wait_until(ready: Any, process: Process | None, timeout: float, what: str) -> None:
    """Poll `ready()` (true when up) until `timeout`; fail early if `process` exits."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if process is not None and not process.alive():
            raise StartError(f"{what} exited ({process.popen.returncode}):\n{process.tail()}")
        try:
            if ready():
                return
        except (httpx.HTTPError, OSError) as error:
            last = repr(error)
        time.sleep(0.2)
    tail = process.tail() if process is not None else ""
    raise StartError(f"{what} not ready after {timeout:.0f} s {last}\n{tail}")


# ---------------------------------------------------------------------- engines


@dataclass(frozen=True)
class EngineOptions:
    """How each `fairpool engine-sim` worker runs."""

    speedup: float = 1000.0
    profile: str = "llama3-8b-h100"
    memory_tokens: int | None = None
    max_model_len: int | None = None
    policy: str = "dlpm"
    #: tenant weights for the engines' scheduler configuration (none: all equal)
    weights: dict[str, float] = field(default_factory=dict)
    #: tenants' priority bands for the engines' scheduler configuration (none: standard)
    bands: dict[str, str] = field(default_factory=dict)
    #: the fair order's groups ({name: {weight, parent}}) and each tenant's group
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    tenant_groups: dict[str, str] = field(default_factory=dict)
    #: length of the vectors /v1/embeddings returns (None: engine-sim's default)
    embedding_dim: int | None = None

    def arguments(self, logs: Path, port: int) -> list[str]:
        command = [
            str(FAIRPOOL),
            "engine-sim",
            "--host",
            HOST,
            "--port",
            str(port),
            "--model",
            MODEL,
            "--profile",
            self.profile,
            "--speedup",
            f"{self.speedup:g}",
            "--policy",
            self.policy,
            "--disable-uvicorn-access-log",
        ]
        if self.memory_tokens is not None:
            command += ["--memory-tokens", str(self.memory_tokens)]
        if self.max_model_len is not None:
            command += ["--max-model-len", str(self.max_model_len)]
        if self.embedding_dim is not None:
            command += ["--embedding-dim", str(self.embedding_dim)]
        if self.weights or self.bands or self.groups:
            scheduler: dict[str, Any] = {"policy": self.policy, "tenants": self.weights}
            if self.bands:
                scheduler["tenantBands"] = self.bands
            if self.groups:
                scheduler["groups"] = self.groups
                scheduler["tenantGroups"] = self.tenant_groups
            config = logs / f"scheduler-{port}.yaml"
            config.write_text(yaml.safe_dump(scheduler))
            command += ["--scheduler-config", str(config)]
        return command


def start_engines(
    count: int, options: EngineOptions, cores: str | None, logs: Path
) -> list[Process]:
    """`count` engine-sim workers, each ready (`/health` 200) on its own port."""
    engines: list[Process] = []
    try:
        for _ in range(count):
            port = free_port()
            engine = spawn(f"engine-{port}", options.arguments(logs, port), cores, logs)
            engine.url = f"http://{HOST}:{port}"
            engines.append(engine)
        for engine in engines:
            url = engine.url
            wait_until(
                lambda url=url: httpx.get(f"{url}/health", timeout=2).status_code == 200,
                engine,
                60,
                f"engine-sim {url}",
            )
    except BaseException:
        for engine in engines:
            engine.stop()
        raise
    return engines


# ---------------------------------------------------------------------- proxies


@dataclass(frozen=True)
class Tenant:
    """A tenant of the benchmark: its weight and the API key its client sends."""

    name: str
    weight: float = 1.0
    band: str | None = None  # its slo.class (None: the standard band)
    group: str | None = None  # its TenantGroup (None: directly under its band)

    @property
    def key(self) -> str:
        return f"fairpool-bench-{self.name}"


@dataclass
class RunningProxy:
    """A proxy that is up: where clients send requests, and its process (if any)."""

    proxy: Proxy
    targets: list[tuple[str, int]]
    process: Process | None = None
    config: dict[str, Any] | None = None

    def cpu(self) -> float:
        return self.process.cpu() if self.process is not None else 0.0

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=self.proxy.stop_grace)


@dataclass(frozen=True)
class Proxy:
    """One entry of the table: how to start it and how a client names its tenant."""

    name: str
    policy: str | None = None
    #: policies the proxy offers (for the record; `NAME:POLICY` picks one)
    policies: ClassVar[tuple[str, ...]] = ()
    stop_grace: ClassVar[float] = 10.0
    startup_timeout: ClassVar[float] = 60.0

    @property
    def label(self) -> str:
        return f"{self.name}:{self.policy}" if self.policy else self.name

    def unavailable(self) -> str | None:
        """Why this proxy cannot run here (None: it can)."""
        return None

    def version(self) -> str | None:
        return None

    def tenant_fields(self, tenant: Tenant) -> tuple[dict[str, Any], dict[str, str]]:
        """What a request of `tenant` carries: extra body fields, extra headers."""
        return {"vllm_xargs": {"fairpool_tenant": tenant.name}}, {}

    def command(
        self, port: int, workers: list[str], tenants: list[Tenant], logs: Path
    ) -> tuple[list[str], dict[str, Any] | None]:
        """The proxy's command line, and its configuration (for the record) if any."""
        raise NotImplementedError

    def start(
        self, workers: list[str], tenants: list[Tenant], cores: str | None, logs: Path
    ) -> RunningProxy:
        """Start in front of `workers`; return once a request through it succeeds."""
        port = free_port()
        command, config = self.command(port, workers, tenants, logs)
        process = spawn(self.label.replace(":", "-"), command, cores, logs)
        running = RunningProxy(self, [(HOST, port)], process, config)
        try:
            wait_until(
                lambda: probe(running, tenants[0]), process, self.startup_timeout, self.label
            )
        except BaseException:
            running.stop()
            raise
        return running


def probe(running: RunningProxy, tenant: Tenant) -> bool:
    """One small chat completion through the proxy (to every target): all 200?"""
    body, headers = running.proxy.tenant_fields(tenant)
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Are you there?"}],
        "max_tokens": 2,
        **body,
    }
    for host, port in running.targets:
        answer = httpx.post(
            f"http://{host}:{port}/v1/chat/completions", json=request, headers=headers, timeout=5
        )
        if answer.status_code != 200:
            return False
    return True


@dataclass(frozen=True)
class Direct(Proxy):
    """No proxy: clients spread their streams over the workers themselves."""

    def start(
        self, workers: list[str], tenants: list[Tenant], cores: str | None, logs: Path
    ) -> RunningProxy:
        targets = []
        for url in workers:
            host, port = url.removeprefix("http://").rsplit(":", 1)
            targets.append((host, int(port)))
        running = RunningProxy(self, targets)
        wait_until(lambda: probe(running, tenants[0]), None, 30, "workers")
        return running


def _dist_version(package: str) -> str | None:
    for info in ROUTERS_VENV.glob(f"lib/python*/site-packages/{package}-*.dist-info"):
        return info.name.removeprefix(f"{package}-").removesuffix(".dist-info")
    return None


@dataclass(frozen=True)
class SglangRouter(Proxy):
    """SGLang's model gateway (`sglang-router` 0.3.2, Rust, "smg").

    Started as `python -m sglang_router.launch_router --worker-urls URL... --policy P`.
    At start it checks each worker in the background (`Router ready | workers: []` comes
    first): `GET /health`, an HTTP/2 (gRPC) probe on the same port, which engine-sim's
    uvicorn logs as `Invalid HTTP request received` and the router then uses HTTP, and
    `GET /server_info`, `/get_server_info`, `/model_info`, `/get_model_info`, whose 404s it
    accepts (the worker's model becomes `unknown`, no tokenizer is loaded, so nothing is
    downloaded). Requests are parsed and written anew: `/v1/chat/completions` loses every
    field it does not know, `vllm_xargs` and `user` included, and gains SGLang's own
    (`max_completion_tokens` for `max_tokens`, `separate_reasoning`, ...); unknown fields of
    `/v1/completions` pass through. So through this router, chat requests reach the
    engines without their tenant.
    """

    policy: str | None = "cache_aware"
    policies: ClassVar[tuple[str, ...]] = (
        "cache_aware",
        "round_robin",
        "random",
        "power_of_two",
        "manual",
    )
    stop_grace: ClassVar[float] = 15.0

    def unavailable(self) -> str | None:
        if not (ROUTERS_VENV / "bin" / "python").exists() or self.version() is None:
            return f"sglang-router is not installed in {ROUTERS_VENV} (see bench/routers.py)"
        return None

    def version(self) -> str | None:
        return _dist_version("sglang_router")

    def command(
        self, port: int, workers: list[str], tenants: list[Tenant], logs: Path
    ) -> tuple[list[str], dict[str, Any] | None]:
        return [
            str(ROUTERS_VENV / "bin" / "python"),
            "-m",
            "sglang_router.launch_router",
            "--host",
            HOST,
            "--port",
            str(port),
            "--worker-urls",
            *workers,
            "--policy",
            self.policy or "cache_aware",
            "--prometheus-host",
            HOST,
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warn",
            "--shutdown-grace-period-secs",
            "2",
        ], None


@dataclass(frozen=True)
class VllmRouter(Proxy):
    """vLLM's router (`vllm-router` 0.1.17, Rust, forked from SGLang's).

    Started as `vllm-router --worker-urls URL... --policy P`. At start it waits (up to
    `--worker-startup-timeout-secs`, 600) for `GET /health` of every worker, nothing
    else. With `cache_aware` it asks the chosen worker, for every request, to render the
    prompt first, `POST /v1/chat/completions/render` (or `/v1/completions/render`), then
    `POST /tokenize`; engine-sim answers both with 404 and the router routes on the text,
    but the two extra round trips stay in each request's latency and the worker's CPU
    (`round_robin` makes neither call). Request bodies are rewritten with unknown
    fields kept, so `vllm_xargs` reaches the engines.
    """

    policy: str | None = "cache_aware"
    policies: ClassVar[tuple[str, ...]] = (
        "cache_aware",
        "round_robin",
        "random",
        "power_of_two",
        "consistent_hash",
        "kv_aware",
        "sticky_least_loaded",
    )

    def unavailable(self) -> str | None:
        if not (ROUTERS_VENV / "bin" / "vllm-router").exists():
            return f"vllm-router is not installed in {ROUTERS_VENV} (see bench/routers.py)"
        return None

    def version(self) -> str | None:
        return _dist_version("vllm_router")

    def command(
        self, port: int, workers: list[str], tenants: list[Tenant], logs: Path
    ) -> tuple[list[str], dict[str, Any] | None]:
        return [
            str(ROUTERS_VENV / "bin" / "vllm-router"),
            "--host",
            HOST,
            "--port",
            str(port),
            "--worker-urls",
            *workers,
            "--policy",
            self.policy or "cache_aware",
            "--prometheus-host",
            HOST,
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warning",
        ], None


@dataclass(frozen=True)
class FairpoolGateway(Proxy):
    """fairpool's gateway, `fairpool gateway --config FILE`; tenants by API key."""

    def unavailable(self) -> str | None:
        try:
            check = subprocess.run(
                [str(FAIRPOOL), "gateway", "--help"], capture_output=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"`fairpool gateway --help` failed: {error}"
        if check.returncode != 0:
            return "`fairpool gateway` does not exist yet (`fairpool gateway --help` failed)"
        return None

    def version(self) -> str | None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("fairpool")
        except PackageNotFoundError:
            return None

    def tenant_fields(self, tenant: Tenant) -> tuple[dict[str, Any], dict[str, str]]:
        return {}, {"Authorization": f"Bearer {tenant.key}"}

    def command(
        self, port: int, workers: list[str], tenants: list[Tenant], logs: Path
    ) -> tuple[list[str], dict[str, Any] | None]:
        config = gateway_config(port, free_port(), workers, tenants, self.policy)
        path = logs / f"gateway-{port}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return [str(FAIRPOOL), "gateway", "--config", str(path)], config


GATEWAY_MAX_OUTSTANDING = 8


def gateway_config(
    port: int,
    admin_port: int,
    workers: list[str],
    tenants: list[Tenant],
    policy: str | None,
    groups: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The gateway's configuration file, validated by `GatewayConfig`, as a document."""
    pool: dict[str, Any] = {"name": "bench", "model": MODEL, "workers": {"urls": workers}}
    # At most 8 requests per worker, as a deployment sizes it to what an engine runs at once
    # (the flood's engines, 2,048 KV tokens each, run about 11): beyond that, requests wait
    # in the gateway's fair queue, in VTC order, instead of in the engines' queues.
    pool["routing"] = {"saturation": {"maxOutstanding": GATEWAY_MAX_OUTSTANDING}}
    if policy:
        pool["routing"]["policy"] = policy
    document = {
        "listen": {"host": HOST, "port": port},
        "admin": {"host": HOST, "port": admin_port},
        "pools": [pool],
        "tenants": [
            {
                "tenant": tenant.name,
                "weight": tenant.weight,
                "apiKeySha256": [key_digest(tenant.key)],
                **({"slo": {"class": tenant.band}} if tenant.band else {}),
                **({"group": tenant.group} if tenant.group else {}),
            }
            for tenant in tenants
        ],
    }
    if groups:
        document["groups"] = groups
    config = GatewayConfig.model_validate(document)
    dumped: dict[str, Any] = json.loads(config.model_dump_json(by_alias=True, exclude_none=True))
    return dumped


PROXIES: dict[str, Proxy] = {
    "direct": Direct("direct"),
    "sglang-router": SglangRouter("sglang-router"),
    "vllm-router": VllmRouter("vllm-router"),
    "fairpool": FairpoolGateway("fairpool"),
}


def get_proxy(spec: str) -> Proxy:
    """The table's entry for `NAME` or `NAME:POLICY`."""
    name, _, policy = spec.partition(":")
    if name not in PROXIES:
        raise SystemExit(f"unknown proxy {name!r}; known: {', '.join(PROXIES)}")
    proxy = PROXIES[name]
    if not policy:
        return proxy
    if proxy.policies and policy not in proxy.policies:
        raise SystemExit(f"{name} has no policy {policy!r}; it has {', '.join(proxy.policies)}")
    return dataclasses.replace(proxy, policy=policy)


@contextlib.contextmanager
def running_proxy(
    proxy: Proxy, workers: list[str], tenants: list[Tenant], cores: str | None, logs: Path
) -> Any:
    """`proxy` started in front of `workers` for the `with` block, stopped after it."""
    running = proxy.start(workers, tenants, cores, logs)
    try:
        yield running
    finally:
        running.stop()
