"""Placement pools in the operator (docs/placement.md): spec → plan (`pool_plan`, node
discovery from Node objects) → chain manifests (LeaderWorkerSet, or a StatefulSet per stage
and a headless Service; a Deployment for one-node chains) → the gateway's chains → status;
`fairpool plan` and `fairpool render --lws/--nodes`.

Rendered core objects (StatefulSets, Deployments, Services) are checked against Kubernetes'
own schemas (kubernetes-validate, strict). LeaderWorkerSet has no schema there and its CRD
is not vendored here: its pod templates are validated as core/v1 PodTemplates and its own
fields (size, leader/worker templates, restart and startup policies) are checked one by one.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fakes import FakeApi

from fairpool.api.inference_pool import InferencePool
from fairpool.api.manifests import load_manifests
from fairpool.api.placement import NodeDiscovery, quantity_bytes
from fairpool.api.pool_plan import (
    PRODUCT_LABEL,
    groups_from_nodes,
    planner_group,
    pool_plan,
    read_nodes,
    spec_field,
)
from fairpool.api.stored import stored
from fairpool.placement.model import ResponseBounds
from fairpool.placement.planner import PlannedChain, PoolPlan, check_partition
from fairpool.sched.errors import ConfigError
from fairpool_cli.main import main
from fairpool_operator import contract
from fairpool_operator.config import OperatorConfig
from fairpool_operator.dry_run import format_objects, render_files
from fairpool_operator.plan import plan_namespace
from fairpool_operator.reconcile import Reconciler
from fairpool_operator.render_chains import chain_objects

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pipeline.yaml"
IMAGES = {
    "FAIRPOOL_ENGINE_IMAGE": "registry.example/engine:1",
    "FAIRPOOL_ENGINE_SIM_IMAGE": "registry.example/engine-sim:1",
}
STATEFULSETS = OperatorConfig(namespace="serving", engine_image="e:1", leader_worker_set=False)
LWS = OperatorConfig(namespace="serving", engine_image="e:1", leader_worker_set=True)
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"


def example_body(**placement: Any) -> dict[str, Any]:
    """examples/pipeline.yaml's pool (a 70B model on 4 H100 + 4 L40S), fields replaced."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["uid"] = "uid-70b"
    body["spec"]["placement"].update(copy.deepcopy(placement))
    return stored(body)  # what the operator reads: the CRD's defaults filled in


def example_pool(**placement: Any) -> InferencePool:
    return InferencePool.model_validate(example_body(**placement))


def node(
    name: str,
    product: str | None = H100,
    memory_mib: int | None = 81559,
    count: int | None = 1,
    **labels: str,
) -> dict[str, Any]:
    """A Node as the API serves it, with GPU feature discovery's labels."""
    all_labels = {"kubernetes.io/hostname": name, **labels}
    if product is not None:
        all_labels[PRODUCT_LABEL] = product
    if memory_mib is not None:
        all_labels["nvidia.com/gpu.memory"] = str(memory_mib)
    if count is not None:
        all_labels["nvidia.com/gpu.count"] = str(count)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": all_labels}}


#: 1 request/s: one all-H100 chain (its stages after the first share a group: LWS).
LIGHT = {"arrivalRate": 1.0, "meanInputTokens": 2000, "meanOutputTokens": 200}

DISCOVERY = {
    "nodeSelector": {"pool": "llm"},
    "gpuClasses": [
        {"product": H100, "reserve": "4Gi", "tflops": 400, "memoryBandwidthGBps": 2500},
        {"product": L40S, "reserve": "2Gi", "layerSeconds": 0.4},
    ],
}


def discovery_body() -> dict[str, Any]:
    body = example_body(discovery=DISCOVERY)
    del body["spec"]["placement"]["nodeGroups"]
    return body


