"""A placement pool's chains as Kubernetes objects: pure functions, like `render`.

Each chain of the plan (`fairpool.api.pool_plan`) is one vLLM engine with pipeline
parallelism over its stages, one node per stage, in vLLM's multi-node multiprocessing mode:
every stage pod runs `fairpool engine … --pipeline-parallel-size n --tensor-parallel-size g
--nnodes n --node-rank i --master-addr <stage 0> --distributed-executor-backend mp`, with
the same `VLLM_PP_LAYER_PARTITION` (node rank i is stage i, so the partition is in stage
order); stages after the first run `--headless` (no API server). Stage 0 serves the OpenAI
API; the chain's Service `<pool>-<chain>` points at it, and the gateway's entry for the
pool lists that Service's URL with the chain's capacity and service rate (JFFC).

A chain becomes
- a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, one group of `size` = stages: the leader
  is stage 0, the workers stages 1..n-1, ranked by LWS_WORKER_INDEX) when the operator may
  use LWS and the stages after the first are all of one node group (a LeaderWorkerSet has
  one worker template);
- otherwise one single-replica StatefulSet per stage, `<pool>-<chain>-s<i>`, and a headless
  Service `<pool>-<chain>-head` that gives stage 0 the stable name
  `<pool>-<chain>-s0-0.<pool>-<chain>-head.<namespace>.svc` (published before it is ready:
  stage 0 becomes ready only once every stage has joined);
- a one-replica Deployment `<pool>-<chain>`, no pipeline flags, when it has one stage (or
  the pool's engine is `sim`, which runs each chain as one simulated engine).

Every stage pod selects its node group, asks for the group's GPUs, and carries a required
pod anti-affinity against every other stage pod of the pool: two stages never share a node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fairpool.api.inference_pool import InferencePool
from fairpool.api.placement import NodeGroupSpec
from fairpool.api.rendering import engine_arguments
from fairpool.placement.planner import PlannedChain, PoolPlan
from fairpool.sched.errors import ConfigError
from fairpool_operator import contract
from fairpool_operator.config import OperatorConfig
from fairpool_operator.render import (
    Manifest,
    engine_container,
    engine_pod_spec,
    finish,
    model_argument,
    model_cache_claims,
    object_metadata,
    pod_resources,
    pod_template,
)

HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"


def chain_objects(
    pool: InferencePool,
    plan: PoolPlan,
    groups: Sequence[NodeGroupSpec],
    config: OperatorConfig,
) -> list[Manifest]:
    """The model cache's claim, if the pool keeps one, then every chain's workload and
    Services, chain by chain (the plan's order)."""
    by_name = {group.name: group for group in groups}
    objects: list[Manifest] = model_cache_claims(pool, config.namespace)
    for chain in plan.chains:
        stages = [_group(by_name, name, chain) for name in chain.groups]
        objects += _chain(pool, chain, stages, config)
    return objects


def chain_url(pool: InferencePool, chain: str, namespace: str) -> str:
    """Where the gateway reaches a chain: its Service, on the engine port."""
    service = contract.chain_name(pool.name, chain)
    return f"http://{service}.{namespace}.svc:{contract.ENGINE_PORT}"


def uses_leader_worker_set(chain: PlannedChain, config: OperatorConfig) -> bool:
    """LWS when allowed and stages 1..n-1 share one node group (one worker template)."""
    workers = set(chain.groups[1:])
    return bool(config.leader_worker_set) and len(workers) == 1


def _chain(
    pool: InferencePool,
    chain: PlannedChain,
    stages: list[NodeGroupSpec],
    config: OperatorConfig,
) -> list[Manifest]:
    service = chain_service(pool, chain.name, config.namespace)
    if len(stages) == 1 or pool.spec.engine.kind == "sim":
        return [single_engine(pool, chain, stages[0], config), service]
    if uses_leader_worker_set(chain, config):
        return [leader_worker_set(pool, chain, stages, config), service]
    head = head_service(pool, chain.name, config.namespace)
    statefulsets = [
        stage_statefulset(pool, chain, stages, rank, config) for rank in range(len(stages))
    ]
    return [*statefulsets, head, service]


# --- the objects ------------------------------------------------------------------------------


def chain_service(pool: InferencePool, chain: str, namespace: str) -> Manifest:
    """ClusterIP on stage 0's OpenAI port: the gateway's worker URL for the chain."""
    name = contract.chain_name(pool.name, chain)
    return finish(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _chain_metadata(pool, name, namespace, chain),
            "spec": {
                "selector": _stage_labels(pool, chain, "0", selector=True),
                "ports": [
                    {
                        "name": contract.PORT_NAME,
                        "port": contract.ENGINE_PORT,
                        "targetPort": contract.PORT_NAME,
                        "protocol": "TCP",
                    }
                ],
            },
        }
    )


