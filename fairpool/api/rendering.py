"""What a pool's engines and the gateway are configured with, derived from the manifests:
pure functions, shared by `fairpool up` (written to files, processes on this machine) and
the operator (rendered into ConfigMaps and Deployments), so local mode and Kubernetes run the
same configuration and the same engine command lines."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from fairpool.api.inference_pool import InferencePool
from fairpool.api.scheduler_config import SchedulerConfig
from fairpool.api.shares import GroupShare
from fairpool.api.tenant_group import fair_order
from fairpool.api.tenant_quota import TenantQuota
from fairpool.sched.errors import ConfigError

#: vLLM's options that already say how many GPUs one replica spreads the model over.
TENSOR_PARALLEL_OPTIONS = ("--tensor-parallel-size", "-tp")


def scheduler_config(
    pool: InferencePool,
    quotas: Iterable[TenantQuota],
    groups: Mapping[str, GroupShare] | None = None,
) -> SchedulerConfig:
    """The engines' scheduler configuration: the pool's policy and the fair order's tree of
    every tenant that may use the pool (`fair_order`: their weights, the groups on their
    paths, their bands) with the pool's bands; others get the default weight, 1, in the
    standard band."""
    spec = pool.spec.scheduler
    allowed = [quota.place() for quota in quotas if quota.spec.may_use(pool.name)]
    order = fair_order(allowed, groups or {}, spec.bands.by_band())
    return SchedulerConfig(
        policy=spec.policy,
        memorySafe=spec.memory_safe,
        quantum=spec.quantum,
        shareMemory=spec.share_memory,
        cost=spec.cost,
        tenants=order.weights,
        groups=order.groups,
        tenantGroups=order.tenant_groups,
        tenantBands=order.tenant_bands,
        bands=order.bands,
    )


#: Fields of the scheduler configuration left out of the file while empty (no groups, every
#: tenant in the standard band): a pool without a tree renders as before it had one.
OMITTED_WHEN_EMPTY = ("groups", "tenantGroups", "tenantBands")


def scheduler_config_document(config: SchedulerConfig) -> dict[str, object]:
    """The file's content, in its YAML spelling (camelCase, unset fields left out)."""
    document = config.model_dump(by_alias=True, exclude_none=True)
    return {
        key: value
        for key, value in document.items()
        if not (key in OMITTED_WHEN_EMPTY and not value)
    }


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