def cluster_nodes() -> list[dict[str, Any]]:
    return [
        *(node(f"gpu-h{i}", pool="llm") for i in range(4)),
        *(node(f"gpu-l{i}", L40S, 46068, pool="llm") for i in range(4)),
    ]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def k8s_validate(obj: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(obj, "1.37.0", strict=True)  # raises, naming the field


def pod_template_validate(template: dict[str, Any]) -> None:
    """A LeaderWorkerSet's pod template, as a core/v1 PodTemplate."""
    k8s_validate(
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
    )


def engine(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    return container


def flag(container: dict[str, Any], name: str) -> str | None:
    args = container["args"]
    return args[args.index(name) + 1] if name in args else None


def env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container["env"]}


def stage_templates(objects: list[dict[str, Any]], chain: str) -> list[dict[str, Any]]:
    """The pod template of every stage of `chain` in stage order (StatefulSet rendering)."""
    found = [
        obj
        for obj in by_kind(objects, "StatefulSet")
        if obj["metadata"]["labels"][contract.CHAIN_LABEL] == chain
    ]
    found.sort(
        key=lambda obj: int(obj["spec"]["template"]["metadata"]["labels"]["fairpool.io/stage"])
    )
    return [obj["spec"]["template"] for obj in found]


# --- spec → plan ------------------------------------------------------------------------------


def test_the_example_plans_chains_fastest_first_over_both_groups() -> None:
    pool = example_pool()
    plan = pool_plan(pool)
    assert {group for chain in plan.chains for group in chain.groups} == {"h100", "l40s"}
    used = [node for chain in plan.chains for node in chain.nodes]
    assert len(set(used)) == len(used)  # disjoint chains
    assert sorted(used + plan.idle_nodes) == [f"h100-{i}" for i in range(4)] + [
        f"l40s-{i}" for i in range(4)
    ]
    for chain in plan.chains:
        assert chain.groups[0] == "h100"  # the faster nodes lead
        check_partition(chain.partition_string, len(chain.nodes), 80)
    assert plan.bounds.lower <= plan.bounds.upper
    group = pool.spec.placement.node_groups[0]  # type: ignore[union-attr]
    converted = planner_group(group)
    assert converted.memory_bytes == quantity_bytes("80Gi") == 85899345920
    assert converted.usable_bytes == group.usable_bytes  # same rounding both ways


def test_at_one_request_per_second_three_h100s_serve_as_in_the_digest() -> None:
    """Digest §6.5: λ = 1 gives one chain of three H100s, "27,27,26"; the L40S stay idle."""
    plan = pool_plan(example_pool(workload=LIGHT))
    (chain,) = plan.chains
    assert chain.groups == ("h100", "h100", "h100") and chain.partition_string == "27,27,26"
    assert [node for node in plan.idle_nodes if node.startswith("l40s")] == [
        f"l40s-{i}" for i in range(4)
    ]


def test_spec_fields_name_the_pools_field() -> None:
    pool = InferencePool.model_validate(discovery_body())
    assert spec_field("model.layers") == "spec.placement.modelProfile.numLayers"
    assert spec_field("model.maxModelLen") == "spec.model.maxModelLen"
    assert spec_field("workload.targetLoad") == "spec.placement.policy.targetMaxLoad"
    assert spec_field("nodeGroups[h100].reserveBytes") == "spec.placement.nodeGroups[h100].reserve"
    assert spec_field("nodeGroups", pool) == "spec.placement.discovery"
    assert spec_field("spec.placement.discovery") == "spec.placement.discovery"


def test_discovery_groups_nodes_by_gpu_product_and_says_what_it_left_out() -> None:
    nodes = [
        *cluster_nodes(),
        node("other-pool", pool="batch"),  # not selected: no note
        node("cordoned", pool="llm") | {"spec": {"unschedulable": True}},
        node("a10g-0", "NVIDIA-A10G", 23028, pool="llm"),
        node("no-memory", memory_mib=None, pool="llm"),
        node("cpu-0", product=None, pool="llm"),
    ]
    found = groups_from_nodes(NodeDiscovery.model_validate(DISCOVERY), list(reversed(nodes)))
    assert [(g.name, g.count, g.gpu_memory, g.gpus_per_node) for g in found.groups] == [
        ("nvidia-h100-80gb-hbm3", 4, "81559Mi", 1),
        ("nvidia-l40s", 4, "46068Mi", 1),
    ]
    assert found.groups[0].node_selector == {"pool": "llm", PRODUCT_LABEL: H100}
    assert found.groups[0].tflops == 400 and found.groups[1].layer_seconds == 0.4
    assert quantity_bytes(found.groups[0].reserve) == 4 << 30
    notes = "\n".join(found.notes)
    assert "product NVIDIA-A10G has no gpuClasses entry: a10g-0" in notes
    assert "cordoned: cordoned" in notes and "no-memory" in notes and "cpu-0" in notes
    assert "other-pool" not in notes


def test_one_product_with_different_gpu_counts_makes_two_groups() -> None:
    nodes = [node("a", count=1), node("b", count=8), node("c", count=8)]
    found = groups_from_nodes(
        NodeDiscovery.model_validate({"gpuClasses": DISCOVERY["gpuClasses"]}), nodes
    )
    assert [(g.name, g.count, g.gpus_per_node) for g in found.groups] == [
        ("nvidia-h100-80gb-hbm3-x1", 1, 1),
        ("nvidia-h100-80gb-hbm3-x8", 2, 8),
    ]
    assert found.groups[1].node_selector["nvidia.com/gpu.count"] == "8"
    assert quantity_bytes(found.groups[1].gpu_memory) == 8 * 81559 * 2**20


def test_a_discovery_pool_plans_from_the_nodes_and_explains_them() -> None:
    pool = InferencePool.model_validate(discovery_body())
    nodes = [*cluster_nodes(), node("a10g-0", "NVIDIA-A10G", 23028, pool="llm")]
    plan = pool_plan(pool, nodes)
    assert plan.chains[0].nodes[:3] == (
        "nvidia-h100-80gb-hbm3-0",
        "nvidia-h100-80gb-hbm3-1",
        "nvidia-h100-80gb-hbm3-2",
    )
    assert plan.explanation[0].startswith("left out 1 node(s), product NVIDIA-A10G")
    with pytest.raises(ConfigError, match="needs the cluster's Nodes") as error:
        pool_plan(pool, None)
    assert error.value.parameter == "spec.placement.discovery"
    with pytest.raises(ConfigError, match="no usable node"):
        pool_plan(pool, [node("x", pool="elsewhere")])


def test_read_nodes_takes_kubectls_list_or_node_documents(tmp_path: Path) -> None:
    listed = tmp_path / "nodes.yaml"
    listed.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": cluster_nodes()})
    )
    documents = tmp_path / "docs.yaml"
    documents.write_text(yaml.safe_dump_all(cluster_nodes()[:2]))
    assert len(read_nodes(listed)) == 8 and len(read_nodes(documents)) == 2
    with pytest.raises(ConfigError, match="--nodes: no such file"):
        read_nodes(tmp_path / "missing.yaml")