def head_service(pool: InferencePool, chain: str, namespace: str) -> Manifest:
    """Headless, for the StatefulSets: stage 0's DNS name, published while not ready (it
    is ready only after the other stages reached it through this name)."""
    name = contract.head_name(pool.name, chain)
    return finish(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _chain_metadata(pool, name, namespace, chain),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": _stage_labels(pool, chain, "0", selector=True),
                "ports": [
                    {
                        "name": contract.MASTER_PORT_NAME,
                        "port": contract.MASTER_PORT,
                        "targetPort": contract.MASTER_PORT,
                        "protocol": "TCP",
                    }
                ],
            },
        }
    )


def single_engine(
    pool: InferencePool, chain: PlannedChain, group: NodeGroupSpec, config: OperatorConfig
) -> Manifest:
    """A chain of one node: a plain engine, one replica, no pipeline parallelism."""
    simulated = pool.spec.engine.kind == "sim"
    extra = [] if simulated else _single_node_flags(pool, chain, group)
    arguments = _arguments(pool, extra)
    gpus = 0 if simulated else group.gpus_per_node
    container = engine_container(pool, config, arguments, pod_resources(pool, gpus))
    labels = _stage_labels(pool, chain.name, "0")
    selector = pool.spec.engine.node_selector if simulated else _node_selector(pool, group)
    affinity = None if simulated else _anti_affinity(pool)
    pod_spec = engine_pod_spec(pool, config, container, selector, affinity)
    name = contract.chain_name(pool.name, chain.name)
    spec: dict[str, Any] = {
        "replicas": 1,
        "selector": {"matchLabels": _stage_labels(pool, chain.name, "0", selector=True)},
    }
    if gpus:  # no spare GPU for a surge
        spec["strategy"] = {"type": "Recreate"}
    spec["template"] = pod_template(pool, labels, pod_spec)
    return finish(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _chain_metadata(pool, name, config.namespace, chain.name),
            "spec": spec,
        }
    )


def stage_statefulset(
    pool: InferencePool,
    chain: PlannedChain,
    stages: list[NodeGroupSpec],
    rank: int,
    config: OperatorConfig,
) -> Manifest:
    """One stage of a chain without LWS: a StatefulSet of one pod, `<name>-0`."""
    master = (
        f"{contract.stage_name(pool.name, chain.name, 0)}-0."
        f"{contract.head_name(pool.name, chain.name)}.{config.namespace}.svc"
    )
    group = stages[rank]
    pod = _stage_pod(pool, chain, stages, group, str(rank), master, config)
    name = contract.stage_name(pool.name, chain.name, rank)
    return finish(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": _chain_metadata(pool, name, config.namespace, chain.name),
            "spec": {
                "replicas": 1,
                "serviceName": contract.head_name(pool.name, chain.name),
                "podManagementPolicy": "Parallel",
                "selector": {
                    "matchLabels": _stage_labels(pool, chain.name, str(rank), selector=True)
                },
                "template": pod,
            },
        }
    )


def leader_worker_set(
    pool: InferencePool,
    chain: PlannedChain,
    stages: list[NodeGroupSpec],
    config: OperatorConfig,
) -> Manifest:
    """One LWS group: the leader is stage 0, the workers stages 1..n-1 (all of one group);
    LWS_LEADER_ADDRESS names the leader, LWS_WORKER_INDEX is the node rank. A pod that
    fails restarts the whole group (vLLM's process group cannot take a member back)."""
    master = f"$({contract.LWS_LEADER_ADDRESS_ENV})"
    leader = _stage_pod(pool, chain, stages, stages[0], "0", master, config)
    workers = _stage_pod(pool, chain, stages, stages[1], contract.LWS_WORKERS_STAGE, master, config)
    name = contract.chain_name(pool.name, chain.name)
    return finish(
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": _chain_metadata(pool, name, config.namespace, chain.name),
            "spec": {
                "replicas": 1,
                "startupPolicy": "LeaderCreated",
                "rolloutStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
                },
                "leaderWorkerTemplate": {
                    "size": len(stages),
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": leader,
                    "workerTemplate": workers,
                },
            },
        }
    )


# --- the stage pods ---------------------------------------------------------------------------


