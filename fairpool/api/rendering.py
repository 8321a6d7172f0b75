"""What a pool's engines and the gateway are configured with, derived from the manifests:
pure functions, shared by `fairpool up` (written to files, processes on this machine) and
the operator (rendered into ConfigMaps and Deployments), so local mode and Kubernetes run the
same configuration and the same engine command lines."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fairpool.api.inference_pool import InferencePool
from fairpool.api.scheduler_config import SchedulerConfig
from fairpool.api.tenant_quota import TenantQuota
from fairpool.sched.errors import ConfigError

#: vLLM's options that already say how many GPUs one replica spreads the model over.
TENSOR_PARALLEL_OPTIONS = ("--tensor-parallel-size", "-tp")


def scheduler_config(pool: InferencePool, quotas: Iterable[TenantQuota]) -> SchedulerConfig:
    """The engines' scheduler configuration: the pool's policy and the weights of every
    tenant that may use the pool (others get the default weight, 1)."""
    spec = pool.spec.scheduler
    return SchedulerConfig(
        policy=spec.policy,
        memorySafe=spec.memory_safe,
        quantum=spec.quantum,
        shareMemory=spec.share_memory,
        cost=spec.cost,
        tenants={
            quota.tenant: quota.spec.weight for quota in quotas if quota.spec.may_use(pool.name)
        },
    )


def scheduler_config_document(config: SchedulerConfig) -> dict[str, object]:
    """The file's content, in its YAML spelling (camelCase, defaults left out)."""
    return config.model_dump(by_alias=True, exclude_none=True)


def engine_arguments(
    pool: InferencePool,
    *,
    host: str,
    port: int,
    scheduler_config: str,
    model: str | None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The `fairpool` subcommand and its arguments that run one replica of `pool`.

    `engine.kind: sim` runs `fairpool engine-sim`; `vllm` runs `fairpool engine` (vLLM with
    the fair scheduler) on the weights at `model` (a directory or a hub id), serving them as
    the pool's model name; a replica of more than one GPU gets vLLM's tensor parallelism over
    them unless the pool's extra arguments choose it. `extra` comes before the pool's own
    `engine.extraArgs`, which come last so that they can override anything.
    """
    spec = pool.spec
    common = ["--host", host, "--port", str(port), "--scheduler-config", scheduler_config]
    if spec.engine.kind == "sim":
        sim = spec.engine.sim
        arguments = ["engine-sim", *common, "--model", spec.model.name]
        arguments += ["--profile", sim.profile, "--speedup", str(sim.speedup)]
        if sim.memory_tokens is not None:
            arguments += ["--memory-tokens", str(sim.memory_tokens)]
    else:
        if model is None:
            raise ConfigError(
                f"InferencePool {pool.name}: spec.model.source",
                "engine kind vllm needs the model's weights",
            )
        arguments = ["engine", "--model", model, "--served-model-name", spec.model.name, *common]
        gpus = spec.gpus
        chosen = any(
            argument.split("=")[0] in TENSOR_PARALLEL_OPTIONS for argument in spec.engine.extra_args
        )
        if gpus > 1 and not chosen:
            arguments += ["--tensor-parallel-size", str(gpus)]
    if spec.model.max_model_len is not None:
        arguments += ["--max-model-len", str(spec.model.max_model_len)]
    return [*arguments, *extra, *spec.engine.extra_args]