# --- rendering: StatefulSets ------------------------------------------------------------------


def test_without_lws_every_stage_is_a_statefulset_and_stage_0_has_a_dns_name() -> None:
    plan = plan_namespace([example_body()], [], {}, STATEFULSETS)
    (pool,) = plan.pools
    assert pool.problem is None and pool.chains is not None
    names = [(obj["kind"], obj["metadata"]["name"]) for obj in pool.objects]
    expected = [("ConfigMap", "llama-70b-scheduler")]
    for chain in pool.chains.chains:
        stem = f"llama-70b-{chain.name}"
        expected += [("StatefulSet", f"{stem}-s{rank}") for rank in range(len(chain.nodes))]
        expected += [("Service", f"{stem}-head"), ("Service", stem)]
    assert names == expected
    for obj in pool.objects:
        k8s_validate(obj)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-70b"
    head = next(obj for obj in pool.objects if obj["metadata"]["name"].endswith("-head"))
    assert head["spec"]["clusterIP"] == "None" and head["spec"]["publishNotReadyAddresses"]
    master = "llama-70b-chain-0-s0-0.llama-70b-chain-0-head.serving.svc"
    for statefulset in by_kind(pool.objects, "StatefulSet"):
        assert statefulset["spec"]["replicas"] == 1
        assert statefulset["spec"]["serviceName"].endswith("-head")
    for chain in pool.chains.chains:
        templates = stage_templates(pool.objects, chain.name)
        assert len(templates) == len(chain.nodes)
        ranks = [flag(engine(t), "--node-rank") for t in templates]
        assert ranks == [str(rank) for rank in range(len(chain.nodes))]  # unique, 0..n-1
        for rank, template in enumerate(templates):
            container = engine(template)
            assert container["command"] == ["fairpool"] and container["args"][0] == "engine"
            partition = env(container)["VLLM_PP_LAYER_PARTITION"]
            assert partition == chain.partition_string
            assert sum(int(p) for p in partition.split(",")) == 80
            check_partition(partition, len(chain.nodes), 80)
            assert flag(container, "--pipeline-parallel-size") == str(len(chain.nodes))
            assert flag(container, "--nnodes") == str(len(chain.nodes))
            assert flag(container, "--tensor-parallel-size") == "1"
            assert flag(container, "--distributed-executor-backend") == "mp"
            assert int(flag(container, "--max-num-seqs") or 0) >= chain.capacity
            assert flag(container, "--max-model-len") == "8192"
            assert ("--headless" in container["args"]) == (rank > 0)
            assert ("readinessProbe" in container) == (rank == 0)
            assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
            group = chain.groups[rank]
            product = {"h100": H100, "l40s": L40S}[group]
            assert template["spec"]["nodeSelector"] == {PRODUCT_LABEL: product}
            anti = template["spec"]["affinity"]["podAntiAffinity"]
            (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
            assert term["topologyKey"] == "kubernetes.io/hostname"
            assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "llama-70b"
        if chain.name == "chain-0":
            assert {flag(engine(t), "--master-addr") for t in templates} == {master}


def test_the_chain_service_points_at_stage_0_and_the_gateway_runs_jffc_over_the_chains() -> None:
    plan = plan_namespace([example_body()], [], {}, STATEFULSETS)
    (pool,) = plan.pools
    assert pool.chains is not None
    service = next(o for o in pool.objects if o["metadata"]["name"] == "llama-70b-chain-0")
    assert service["spec"]["selector"] == {
        **contract.selector_labels("llama-70b"),
        contract.CHAIN_LABEL: "chain-0",
        contract.STAGE_LABEL: "0",
    }
    assert "clusterIP" not in service["spec"]
    (entry,) = plan.gateway.pools
    assert entry.routing.policy == "jffc"
    assert [(c.name, c.url, c.capacity) for c in entry.chains] == [
        (c.name, f"http://llama-70b-{c.name}.serving.svc:8000", c.capacity)
        for c in pool.chains.chains
    ]
    for worker, chain in zip(entry.chains, pool.chains.chains, strict=True):
        assert worker.service_rate == pytest.approx(1 / chain.service_seconds)
    assert entry.workers.urls == [c.url for c in entry.chains]
    secret = yaml.safe_load(plan.gateway_secret["stringData"]["gateway.yaml"])
    assert secret["pools"][0]["chains"][0]["serviceRate"] > 0


# --- rendering: LeaderWorkerSets --------------------------------------------------------------


def test_with_lws_a_chain_is_one_leaderworkerset_whose_leader_is_stage_0() -> None:
    plan = plan_namespace([example_body(workload=LIGHT)], [], {}, LWS)
    (pool,) = plan.pools
    assert pool.chains is not None
    sets = by_kind(pool.objects, "LeaderWorkerSet")
    assert [obj["metadata"]["name"] for obj in sets] == ["llama-70b-chain-0"]
    assert not by_kind(pool.objects, "StatefulSet")
    check_leader_worker_sets(pool.objects, pool.chains.chains)


def test_with_lws_the_leader_and_the_workers_may_be_of_different_groups() -> None:
    pool = example_pool()
    chain = PlannedChain(
        "chain-0", ("h100-0", "l40s-0", "l40s-1"), ("h100", "l40s", "l40s"), (40, 22, 18), 5, 20.0
    )
    plan = PoolPlan(4, [chain], [], ResponseBounds(20.0, 21.0), ["by hand"])
    objects = chain_objects(pool, plan, pool.spec.placement.node_groups, LWS)  # type: ignore[union-attr]
    assert [obj["kind"] for obj in objects] == ["LeaderWorkerSet", "Service"]
    check_leader_worker_sets(objects, [chain])


def check_leader_worker_sets(objects: list[dict[str, Any]], chains: list[PlannedChain]) -> None:
    sets = by_kind(objects, "LeaderWorkerSet")
    for obj, chain in zip(sets, chains, strict=True):
        assert obj["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
        spec = obj["spec"]
        assert spec["replicas"] == 1
        assert spec["startupPolicy"] == "LeaderCreated"  # the leader is ready only later
        template = spec["leaderWorkerTemplate"]
        assert template["size"] == len(chain.nodes)
        assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
        assert set(template) == {"size", "restartPolicy", "leaderTemplate", "workerTemplate"}
        leader, workers = template["leaderTemplate"], template["workerTemplate"]
        for pod in (leader, workers):
            pod_template_validate(pod)
            container = engine(pod)
            assert env(container)["VLLM_PP_LAYER_PARTITION"] == chain.partition_string
            assert flag(container, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
            assert flag(container, "--pipeline-parallel-size") == str(len(chain.nodes))
        assert flag(engine(leader), "--node-rank") == "0"
        assert flag(engine(workers), "--node-rank") == "$(LWS_WORKER_INDEX)"
        assert "--headless" in engine(workers)["args"]
        assert "--headless" not in engine(leader)["args"]
        products = {"h100": H100, "l40s": L40S}
        assert leader["spec"]["nodeSelector"][PRODUCT_LABEL] == products[chain.groups[0]]
        assert workers["spec"]["nodeSelector"][PRODUCT_LABEL] == products[chain.groups[1]]
        assert leader["metadata"]["labels"][contract.STAGE_LABEL] == "0"
        assert workers["metadata"]["labels"][contract.STAGE_LABEL] == "workers"
    for obj in objects:
        if obj["kind"] != "LeaderWorkerSet":
            k8s_validate(obj)
    assert not [o for o in objects if o["metadata"]["name"].endswith("-head")]


def mixed_plan() -> tuple[InferencePool, PoolPlan]:
    """A chain whose stages after the first are of two groups (no one worker template)."""
    body = example_body(
        nodeGroups=[
            {"name": "a", "count": 1, "gpuMemory": "80Gi", "layerSeconds": 0.1},
            {"name": "b", "count": 1, "gpuMemory": "48Gi", "layerSeconds": 0.2},
            {"name": "c", "count": 1, "gpuMemory": "48Gi", "layerSeconds": 0.3},
        ]
    )
    chain = PlannedChain("chain-0", ("a-0", "b-0", "c-0"), ("a", "b", "c"), (40, 25, 15), 3, 9.0)
    plan = PoolPlan(4, [chain], [], ResponseBounds(9.0, 9.5), ["by hand"])
    return InferencePool.model_validate(body), plan


def test_a_chain_mixing_groups_after_stage_0_falls_back_to_statefulsets_even_with_lws() -> None:
    (planned,) = plan_namespace([example_body()], [], {}, LWS).pools  # h100 ×4, l40s ×3
    assert planned.chains is not None and len(set(planned.chains.chains[0].groups[1:])) == 2
    assert not by_kind(planned.objects, "LeaderWorkerSet")
    assert len(by_kind(planned.objects, "StatefulSet")) == len(planned.chains.chains[0].nodes)
    pool, plan = mixed_plan()
    groups = pool.spec.placement.node_groups  # type: ignore[union-attr]
    objects = chain_objects(pool, plan, groups, LWS)
    assert [obj["kind"] for obj in objects] == [
        "StatefulSet",
        "StatefulSet",
        "StatefulSet",
        "Service",
        "Service",
    ]
    templates = stage_templates(objects, "chain-0")
    assert [flag(engine(t), "--node-rank") for t in templates] == ["0", "1", "2"]
    assert [env(engine(t))["VLLM_PP_LAYER_PARTITION"] for t in templates] == ["40,25,15"] * 3
    for obj in objects:
        k8s_validate(obj)


def test_a_model_that_fits_one_node_gets_plain_one_replica_engines() -> None:
    body = example_body(
        modelProfile={
            "numLayers": 32,
            "layerWeightBytes": 436207616,  # an 8B model in bf16
            "kvBytesPerTokenPerLayer": 4096,
            "embeddingBytes": 1050673152,
            "lmHeadBytes": 1050673152,
            "flopsPerTokenPerLayer": 436000000,
        },
        workload={"arrivalRate": 2.0},
    )
    plan = plan_namespace([body], [], {}, LWS)
    (pool,) = plan.pools
    assert pool.chains is not None and pool.chains.chains
    assert all(len(chain.nodes) == 1 for chain in pool.chains.chains)
    deployments = by_kind(pool.objects, "Deployment")
    assert len(deployments) == len(pool.chains.chains)
    assert not by_kind(pool.objects, "StatefulSet") + by_kind(pool.objects, "LeaderWorkerSet")
    for deployment in deployments:
        k8s_validate(deployment)
        assert deployment["spec"]["replicas"] == 1
        container = engine(deployment["spec"]["template"])
        assert "--pipeline-parallel-size" not in container["args"]
        assert "VLLM_PP_LAYER_PARTITION" not in env(container)
        assert "--max-num-seqs" in container["args"]
        assert deployment["spec"]["template"]["spec"]["nodeSelector"]


def test_a_simulated_placement_pool_runs_one_engine_sim_per_chain_without_gpus() -> None:
    body = example_body()
    body["spec"]["engine"] = {"kind": "sim"}
    del body["spec"]["model"]["source"]
    (pool,) = plan_namespace([body], [], {}, LWS).pools
    assert pool.chains is not None
    deployments = by_kind(pool.objects, "Deployment")
    assert len(deployments) == len(pool.chains.chains)
    for deployment in deployments:
        k8s_validate(deployment)
        container = engine(deployment["spec"]["template"])
        assert container["args"][0] == "engine-sim" and "resources" not in container


def test_names_of_a_long_pool_stay_valid_and_distinct() -> None:
    name = "a" * 56
    names = {
        contract.chain_name(name, "chain-10"),
        contract.stage_name(name, "chain-10", 7),
        contract.head_name(name, "chain-10"),
        contract.stage_name(name, "chain-10", 6),
    }
    assert len(names) == 4
    assert all(len(n) <= contract.CHAIN_NAME_LIMIT and n[-1].isalnum() for n in names)
    assert contract.stage_name(name, "chain-10", 7) == contract.stage_name(name, "chain-10", 7)


# --- plain pools, determinism -----------------------------------------------------------------


@pytest.mark.parametrize("example", ["gpu", "local", "tenants-slo"])
def test_pools_without_placement_render_byte_for_byte_as_before(example: str) -> None:
    """tests/golden/render-*.yaml was rendered before placement pools existed; since then
    only the engines' startup and liveness probes, the bounds of /tmp and /dev/shm, the
    model sources as URIs (gpu.yaml's now fetched from the Hub into a cache claim), and the
    scheduler configuration's fair-order tree (the pool's bands; the tenants' groups and
    bands, tenants-slo.yaml's two organisations) changed (read the diff of a golden file
    before accepting it)."""
    rendering = render_files([ROOT / "examples" / f"{example}.yaml"], "serving", IMAGES)
    objects = [obj for obj in rendering.objects if obj["kind"] != "Secret"]
    golden = ROOT / "tests" / "golden" / f"render-{example}.yaml"
    assert format_objects(objects, "yaml") == golden.read_text()


def test_rendering_a_placement_pool_twice_gives_the_same_objects() -> None:
    for config in (STATEFULSETS, LWS):
        first = plan_namespace([example_body()], [], {}, config).objects
        second = plan_namespace([example_body()], [], {}, config).objects
        assert first == second
        assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


# --- reconcile and status ---------------------------------------------------------------------


def crd_status_schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "inferencepools.fairpool.io.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["status"])


def strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema:
            schema = {**schema, "additionalProperties": False}
        return {key: strict(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def reconciled(config: OperatorConfig, body: dict[str, Any]) -> tuple[FakeApi, Reconciler]:
    api = FakeApi()
    api.put(body)
    reconciler = Reconciler(api, config, lambda: "2026-11-21T10:00:00Z")
    reconciler.reconcile()
    return api, reconciler


def test_reconcile_creates_the_chains_reports_the_plan_and_then_writes_nothing() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    api, reconciler = reconciled(LWS, example_body(workload=LIGHT))
    created = {(kind, name) for verb, kind, name in api.take_writes() if verb == "create"}
    assert ("LeaderWorkerSet", "llama-70b-chain-0") in created
    status = api.objects["InferencePool", "llama-70b"]["status"]
    placement = status["placement"]
    expected = pool_plan(example_pool(workload=LIGHT))
    assert placement["capacityParam"] == expected.capacity_param
    assert [chain["layerPartition"] for chain in placement["chains"]] == [
        chain.partition_string for chain in expected.chains
    ]
    assert placement["chains"][0]["groups"] == list(expected.chains[0].groups)
    assert placement["chains"][0]["nodes"] == list(expected.chains[0].nodes)
    assert placement["chains"][0]["capacity"] == expected.chains[0].capacity
    assert placement["chains"][0]["serviceSeconds"] == round(expected.chains[0].service_seconds, 4)
    assert placement["idleNodes"] == expected.idle_nodes
    assert (
        placement["predictedResponseSeconds"]["lower"]
        <= placement["predictedResponseSeconds"]["upper"]
    )
    assert any("vLLM differs from the paper" in line for line in placement["explanation"])
    assert (status["replicas"], status["readyReplicas"]) == (0, 0)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["message"]) == (
        "False",
        f"0/{len(expected.chains)} chains ready",
    )
    jsonschema.validate(status, strict(crd_status_schema()))

    assert reconciler.reconcile() == []  # idempotent: nothing differs
    assert api.take_writes() == []


def test_a_ready_stage_0_makes_its_chain_ready_and_an_endpoint() -> None:
    api, reconciler = reconciled(STATEFULSETS, example_body())
    labels = {**contract.engine_labels("llama-70b"), contract.CHAIN_LABEL: "chain-0"}
    ready = {"type": "Ready", "status": "True"}
    for stage in ("0", "1"):
        api.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"llama-70b-chain-0-s{stage}-0",
                    "labels": {**labels, contract.STAGE_LABEL: stage},
                },
                "status": {"phase": "Running", "podIP": f"10.0.0.{stage}", "conditions": [ready]},
            }
        )
    api.take_writes()
    assert [w.verb for w in reconciler.refresh_pool_status("llama-70b")] == ["status"]
    status = api.objects["InferencePool", "llama-70b"]["status"]
    assert (status["replicas"], status["readyReplicas"]) == (1, 1)
    assert status["endpoints"] == [
        {"pod": "llama-70b-chain-0-s0-0", "address": "http://10.0.0.0:8000", "ready": True}
    ]
    assert "placement" in status  # a refresh keeps the plan


def test_a_replan_deletes_the_stages_and_chains_it_no_longer_has() -> None:
    api, reconciler = reconciled(STATEFULSETS, example_body())  # one chain of 7 stages
    before = {name for kind, name in api.objects if kind == "StatefulSet"}
    api.take_writes()
    light = example_body(workload=LIGHT)["spec"]["placement"]
    api.edit("InferencePool", "llama-70b", {"placement": light})
    writes = {(w.verb, w.kind, w.name) for w in reconciler.reconcile()}
    after = {name for kind, name in api.objects if kind == "StatefulSet"}
    (chain,) = pool_plan(example_pool(workload=LIGHT)).chains
    assert after == {f"llama-70b-chain-0-s{rank}" for rank in range(len(chain.nodes))}
    assert {("delete", "StatefulSet", name) for name in before - after} <= writes
    assert before - after  # fewer stages now
    assert ("apply", "StatefulSet", "llama-70b-chain-0-s0") in writes  # a new partition
    gateway = yaml.safe_load(
        base64.b64decode(api.objects["Secret", "fairpool-gateway-config"]["data"]["gateway.yaml"])
    )
    (entry,) = gateway["pools"][0]["chains"]
    assert (entry["name"], entry["capacity"]) == ("chain-0", chain.capacity)
    status = api.objects["InferencePool", "llama-70b"]["status"]
    assert status["placement"]["chains"][0]["layerPartition"] == chain.partition_string


def test_a_pool_gaining_placement_loses_its_deployment_and_headless_service() -> None:
    plain = example_body()
    del plain["spec"]["placement"]
    plain["spec"]["replicas"] = 1
    api, reconciler = reconciled(STATEFULSETS, plain)
    assert ("Deployment", "llama-70b-engine") in api.objects
    api.edit("InferencePool", "llama-70b", {"placement": example_body()["spec"]["placement"]})
    writes = {(w.verb, w.kind, w.name) for w in reconciler.reconcile()}
    assert {
        ("delete", "Deployment", "llama-70b-engine"),
        ("delete", "Service", "llama-70b-engine"),
    } <= writes
    assert ("Deployment", "llama-70b-engine") not in api.objects


def test_an_infeasible_placement_is_a_condition_naming_the_field_not_a_crash() -> None:
    small = example_body(
        nodeGroups=[{"name": "t4", "count": 2, "gpuMemory": "16Gi", "layerSeconds": 1.0}]
    )
    (pool,) = plan_namespace([small], [], {}, LWS).pools
    assert pool.objects == [] and pool.problem is not None
    assert pool.problem.reason == "PlacementInfeasible"
    assert pool.problem.message.startswith("spec.placement.nodeGroups: the nodes hold at most")
    api, reconciler = reconciled(LWS, small)
    status = api.objects["InferencePool", "llama-70b"]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "PlacementInfeasible")
    assert "placement" not in status
    assert reconciler.refresh_pool_status("llama-70b") == []  # the refresh keeps the reason