def _stage_pod(
    pool: InferencePool,
    chain: PlannedChain,
    stages: list[NodeGroupSpec],
    group: NodeGroupSpec,
    stage: str,
    master: str,
    config: OperatorConfig,
) -> dict[str, Any]:
    """The pod template of stage `stage` ("0", "1", ... or the LWS workers)."""
    rank = f"$({contract.LWS_WORKER_INDEX_ENV})" if stage == contract.LWS_WORKERS_STAGE else stage
    head = stage == "0"
    flags = pipeline_flags(pool, chain, stages, group, rank, master, headless=not head)
    env = [{"name": contract.PP_PARTITION_ENV, "value": chain.partition_string}]
    container = engine_container(
        pool,
        config,
        _arguments(pool, flags),
        pod_resources(pool, group.gpus_per_node),
        env=env,
        serves_http=head,
    )
    if head:
        container["ports"].append(
            {
                "name": contract.MASTER_PORT_NAME,
                "containerPort": contract.MASTER_PORT,
                "protocol": "TCP",
            }
        )
    pod_spec = engine_pod_spec(
        pool, config, container, _node_selector(pool, group), _anti_affinity(pool)
    )
    return pod_template(pool, _stage_labels(pool, chain.name, stage), pod_spec)


def pipeline_flags(
    pool: InferencePool,
    chain: PlannedChain,
    stages: list[NodeGroupSpec],
    group: NodeGroupSpec,
    rank: str,
    master: str,
    headless: bool,
) -> list[str]:
    """vLLM's options for one stage of a multi-node pipeline (multiprocessing backend)."""
    sizes = sorted({stage.gpus_per_node for stage in stages})
    if len(sizes) > 1:
        raise ConfigError(
            f"spec.placement: chain {chain.name}",
            f"stages differ in gpusPerNode ({sizes}); vLLM needs one tensor-parallel size",
        )
    flags = [
        "--pipeline-parallel-size",
        str(len(stages)),
        "--tensor-parallel-size",
        str(group.gpus_per_node),
        "--nnodes",
        str(len(stages)),
        "--node-rank",
        rank,
        "--master-addr",
        master,
        "--master-port",
        str(contract.MASTER_PORT),
        "--distributed-executor-backend",
        "mp",
        "--max-num-seqs",
        str(max(chain.capacity, 1)),
        "--gpu-memory-utilization",
        str(group.memory_utilization),
    ]
    if headless:
        flags.append("--headless")
    return flags


def _single_node_flags(pool: InferencePool, chain: PlannedChain, group: NodeGroupSpec) -> list[str]:
    flags = []
    if group.gpus_per_node > 1:
        flags += ["--tensor-parallel-size", str(group.gpus_per_node)]
    flags += ["--max-num-seqs", str(max(chain.capacity, 1))]
    flags += ["--gpu-memory-utilization", str(group.memory_utilization)]
    return flags


def _arguments(pool: InferencePool, extra: list[str]) -> list[str]:
    """The engine's command line with `extra` before the pool's extraArgs; the GPUs are the
    node group's (in `extra`), not `engine.resources.gpus`."""
    resources = pool.spec.engine.resources.model_copy(update={"gpus": 0})
    engine = pool.spec.engine.model_copy(update={"resources": resources})
    without_gpus = pool.model_copy(update={"spec": pool.spec.model_copy(update={"engine": engine})})
    return engine_arguments(
        without_gpus,
        host="0.0.0.0",
        port=contract.ENGINE_PORT,
        scheduler_config=contract.SCHEDULER_PATH,
        model=model_argument(pool),
        extra=extra,
    )


def _node_selector(pool: InferencePool, group: NodeGroupSpec) -> dict[str, str]:
    """The pool's engine.nodeSelector and the group's (the group's wins)."""
    return {**pool.spec.engine.node_selector, **group.node_selector}


def _anti_affinity(pool: InferencePool) -> dict[str, Any]:
    """No two stage pods of the pool on one node: each stage owns its node's GPUs and
    memory, as the plan assumes."""
    selector = {
        "matchLabels": contract.selector_labels(pool.name),
        "matchExpressions": [{"key": contract.CHAIN_LABEL, "operator": "Exists"}],
    }
    term = {"labelSelector": selector, "topologyKey": HOSTNAME_TOPOLOGY}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def _stage_labels(
    pool: InferencePool, chain: str, stage: str, selector: bool = False
) -> dict[str, str]:
    base = contract.selector_labels(pool.name) if selector else contract.engine_labels(pool.name)
    return {**base, contract.CHAIN_LABEL: chain, contract.STAGE_LABEL: stage}


def _chain_metadata(pool: InferencePool, name: str, namespace: str, chain: str) -> dict[str, Any]:
    return object_metadata(pool, name, namespace, {contract.CHAIN_LABEL: chain})


def _group(groups: Mapping[str, NodeGroupSpec], name: str, chain: PlannedChain) -> NodeGroupSpec:
    if name not in groups:  # the planner only uses the groups it was given
        raise ConfigError(f"spec.placement: chain {chain.name}", f"unknown node group {name!r}")
    return groups[name]
