"""From an InferencePool's `spec.placement` to the planner's chains (`fairpool.placement`).

`pool_plan(pool, nodes)` converts the spec — byte quantities, node groups given or
discovered from the cluster's Nodes, the workload and the tuning policy — into the planner's
inputs and returns its plan. The operator renders the plan (one pipeline-parallel engine per
chain), `fairpool plan` prints it. Errors are `ConfigError`s naming the field.

Discovery (`placement.discovery`) groups the Nodes that match `discovery.nodeSelector` and
are not cordoned by the labels of NVIDIA's GPU feature discovery: `nvidia.com/gpu.product`
picks the `gpuClasses` entry (speeds, memory utilization, reserve), `nvidia.com/gpu.memory`
(MiB per GPU) times `nvidia.com/gpu.count` is the node's memory. Nodes of a product without
a class, or without those labels, are left out, and the plan's explanation says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fairpool.api.inference_pool import InferencePool
from fairpool.api.manifests import read_documents
from fairpool.api.placement import GpuClass, NodeDiscovery, NodeGroupSpec, quantity_bytes
from fairpool.placement.planner import (
    ModelProfile,
    NodeGroup,
    PlanPolicy,
    PoolPlan,
    Workload,
    plan_chains,
)
from fairpool.sched.errors import ConfigError

#: The labels NVIDIA's GPU feature discovery puts on GPU nodes.
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU
COUNT_LABEL = "nvidia.com/gpu.count"
#: How many node names an explanation line lists before it says "and N more".
LISTED_NODES = 5


@dataclass(frozen=True)
class DiscoveredGroups:
    """Node groups found among the cluster's Nodes, and what was left out and why."""

    groups: list[NodeGroupSpec] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def pool_plan(pool: InferencePool, nodes: Sequence[Mapping[str, Any]] | None = None) -> PoolPlan:
    """The planner's chains for a pool with `spec.placement`; `nodes` (Node objects as the
    API serves them) are needed when the placement discovers its nodes. Errors name the
    planner's field; `spec_field` turns that into the pool's."""
    placement = pool.spec.placement
    if placement is None:
        raise ConfigError("spec.placement", "not set: the pool has no pipeline placement")
    found = node_groups(pool, nodes)
    groups, notes = found.groups, found.notes
    max_model_len = pool.spec.model.max_model_len
    if max_model_len is None:  # the pool's validation requires it with placement
        raise ConfigError("spec.model.maxModelLen", "required with placement (it sizes KV)")
    profile = placement.model_profile
    model = ModelProfile(
        layers=profile.num_layers,
        layer_bytes=profile.layer_weight_bytes,
        kv_bytes_per_token_per_layer=profile.kv_bytes_per_token_per_layer,
        max_model_len=max_model_len,
        embedding_bytes=profile.embedding_bytes,
        head_bytes=profile.lm_head_bytes,
        flops_per_token_per_layer=profile.flops_per_token_per_layer,
    )
    workload = Workload(
        arrival_rate=placement.workload.arrival_rate,
        mean_input_tokens=placement.workload.mean_input_tokens,
        mean_output_tokens=placement.workload.mean_output_tokens,
        target_load=placement.policy.target_max_load,
    )
    policy = PlanPolicy(
        capacity_param=placement.policy.capacity_param,
        tuning=placement.policy.tuning,
        rebalance=placement.policy.rebalance_within_chain,
        max_stages=placement.policy.max_stages_per_chain,
        score_tolerance=placement.policy.score_tolerance,
    )
    plan = plan_chains(model, [planner_group(group) for group in groups], workload, policy)
    if notes:
        plan = replace(plan, explanation=[*notes, *plan.explanation])
    return plan