def test_discovery_in_the_operator_lists_nodes_and_says_when_it_cannot() -> None:
    api = FakeApi()
    api.put(discovery_body())
    api.node_list = cluster_nodes()
    Reconciler(api, STATEFULSETS).reconcile()
    status = api.objects["InferencePool", "llama-70b"]["status"]
    assert status["placement"]["chains"][0]["groups"][0] == "nvidia-h100-80gb-hbm3"
    statefulset = api.objects["StatefulSet", "llama-70b-chain-0-s0"]
    selector = statefulset["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == {"pool": "llm", PRODUCT_LABEL: H100}

    from fairpool_operator.api import ApiError

    def forbidden() -> list[dict[str, Any]]:
        raise ApiError(403, "nodes is forbidden")

    api = FakeApi()
    api.put(discovery_body())
    api.nodes = forbidden  # type: ignore[method-assign]
    Reconciler(api, STATEFULSETS).reconcile()
    status = api.objects["InferencePool", "llama-70b"]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["message"].startswith("spec.placement.discovery: needs the cluster's Nodes")


def test_lws_is_used_when_the_api_serves_it_or_when_set() -> None:
    from fairpool_operator.handlers import with_leader_worker_set

    api = FakeApi()
    auto = OperatorConfig(namespace="serving")
    assert with_leader_worker_set(auto, api).leader_worker_set is False
    api.served_kinds.add("LeaderWorkerSet")
    assert with_leader_worker_set(auto, api).leader_worker_set is True
    assert with_leader_worker_set(STATEFULSETS, api).leader_worker_set is False
    environ = {contract.LEADER_WORKER_SET_ENV: "true"}
    assert OperatorConfig.from_environment(environ).leader_worker_set is True
    assert OperatorConfig.from_environment({}).leader_worker_set is None
    with pytest.raises(ConfigError, match="FAIRPOOL_LEADER_WORKER_SET"):
        OperatorConfig.from_environment({contract.LEADER_WORKER_SET_ENV: "maybe"})


# --- fairpool plan / render -------------------------------------------------------------------


def test_fairpool_plan_prints_the_chains_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    expected = pool_plan(example_pool())
    assert main(["plan", "-f", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    for text in (
        f"InferencePool llama-70b: {len(expected.chains)} chain(s)",
        "h100-0 → h100-1 →",
        expected.chains[0].partition_string,
        f"capacity parameter c = {expected.capacity_param}",
        "predicted mean response time:",
        f"idle nodes: {', '.join(expected.idle_nodes)}",
        "vLLM differs from the paper",
    ):
        assert text in out, text
    assert main(["plan", "-f", str(EXAMPLE), "--json"]) == 0
    (document,) = json.loads(capsys.readouterr().out)
    assert document == {"pool": "llama-70b", **json.loads(json.dumps(expected.to_dict()))}
    assert set(document) >= {"capacityParam", "predictedResponseSeconds", "idleNodes"}


def test_fairpool_plan_with_nodes_discovers_groups(tmp_path: Path, capsys) -> None:
    pool_file, nodes_file = tmp_path / "pool.yaml", tmp_path / "nodes.yaml"
    pool_file.write_text(yaml.safe_dump(discovery_body()))
    nodes_file.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": cluster_nodes()})
    )
    assert main(["plan", "-f", str(pool_file), "--nodes", str(nodes_file), "--json"]) == 0
    (document,) = json.loads(capsys.readouterr().out)
    assert document["chains"][0]["groups"][0] == "nvidia-h100-80gb-hbm3"
    assert main(["plan", "-f", str(pool_file)]) == 2
    err = capsys.readouterr().err
    assert "InferencePool llama-70b: spec.placement.discovery: needs the cluster's Nodes" in err


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"workload": {"arrivalRate": -1}}, "spec.placement.workload.arrivalRate"),
        (
            {"nodeGroups": [{"name": "x", "count": 1, "gpuMemory": "lots"}]},
            "spec.placement.nodeGroups.0.gpuMemory",
        ),
        (
            {"nodeGroups": [{"name": "t4", "count": 1, "gpuMemory": "16Gi", "layerSeconds": 1}]},
            "InferencePool llama-70b: spec.placement.nodeGroups: the nodes hold at most",
        ),
    ],
)
def test_fairpool_plan_errors_name_the_field_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], field: str
) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(example_body(**change)))
    assert main(["plan", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert field in err
    assert err.startswith("error: ") and err.count("\n") == 1  # one line


def test_fairpool_plan_needs_a_placement_pool_and_existing_files(tmp_path: Path, capsys) -> None:
    assert main(["plan", "-f", str(tmp_path / "missing.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["plan", "-f", str(ROOT / "examples" / "gpu.yaml")]) == 2
    assert "no InferencePool with spec.placement" in capsys.readouterr().err
    assert main(["plan", "-f", str(EXAMPLE), "--nodes", str(tmp_path / "none.yaml")]) == 2
    assert "--nodes: no such file" in capsys.readouterr().err


def test_fairpool_render_lws_and_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(EXAMPLE), "--lws"]) == 0
    kinds = [obj["kind"] for obj in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds.count("LeaderWorkerSet") == 0  # the example's chain mixes groups: StatefulSets
    light = tmp_path / "light.yaml"
    light.write_text(yaml.safe_dump(example_body(workload=LIGHT)))
    assert main(["render", "-f", str(light), "--lws"]) == 0
    kinds = [obj["kind"] for obj in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds.count("LeaderWorkerSet") == 1 and "StatefulSet" not in kinds
    assert main(["render", "-f", str(light)]) == 0  # no cluster to ask: StatefulSets
    kinds = [obj["kind"] for obj in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds.count("StatefulSet") == 3 and "LeaderWorkerSet" not in kinds
    pool_file, nodes_file = tmp_path / "pool.yaml", tmp_path / "nodes.yaml"
    pool_file.write_text(yaml.safe_dump(discovery_body()))
    nodes_file.write_text(yaml.safe_dump_all(cluster_nodes()))
    assert main(["render", "-f", str(pool_file), "--nodes", str(nodes_file)]) == 0
    capsys.readouterr()
    assert main(["render", "-f", str(pool_file)]) == 1  # the operator's condition, as a warning
    assert "spec.placement.discovery" in capsys.readouterr().err


def test_the_example_loads_as_a_placement_pool_routed_by_jffc() -> None:
    (pool,) = load_manifests(EXAMPLE).pools
    assert pool.spec.placement is not None and pool.spec.routing.policy == "jffc"
    assert [g.name for g in pool.spec.placement.node_groups] == ["h100", "l40s"]


def test_a_node_change_replans_a_discovering_pool_and_heartbeats_do_not() -> None:
    kopf = pytest.importorskip("kopf")
    from fairpool_operator import handlers
    from fairpool_operator.runtime import Operator

    api = FakeApi()
    api.node_list = [node(f"h{i}", pool="llm") for i in range(4)]
    api.put(discovery_body())
    operator = Operator(Reconciler(api, STATEFULSETS))
    reconciles: list[int] = []
    full = operator.reconcile

    def counted(max_age: float | None = None) -> Any:
        reconciles.append(1)
        return full(max_age)

    operator.reconcile = counted  # type: ignore[method-assign]
    memo = kopf.Memo(operator=operator)
    operator.reconcile()
    assert operator.reconciler.uses_nodes
    reconciles.clear()
    for listed in api.node_list:  # the watch's first listing: nothing changed yet
        handlers.node_changed(type=None, body=listed, memo=memo)
    beat = copy.deepcopy(api.node_list[0])
    beat["status"] = {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "x"}]}
    handlers.node_changed(type="MODIFIED", body=beat, memo=memo)
    assert reconciles == []  # a heartbeat: placement reads nothing of it
    relabelled = copy.deepcopy(beat)
    relabelled["metadata"]["labels"]["pool"] = "elsewhere"
    api.node_list[0] = relabelled
    handlers.node_changed(type="MODIFIED", body=relabelled, memo=memo)
    assert reconciles == [1]
    handlers.node_changed(type="DELETED", body=relabelled, memo=memo)
    assert reconciles == [1, 1]

    plain = FakeApi()
    plain.put(example_body())
    quiet = Operator(Reconciler(plain, STATEFULSETS))
    quiet.reconcile()
    assert not quiet.reconciler.uses_nodes
    handlers.node_changed(type="MODIFIED", body=relabelled, memo=kopf.Memo(operator=quiet))
