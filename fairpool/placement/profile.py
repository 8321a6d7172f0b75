"""The planner's human-level inputs, and the paper's quantities derived from them.

Sun, He, Hou 2026, seed 003, §2.1.2 and footnote 11 (τ^p from hardware speeds), mapped to
vLLM as in digest §6.1: a node (one GPU, or several running tensor parallelism inside the
node) is a server; its usable memory M_j = ⌊memory·utilization⌋ − reserve in exact integer
bytes; one cache slot s_c is the KV of one request of `max_model_len` tokens on one layer.
Field names in errors are the camelCase names of the fields, under their section.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from fairpool.placement.model import Server
from fairpool.sched.errors import (
    ConfigError,
    require_count,
    require_non_negative,
    require_positive,
)

#: t_o of footnote 11: fixed overhead per layer per request.
LAYER_OVERHEAD_SECONDS = 0.001


@dataclass(frozen=True)
class ModelProfile:
    """A decoder of `layers` identical layers (digest §6.4 `model`)."""

    layers: int  # L = num_hidden_layers
    layer_bytes: int  # s_m at the serving dtype or quantization
    kv_bytes_per_token_per_layer: int  # 2 · KV heads · head dim · KV dtype bytes
    max_model_len: int
    embedding_bytes: int = 0  # held by stage 0 only
    head_bytes: int = 0  # norm + lm_head, held by the last stage only
    flops_per_token_per_layer: float | None = None  # F, to estimate τ^p from tflops

    def __post_init__(self) -> None:
        require_count("model.layers", self.layers, minimum=1)
        require_count("model.layerBytes", self.layer_bytes, minimum=1)
        require_count("model.kvBytesPerTokenPerLayer", self.kv_bytes_per_token_per_layer, 1)
        require_count("model.maxModelLen", self.max_model_len, minimum=1)
        require_count("model.embeddingBytes", self.embedding_bytes)
        require_count("model.headBytes", self.head_bytes)
        if self.flops_per_token_per_layer is not None:
            require_positive("model.flopsPerTokenPerLayer", self.flops_per_token_per_layer)

    @property
    def slot_bytes(self) -> int:
        """s_c: KV bytes of one request of max_model_len tokens on one layer."""
        return self.kv_bytes_per_token_per_layer * self.max_model_len


@dataclass(frozen=True)
class NodeGroup:
    """`count` identical nodes. Memory, TFLOPS and bandwidth are the node's totals over its
    `gpus` GPUs (tensor parallel inside the node); `layer_seconds` is measured at that size."""

    name: str
    count: int
    memory_bytes: int  # GPU memory per node, all its GPUs
    memory_utilization: float = 0.9  # vLLM's --gpu-memory-utilization
    reserve_bytes: int = 0  # activations, CUDA graphs, runtime
    layer_seconds: float | None = None  # measured τ^p: one request's tokens through one layer
    tflops: float | None = None  # dense TFLOPS, for prefill
    bandwidth_gbps: float | None = None  # memory bandwidth in GB/s (10⁹ bytes/s), for decode
    comm_seconds: float = 0.05  # τ^c: network time per request through one node
    gpus: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("nodeGroups[].name", "must be a non-empty string")
        field = f"nodeGroups[{self.name}]"
        require_count(f"{field}.count", self.count, minimum=1)
        require_count(f"{field}.memoryBytes", self.memory_bytes, minimum=1)
        utilization = require_positive(f"{field}.memoryUtilization", self.memory_utilization)
        if utilization > 1:
            raise ConfigError(f"{field}.memoryUtilization", f"must be ≤ 1, got {utilization}")
        require_count(f"{field}.reserveBytes", self.reserve_bytes)
        for name, value in (
            ("layerSeconds", self.layer_seconds),
            ("tflops", self.tflops),
            ("bandwidthGbps", self.bandwidth_gbps),
        ):
            if value is not None:
                require_positive(f"{field}.{name}", value)
        require_non_negative(f"{field}.commSeconds", self.comm_seconds)
        require_count(f"{field}.gpus", self.gpus, minimum=1)
        if self.usable_bytes < 1:
            raise ConfigError(f"{field}.reserveBytes", "leaves no usable memory")

    @property
    def usable_bytes(self) -> int:
        """M_j = ⌊memory · utilization⌋ − reserve, exactly (utilization as written)."""
        share = Fraction(str(self.memory_utilization))
        return math.floor(self.memory_bytes * share) - self.reserve_bytes


@dataclass(frozen=True)
class Workload:
    """The demand the plan is sized for."""

    arrival_rate: float  # λ, requests per second
    mean_input_tokens: float
    mean_output_tokens: float
    target_load: float = 0.7  # ρ̄

    def __post_init__(self) -> None:
        require_positive("workload.arrivalRate", self.arrival_rate)
        require_non_negative("workload.meanInputTokens", self.mean_input_tokens)
        if require_positive("workload.meanOutputTokens", self.mean_output_tokens) < 1:
            raise ConfigError("workload.meanOutputTokens", "must be ≥ 1 (the first token)")
        load = require_positive("workload.targetLoad", self.target_load)
        if load >= 1:
            raise ConfigError("workload.targetLoad", f"must be < 1, got {load}")


@dataclass(frozen=True)
class PlanPolicy:
    """How the planner tunes c and maps chains to engines."""

    capacity_param: int | None = None  # c; None: tuned
    tuning: Literal["lowerBound", "surrogate", "upperBound"] = "lowerBound"
    rebalance: bool = True
    max_stages: int = 8
    #: Scores within this fraction of the best tie; ties go to the plan with fewest nodes.
    score_tolerance: float = 0.01

    def __post_init__(self) -> None:
        if self.capacity_param is not None:
            require_count("policy.capacityParam", self.capacity_param, minimum=1)
        if self.tuning not in ("lowerBound", "surrogate", "upperBound"):
            raise ConfigError(
                "policy.tuning", f"must be lowerBound, surrogate or upperBound: {self.tuning!r}"
            )
        require_count("policy.maxStages", self.max_stages, minimum=1)
        if not 0 <= self.score_tolerance < 1:
            raise ConfigError("policy.scoreTolerance", "must be within [0, 1)")


def layer_seconds(group: NodeGroup, model: ModelProfile, workload: Workload) -> float:
    """τ^p of a node: measured, else footnote 11 of Sun, He, Hou 2026, seed 003:
    t_o + (F/f)·l_in + (s_m/b)·(l_out − 1) — prefill compute-bound, decode memory-bound."""
    if group.layer_seconds is not None:
        return group.layer_seconds
    field = f"nodeGroups[{group.name}]"
    if group.tflops is None:
        raise ConfigError(f"{field}.tflops", "needed to estimate layerSeconds (or give it)")
    if group.bandwidth_gbps is None:
        raise ConfigError(f"{field}.bandwidthGbps", "needed to estimate layerSeconds (or give it)")
    if model.flops_per_token_per_layer is None:
        raise ConfigError(
            "model.flopsPerTokenPerLayer", f"needed to estimate layerSeconds of {group.name}"
        )
    prefill = model.flops_per_token_per_layer / (group.tflops * 1e12) * workload.mean_input_tokens
    decode = model.layer_bytes / (group.bandwidth_gbps * 1e9) * (workload.mean_output_tokens - 1)
    return LAYER_OVERHEAD_SECONDS + prefill + decode


def build_servers(
    model: ModelProfile, groups: Sequence[NodeGroup], workload: Workload
) -> tuple[Server, ...]:
    """One server per node, named f"{group}-{i}", in the order the groups are given.

    vLLM needs one tensor-parallel size on every stage of an engine, so a pool mixing
    groups of different `gpus` is rejected: plan one pool per size instead."""
    if not groups:
        raise ConfigError("nodeGroups", "must name at least one node group")
    names = [group.name for group in groups]
    if len(set(names)) != len(names):
        raise ConfigError("nodeGroups", "group names must be unique")
    sizes = sorted({group.gpus for group in groups})
    if len(sizes) > 1:
        raise ConfigError(
            "nodeGroups",
            f"mixes tensor-parallel sizes (gpus {', '.join(map(str, sizes))}); vLLM needs one "
            "size on every stage of a chain: plan one pool per gpus value",
        )
    return tuple(
        Server(
            name=f"{group.name}-{i}",
            memory=group.usable_bytes,
            comm_seconds=group.comm_seconds,
            layer_seconds=layer_seconds(group, model, workload),
            group=group.name,
        )
        for group in groups
        for i in range(group.count)
    )
