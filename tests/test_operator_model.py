"""A pool's model source in the operator: what an engine pod gets for each kind of source
(the fetch step, the cache volume or claim, the credentials), and how a missing Secret or
a failed fetch shows in the pool's status."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fakes import FakeApi

from fairpool.api.inference_pool import InferencePool
from fairpool.api.model_source import parse_model_uri
from fairpool.api.stored import stored
from fairpool_engine.fetch import model_directory
from fairpool_operator import contract
from fairpool_operator.config import OperatorConfig
from fairpool_operator.plan import plan_namespace
from fairpool_operator.reconcile import Reconciler
from fairpool_operator.render import engine_deployment, pool_objects

pytestmark = pytest.mark.unit

CONFIG = OperatorConfig(namespace="serving", engine_sim_image="sim:1", engine_image="vllm:1")
ROOT = Path(__file__).resolve().parent.parent
GATED = {"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "secretRef": {"name": "hf-token"}}


def pool_body(**model: Any) -> dict[str, Any]:
    return stored(
        {
            "apiVersion": "fairpool.io/v1alpha1",
            "kind": "InferencePool",
            "metadata": {"name": "llama", "uid": "uid-llama", "generation": 2},
            "spec": {"model": {"name": "llama-8b", **model}, "replicas": 2},
        }
    )


def pool(**model: Any) -> InferencePool:
    return InferencePool.model_validate(pool_body(**model))


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def k8s_validate(obj: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_a_gated_hub_model_is_fetched_with_its_token_by_an_init_step_into_a_bounded_cache():
    deployment = engine_deployment(pool(**GATED), CONFIG)
    spec = pod_spec(deployment)
    (fetcher,) = spec["initContainers"]
    engine = spec["containers"][0]
    uri = parse_model_uri(GATED["source"])
    loaded = engine["args"][engine["args"].index("--model") + 1]
    assert loaded == str(model_directory(Path(contract.MODEL_CACHE_DIR), uri))
    assert fetcher["args"][:4] == ["fetch-model", str(uri), "--cache", contract.MODEL_CACHE_DIR]
    assert fetcher["image"] == engine["image"] == "vllm:1"
    volumes = by_name(spec["volumes"])
    assert volumes["model-cache"]["emptyDir"] == {"sizeLimit": "100Gi"}
    assert volumes["model-credentials"]["secret"]["secretName"] == "hf-token"
    # the token reaches the fetch step only; the engine reads the cache, read-only, offline
    assert "model-credentials" in by_name(fetcher["volumeMounts"])
    assert "model-credentials" not in by_name(engine["volumeMounts"])
    assert by_name(engine["volumeMounts"])["model-cache"]["readOnly"] is True
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in engine["env"]
    assert fetcher["securityContext"] == engine["securityContext"]
    assert fetcher["terminationMessagePolicy"] == "FallbackToLogsOnError"
    k8s_validate(deployment)


def test_a_cache_claim_is_made_once_per_pool_and_shared_by_its_pods():
    model = {**GATED, "cache": {"volume": "pvc", "size": "40Gi", "storageClassName": "nfs"}}
    claim, *_, deployment, _budget = pool_objects(pool(**model), [], CONFIG)
    assert claim["kind"] == "PersistentVolumeClaim"
    assert claim["metadata"]["name"] == contract.model_cache_name("llama")
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "40Gi"}},
        "storageClassName": "nfs",
    }
    cache = by_name(pod_spec(deployment)["volumes"])["model-cache"]
    assert cache["persistentVolumeClaim"] == {"claimName": "llama-model-cache"}
    k8s_validate(claim)
    k8s_validate(deployment)
    # sources loaded where they are, and simulated engines, need no cache
    for quiet in (pool(source="pvc://weights/llama"), pool(**GATED).model_copy()):
        if quiet.spec.model.uri and quiet.spec.model.uri.fetched:
            quiet.spec.engine.kind = "sim"
        kinds = [obj["kind"] for obj in pool_objects(quiet, [], CONFIG)]
        assert "PersistentVolumeClaim" not in kinds
        assert "initContainers" not in pod_spec(engine_deployment(quiet, CONFIG))


def test_s3_and_gs_sources_get_the_same_fetch_step_with_their_secret():
    for source in ("s3://models/llama", "gs://models/llama"):
        spec = pod_spec(engine_deployment(pool(source=source, secretRef={"name": "s"}), CONFIG))
        (fetcher,) = spec["initContainers"]
        assert fetcher["args"][1] == source
        assert "--credentials" in fetcher["args"]
    public = pod_spec(engine_deployment(pool(source="hf://org/open"), CONFIG))
    assert "--credentials" not in public["initContainers"][0]["args"]
    assert "model-credentials" not in by_name(public["volumes"])


def test_a_local_path_is_refused_in_a_cluster_naming_the_way_out():
    (planned,) = plan_namespace([pool_body(source="/models/llama")], [], {}, CONFIG).pools
    assert planned.pool is None and planned.objects == []
    assert planned.problem is not None and planned.problem.reason == "InvalidSpec"
    assert "pvc://claim/path" in planned.problem.message


# --- status -------------------------------------------------------------------------------------


def secret(name: str, **keys: str) -> dict[str, Any]:
    data = {key: base64.b64encode(value.encode()).decode() for key, value in keys.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data}


def fetch_pod(name: str, **state: Any) -> dict[str, Any]:
    """An engine pod of the pool whose fetch step is in `state` (running, terminated), and
    `last` its previous termination."""
    last = state.pop("last", None)
    status: dict[str, Any] = {"name": contract.FETCH_CONTAINER, "state": state}
    if last is not None:
        status["lastState"] = {"terminated": last}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {contract.POOL_LABEL: "llama"}},
        "status": {"phase": "Pending", "initContainerStatuses": [status]},
    }


def conditions(api: FakeApi) -> dict[str, dict[str, Any]]:
    body = api.objects["InferencePool", "llama"]
    return {item["type"]: item for item in body["status"]["conditions"]}


def test_a_missing_or_incomplete_secret_is_a_condition_naming_it_and_clears_when_fixed():
    api = FakeApi()
    api.put(pool_body(**GATED))
    reconciler = Reconciler(api, CONFIG, clock=lambda: "2026-11-28T00:00:00Z")
    reconciler.reconcile()
    model, degraded = conditions(api)["ModelReady"], conditions(api)["Degraded"]
    assert (model["status"], model["reason"]) == ("False", "SecretNotFound")
    assert "'hf-token' not found" in model["message"] and degraded["reason"] == "SecretNotFound"
    assert ("Deployment", "llama-engine") in api.objects  # pods wait for the Secret

    api.put(secret("hf-token", token="hf_x"))
    reconciler.refresh_pool_status("llama")  # a pod event: no full reconcile needed
    model = conditions(api)["ModelReady"]
    assert model["reason"] == "SecretKeyMissing" and "no key HF_TOKEN" in model["message"]

    api.put(secret("hf-token", HF_TOKEN="hf_x"))
    reconciler.reconcile()
    assert conditions(api)["ModelReady"]["reason"] == "Pending"
    assert conditions(api)["Degraded"]["status"] == "False"


@pytest.mark.parametrize(
    ("pods", "status", "reason", "says"),
    [
        ([], "False", "Pending", "no pod has fetched"),
        ([fetch_pod("llama-a", running={})], "False", "Fetching", "pod llama-a is fetching"),
        (
            [fetch_pod("llama-a", terminated={"exitCode": 0, "reason": "Completed"})],
            "True",
            "Fetched",
            "in the emptyDir cache of pod llama-a",
        ),
        (
            [
                fetch_pod(
                    "llama-b",
                    waiting={"reason": "CrashLoopBackOff"},
                    last={"exitCode": 1, "message": "GatedModel: m is gated: accept it"},
                ),
                fetch_pod("llama-a", running={}),
            ],
            "False",
            "GatedModel",
            "pod llama-b: m is gated: accept it",
        ),
        (
            [fetch_pod("llama-a", terminated={"exitCode": 137, "message": "a\nOOMKilled\n"})],
            "False",
            "FetchFailed",
            "pod llama-a: OOMKilled",
        ),
    ],
)
def test_the_fetch_step_of_the_pods_is_the_model_condition(pods, status, reason, says):
    api = FakeApi()
    api.put(pool_body(**GATED))
    api.put(secret("hf-token", HF_TOKEN="hf_x"))
    for pod in pods:
        api.put(pod)
    Reconciler(api, CONFIG, clock=lambda: "2026-11-28T00:00:00Z").reconcile()
    model = conditions(api)["ModelReady"]
    assert (model["status"], model["reason"]) == (status, reason)
    assert says in model["message"]
    degraded = conditions(api)["Degraded"]
    assert (degraded["status"] == "True") == (status == "False" and reason not in PROGRESS)
    if degraded["status"] == "True":
        assert degraded["reason"] == reason


PROGRESS = ("Pending", "Fetching")


def test_a_claim_is_created_once_and_never_rewritten():
    api = FakeApi()
    api.put(pool_body(**GATED, cache={"volume": "pvc", "size": "40Gi"}))
    api.put(secret("hf-token", HF_TOKEN="hf_x"))
    reconciler = Reconciler(api, CONFIG, clock=lambda: "2026-11-28T00:00:00Z")
    reconciler.reconcile()
    assert ("create", "PersistentVolumeClaim", "llama-model-cache") in api.take_writes()
    api.edit(
        "InferencePool",
        "llama",
        {"model": {"name": "llama-8b", **GATED, "cache": {"volume": "pvc", "size": "80Gi"}}},
    )
    reconciler.reconcile()
    claim = api.objects["PersistentVolumeClaim", "llama-model-cache"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "40Gi"
    assert not [w for w in api.take_writes() if w[1] == "PersistentVolumeClaim"]


def test_pools_without_weights_to_load_have_no_model_condition():
    api = FakeApi()
    sim = pool_body()
    sim["spec"]["engine"]["kind"] = "sim"
    api.put(sim)
    Reconciler(api, CONFIG, clock=lambda: "2026-11-28T00:00:00Z").reconcile()
    assert "ModelReady" not in conditions(api)
    api.edit(
        "InferencePool",
        "llama",
        {
            "engine": {"kind": "vllm"},
            "model": {"name": "llama-8b", "source": "pvc://weights/llama"},
        },
    )
    Reconciler(api, CONFIG, clock=lambda: "2026-11-28T00:00:00Z").reconcile()
    assert conditions(api)["ModelReady"]["reason"] == "OnVolume"


def test_a_pipeline_pool_shares_one_cache_claim_across_its_stages():
    body = yaml.safe_load((ROOT / "examples" / "pipeline.yaml").read_text())
    body["spec"]["model"] |= {**GATED, "cache": {"volume": "pvc", "size": "300Gi"}}
    (planned,) = plan_namespace([stored(body)], [], {}, CONFIG).pools
    claims = [obj for obj in planned.objects if obj["kind"] == "PersistentVolumeClaim"]
    assert [claim["metadata"]["name"] for claim in claims] == ["llama-70b-model-cache"]
    workloads = [obj for obj in planned.objects if obj["kind"] == "StatefulSet"]
    assert workloads
    for workload in workloads:
        spec = pod_spec(workload)
        assert spec["initContainers"][0]["name"] == contract.FETCH_CONTAINER
        cache = by_name(spec["volumes"])["model-cache"]["persistentVolumeClaim"]
        assert cache["claimName"] == "llama-70b-model-cache"