def node_groups(
    pool: InferencePool, nodes: Sequence[Mapping[str, Any]] | None = None
) -> DiscoveredGroups:
    """The pool's node groups: as given in `placement.nodeGroups`, or discovered."""
    placement = pool.spec.placement
    if placement is None:
        raise ConfigError("spec.placement", "not set: the pool has no pipeline placement")
    if placement.discovery is None:
        return DiscoveredGroups(list(placement.node_groups))
    if nodes is None:
        raise ConfigError(
            "spec.placement.discovery",
            "needs the cluster's Nodes and none were read (the operator lists them with the "
            "chart's ClusterRole; fairpool plan and render read kubectl get nodes -o yaml "
            "from --nodes FILE)",
        )
    found = groups_from_nodes(placement.discovery, nodes)
    if not found.groups:
        raise ConfigError(
            "spec.placement.discovery",
            "no usable node: " + ("; ".join(found.notes) or "no Node matches nodeSelector"),
        )
    return found


#: The planner's field names where the spec's differ (under spec.placement).
_SPEC_NAMES = {
    "model.layers": "modelProfile.numLayers",
    "model.layerBytes": "modelProfile.layerWeightBytes",
    "model.headBytes": "modelProfile.lmHeadBytes",
    "workload.targetLoad": "policy.targetMaxLoad",
    "policy.maxStages": "policy.maxStagesPerChain",
    "policy.rebalance": "policy.rebalanceWithinChain",
}
_GROUP_NAMES = {
    "bandwidthGbps": "memoryBandwidthGBps",
    "reserveBytes": "reserve",
    "memoryBytes": "gpuMemory",
    "gpus": "gpusPerNode",
}


def spec_field(parameter: str, pool: InferencePool | None = None) -> str:
    """The pool's field for a field the planner names (`model.layers` →
    `spec.placement.modelProfile.numLayers`; node groups under `discovery` when the pool
    discovers them)."""
    if parameter.startswith("spec."):
        return parameter
    if parameter == "model.maxModelLen":
        return "spec.model.maxModelLen"
    if parameter in _SPEC_NAMES:
        return f"spec.placement.{_SPEC_NAMES[parameter]}"
    if parameter.startswith("model."):
        return f"spec.placement.modelProfile.{parameter.removeprefix('model.')}"
    if parameter.startswith("nodeGroups"):
        head, dot, name = parameter.partition("].")
        tail = f"{head}].{_GROUP_NAMES.get(name, name)}" if dot else parameter
        placement = pool.spec.placement if pool is not None else None
        if placement is not None and placement.discovery is not None:
            tail = "discovery" + tail.removeprefix("nodeGroups")
        return f"spec.placement.{tail}"
    return f"spec.placement.{parameter}"


def planner_group(group: NodeGroupSpec) -> NodeGroup:
    """The planner's node group: memory in bytes, speeds as given."""
    return NodeGroup(
        name=group.name,
        count=group.count,
        memory_bytes=quantity_bytes(group.gpu_memory),
        memory_utilization=group.memory_utilization,
        reserve_bytes=quantity_bytes(group.reserve),
        layer_seconds=group.layer_seconds,
        tflops=group.tflops,
        bandwidth_gbps=group.memory_bandwidth_gbps,
        comm_seconds=group.comm_seconds,
        gpus=group.gpus_per_node,
    )


