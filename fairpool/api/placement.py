"""`InferencePool.spec.placement`: a pool whose model is split over chains of mixed GPUs.

The planner (`fairpool.placement`, seed 003) turns this into server chains — each one vLLM
engine with pipeline parallelism over the chain's nodes — and the gateway balances requests
over the chains with JFFC. Without `placement` a pool is a set of identical single-node
replicas, as before.

```yaml
placement:
  modelProfile: {numLayers: 80, layerWeightBytes: 1711276032, kvBytesPerTokenPerLayer: 4096}
  nodeGroups:
    - {name: h100, count: 4, gpuMemory: 80Gi, tflops: 400, memoryBandwidthGBps: 2500,
       nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}}
    - {name: l40s, count: 4, gpuMemory: 48Gi, layerSeconds: 0.40,
       nodeSelector: {nvidia.com/gpu.product: NVIDIA-L40S}}
  workload: {arrivalRate: 1.0, meanInputTokens: 2000, meanOutputTokens: 200}
  policy: {targetMaxLoad: 0.7, tuning: lowerBound}
```
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from fairpool.api.common import DNS_LABEL, Spec, cel_rules

#: Kubernetes quantity suffixes for bytes.
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_MULTIPLIERS = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity_bytes(text: str) -> int:
    """Bytes of a Kubernetes quantity such as `80Gi`, `40G` or `85899345920`."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a byte quantity (like 80Gi, 40G or 85899345920): {text!r}")
    number, suffix = match.groups()
    return int(float(number) * _MULTIPLIERS[suffix])


class ModelProfileSpec(Spec):
    """The model's shape as the planner needs it (from the model's config.json)."""

    num_layers: int = Field(
        ge=1, alias="numLayers", description="Decoder layers (num_hidden_layers)."
    )
    layer_weight_bytes: int = Field(
        ge=1,
        alias="layerWeightBytes",
        description="Weight bytes of one layer at the serving dtype or quantization.",
    )
    kv_bytes_per_token_per_layer: int = Field(
        ge=1,
        alias="kvBytesPerTokenPerLayer",
        description="KV-cache bytes per token per layer: 2 x KV heads x head dim x dtype bytes.",
    )
    embedding_bytes: int = Field(
        default=0, ge=0, alias="embeddingBytes", description="Input embedding, on stage 0."
    )
    lm_head_bytes: int = Field(
        default=0, ge=0, alias="lmHeadBytes", description="Norm and LM head, on the last stage."
    )
    flops_per_token_per_layer: float | None = Field(
        default=None,
        gt=0,
        alias="flopsPerTokenPerLayer",
        description="About 2 x parameters per layer; estimates prefill time from tflops.",
    )


class GpuProfile(Spec):
    """How much of a node's GPU memory vLLM may use and how fast the node is: shared by
    node groups and by the GPU classes of discovered nodes."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            ("has(self.layerSeconds) || (has(self.tflops) && has(self.memoryBandwidthGBps))",
             "give layerSeconds, or both tflops and memoryBandwidthGBps"),
        )
    )  # fmt: skip

    memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        alias="memoryUtilization",
        description="Fraction of GPU memory vLLM may use (--gpu-memory-utilization).",
    )
    reserve: str = Field(
        default="0", description="Memory kept back for activations and CUDA graphs, e.g. 4Gi."
    )
    layer_seconds: float | None = Field(
        default=None,
        gt=0,
        alias="layerSeconds",
        description="Measured seconds to run one request's tokens through one layer.",
    )
    tflops: float | None = Field(default=None, gt=0, description="Dense TFLOPS (prefill).")
    memory_bandwidth_gbps: float | None = Field(
        default=None, gt=0, alias="memoryBandwidthGBps", description="GB/s (decode)."
    )
    comm_seconds: float = Field(
        default=0.05,
        ge=0,
        alias="commSeconds",
        description="Network time per request through one node.",
    )

    _reserve = field_validator("reserve")(lambda cls, text: (quantity_bytes(text), text)[1])

    @model_validator(mode="after")
    def _speed_given(self) -> GpuProfile:
        if self.layer_seconds is None and (
            self.tflops is None or self.memory_bandwidth_gbps is None
        ):
            raise ValueError("give layerSeconds, or both tflops and memoryBandwidthGBps")
        return self

    def profile(self) -> dict[str, object]:
        """These fields, by alias: to build another profile (a discovered group) from it."""
        return self.model_dump(by_alias=True, include=set(GpuProfile.model_fields))


class NodeGroupSpec(GpuProfile):
    """Identical GPU nodes: how many, how much memory, how fast."""

    name: str = Field(min_length=1, max_length=40, pattern=DNS_LABEL, description="Group name.")
    count: int = Field(ge=1, le=1024, description="Nodes in the group.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, alias="nodeSelector", description="Labels of the group's nodes."
    )
    gpu_memory: str = Field(
        alias="gpuMemory", description="GPU memory per node (all its GPUs), e.g. 80Gi."
    )
    gpus_per_node: int = Field(
        default=1,
        ge=1,
        le=16,
        alias="gpusPerNode",
        description="GPUs per node, used as tensor parallelism inside the stage.",
    )

    _memory = field_validator("gpu_memory")(lambda cls, text: (quantity_bytes(text), text)[1])

    @property
    def usable_bytes(self) -> int:
        """What vLLM may use of the node's GPU memory, less the reserve."""
        total = int(quantity_bytes(self.gpu_memory) * self.memory_utilization)
        return max(total - quantity_bytes(self.reserve), 0)