def groups_from_nodes(
    discovery: NodeDiscovery, nodes: Sequence[Mapping[str, Any]]
) -> DiscoveredGroups:
    """Node groups of identical GPU nodes among `nodes`: those matching the selector, not
    cordoned, labelled by GPU feature discovery, of a product that has a `gpuClasses` entry.
    One group per product and GPU count; each group selects its nodes by the discovery's
    selector plus the product label (and the count label where one product comes with
    different counts)."""
    classes = {gpu_class.product: gpu_class for gpu_class in discovery.gpu_classes}
    members: dict[tuple[str, int], list[tuple[str, int]]] = {}
    skipped: dict[str, list[str]] = {}
    for node in sorted(nodes, key=_node_name):
        name = _node_name(node)
        labels = (node.get("metadata") or {}).get("labels") or {}
        if any(labels.get(key) != value for key, value in discovery.node_selector.items()):
            continue
        if (node.get("spec") or {}).get("unschedulable"):
            skipped.setdefault("cordoned", []).append(name)
            continue
        product = labels.get(PRODUCT_LABEL)
        if product is None:
            skipped.setdefault(f"no {PRODUCT_LABEL} label", []).append(name)
            continue
        if product not in classes:
            skipped.setdefault(f"product {product} has no gpuClasses entry", []).append(name)
            continue
        memory_mib, count = _integer(labels.get(MEMORY_LABEL)), _gpu_count(node, labels)
        if memory_mib is None or count is None:
            reason = f"no {MEMORY_LABEL} label" if memory_mib is None else "no GPU count"
            skipped.setdefault(reason, []).append(name)
            continue
        members.setdefault((product, count), []).append((name, memory_mib))

    counts_of: dict[str, set[int]] = {}
    for product, count in members:
        counts_of.setdefault(product, set()).add(count)
    groups: list[NodeGroupSpec] = []
    notes: list[str] = []
    names: set[str] = set()
    for (product, count), found in sorted(members.items()):
        several_counts = len(counts_of[product]) > 1
        name = _group_name(product, count if several_counts else None, names)
        names.add(name)
        memory_mib = min(memory for _, memory in found)
        if any(memory != memory_mib for _, memory in found):
            notes.append(f"group {name}: nodes differ in {MEMORY_LABEL}; planned with the least")
        selector = {**discovery.node_selector, PRODUCT_LABEL: product}
        if several_counts:
            selector[COUNT_LABEL] = str(count)
        groups.append(
            _group_of_class(classes[product], name, len(found), memory_mib * count, count, selector)
        )
    for reason, left_out in sorted(skipped.items()):
        notes.append(f"left out {len(left_out)} node(s), {reason}: {_listing(left_out)}")
    return DiscoveredGroups(groups, notes)


def read_nodes(path: str | Path, option: str = "--nodes") -> list[dict[str, Any]]:
    """The Node objects in a file: `kubectl get nodes -o yaml` (a List) or Node documents."""
    nodes = []
    for where, document in read_documents(Path(path), option):
        items = document.get("items") if document.get("kind") == "List" else [document]
        for number, item in enumerate(items or []):
            if not isinstance(item, dict):
                raise ConfigError(f"{where}: items[{number}]", "must be a mapping")
            if item.get("kind", "Node") == "Node":
                nodes.append(item)
    return nodes


def _group_of_class(
    gpu_class: GpuClass,
    name: str,
    count: int,
    memory_mib: int,
    gpus: int,
    selector: dict[str, str],
) -> NodeGroupSpec:
    return NodeGroupSpec.model_validate(
        {
            "name": name,
            "count": count,
            "nodeSelector": selector,
            "gpuMemory": f"{memory_mib}Mi",
            "gpusPerNode": gpus,
            **gpu_class.profile(),
        }
    )


def _group_name(product: str, count: int | None, taken: set[str]) -> str:
    """A DNS label from the product (NVIDIA-H100-80GB-HBM3 → nvidia-h100-80gb-hbm3), with
    `-x<count>` when one product comes with different GPU counts per node."""
    suffix = f"-x{count}" if count is not None else ""
    base = re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-") or "gpu"
    name = f"{base[: 40 - len(suffix)].rstrip('-')}{suffix}"
    number = 2
    while name in taken:
        tail = f"-{number}"
        name = f"{base[: 40 - len(suffix) - len(tail)].rstrip('-')}{suffix}{tail}"
        number += 1
    return name


def _gpu_count(node: Mapping[str, Any], labels: Mapping[str, str]) -> int | None:
    """GPUs of the node: its count label, else its nvidia.com/gpu capacity."""
    count = _integer(labels.get(COUNT_LABEL))
    if count is None:
        capacity = ((node.get("status") or {}).get("capacity") or {}).get("nvidia.com/gpu")
        count = _integer(capacity)
    return count if count else None


def _integer(text: object) -> int | None:
    try:
        value = int(str(text))
    except ValueError:
        return None
    return value if value > 0 else None


def _node_name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED_NODES])
    more = len(names) - LISTED_NODES
    return f"{shown} and {more} more" if more > 0 else shown