class GpuClass(GpuProfile):
    """Speed and memory settings for discovered nodes whose GPU product label matches."""

    product: str = Field(
        min_length=1, description="Value of the nvidia.com/gpu.product node label."
    )


class NodeDiscovery(Spec):
    """Node groups from the cluster's nodes: those matching the selector, grouped by their
    GPU product label, with memory and GPU count from the GPU feature discovery labels."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, alias="nodeSelector", description="Labels of usable nodes."
    )
    gpu_classes: list[GpuClass] = Field(
        min_length=1, alias="gpuClasses", description="Speeds by GPU product; others are skipped."
    )


class PlacementWorkload(Spec):
    """The demand the plan is sized for."""

    arrival_rate: float = Field(gt=0, alias="arrivalRate", description="Requests per second.")
    mean_input_tokens: float = Field(
        default=2000, gt=0, alias="meanInputTokens", description="Mean prompt length."
    )
    mean_output_tokens: float = Field(
        default=200, ge=1, alias="meanOutputTokens", description="Mean output length."
    )


class PlacementPolicy(Spec):
    """How the planner trades chain length against concurrency (the knob c)."""

    target_max_load: float = Field(
        default=0.7, gt=0, lt=1, alias="targetMaxLoad", description="Load the plan aims under."
    )
    capacity_param: int | None = Field(
        default=None,
        ge=1,
        alias="capacityParam",
        description="Concurrent requests every stage reserves KV for; unset: tuned.",
    )
    tuning: Literal["lowerBound", "upperBound", "surrogate"] = Field(
        default="lowerBound",
        description="Score used to tune capacityParam (the paper's best is lowerBound).",
    )
    rebalance_within_chain: bool = Field(
        default=True,
        alias="rebalanceWithinChain",
        description="Re-split a chain's layers to maximize its capacity.",
    )
    max_stages_per_chain: int = Field(
        default=8, ge=1, le=64, alias="maxStagesPerChain", description="Longest pipeline."
    )
    score_tolerance: float = Field(
        default=0.01,
        ge=0,
        lt=1,
        alias="scoreTolerance",
        description="Plans scoring within this fraction of the best count as equal; the "
        "one with the fewest nodes wins.",
    )


class PlacementSpec(Spec):
    """Chains of GPU nodes, each one pipeline-parallel vLLM engine (docs/placement.md)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            ("(has(self.nodeGroups) && size(self.nodeGroups) > 0) != has(self.discovery)",
             "give exactly one of nodeGroups and discovery"),
        )
    )  # fmt: skip

    model_profile: ModelProfileSpec = Field(alias="modelProfile", description="Model shape.")
    node_groups: list[NodeGroupSpec] = Field(
        default_factory=list,
        alias="nodeGroups",
        description="The GPU nodes the pool may use (each name once).",
        # names unique at admission: a list keyed by name
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    discovery: NodeDiscovery | None = Field(
        default=None, description="Instead of nodeGroups: find the nodes by their labels."
    )
    workload: PlacementWorkload = Field(description="Demand the plan is sized for.")
    policy: PlacementPolicy = Field(default_factory=PlacementPolicy, description="Tuning.")

    @model_validator(mode="after")
    def _unique_groups(self) -> PlacementSpec:
        if bool(self.node_groups) == (self.discovery is not None):
            raise ValueError("give exactly one of nodeGroups and discovery")
        names = [group.name for group in self.node_groups]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"node group {duplicates[0]!r} is defined twice")
        return self
