"""What restarts engines and what scales them: an operator upgrade restarts none (the engine
image is kept per pool until what shapes its pods changes), and the pool has a scale
subresource that `kubectl scale`, HorizontalPodAutoscalers and KEDA drive."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from operator_fakes import FakeApi
from pydantic import ValidationError
from test_operator_reconcile import pool

from fairpool.api.crds import RESOURCES, crd
from fairpool.api.inference_pool import InferencePool
from fairpool.api.stored import stored
from fairpool_operator.config import OperatorConfig
from fairpool_operator.reconcile import Reconciler
from fairpool_operator.render import DRAIN_SLACK, engine_deployment

pytestmark = pytest.mark.unit


def operator(api: FakeApi, version: str) -> Reconciler:
    """The operator of one release: its default engine images carry `version`."""
    config = OperatorConfig(
        namespace="serving", engine_sim_image=f"sim:{version}", engine_image=f"vllm:{version}"
    )
    return Reconciler(api, config, clock=lambda: "2026-11-28T00:00:00Z")


def image(api: FakeApi) -> str:
    deployment = api.objects["Deployment", "chat-engine"]
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def deployment_writes(api: FakeApi) -> list[tuple[str, str, str]]:
    return [write for write in api.take_writes() if write[1] == "Deployment"]


def test_an_operator_upgrade_restarts_no_engine_until_the_pods_change_anyway():
    api = FakeApi()
    api.put(pool("chat", replicas=2))
    operator(api, "1").reconcile()
    assert image(api) == "sim:1"
    assert api.objects["InferencePool", "chat"]["status"]["engineImage"] == "sim:1"
    api.take_writes()

    upgraded = operator(api, "2")
    upgraded.reconcile()
    assert deployment_writes(api) == [] and image(api) == "sim:1"

    api.edit("InferencePool", "chat", {"replicas": 5})  # scaling keeps the engines' image
    upgraded.reconcile()
    assert deployment_writes(api) == [("apply", "Deployment", "chat-engine")]
    assert image(api) == "sim:1"

    engine = {"kind": "sim", "resources": {"cpu": "1"}}  # the pods change: the new image
    api.edit("InferencePool", "chat", {"engine": engine})
    upgraded.reconcile()
    assert image(api) == "sim:2"
    assert api.objects["InferencePool", "chat"]["status"]["engineImage"] == "sim:2"


def test_a_pool_that_names_its_image_gets_that_one_whatever_the_operator():
    api = FakeApi()
    api.put(pool("chat", engine={"kind": "sim", "image": "mine:7"}))
    operator(api, "1").reconcile()
    operator(api, "2").reconcile()
    assert image(api) == "mine:7"
    assert "engineImage" not in api.objects["InferencePool", "chat"]["status"]


def test_the_scale_subresource_points_at_replicas_and_a_selector_of_the_pods():
    (pools,) = [crd(resource) for resource in RESOURCES if resource.plural == "inferencepools"]
    (version,) = pools["spec"]["versions"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["selector"]["type"] == "string"


@given(st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True))
def test_the_status_selector_selects_exactly_the_pools_pods(name):
    api = FakeApi()
    api.put(pool(name))
    api.put(pool(f"{name}-other"))
    operator(api, "1").reconcile()
    for pool_name in (name, f"{name}-other"):
        selector = api.objects["InferencePool", pool_name]["status"]["selector"]
        wanted = dict(part.split("=", 1) for part in selector.split(","))
        for other in (name, f"{name}-other"):
            labels = pod_labels(api, other)
            assert (wanted.items() <= labels.items()) == (other == pool_name)


def pod_labels(api: FakeApi, pool_name: str) -> dict[str, Any]:
    deployment = api.objects["Deployment", f"{pool_name}-engine"]
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def vllm_pool(**engine: Any) -> InferencePool:
    body = pool("llama", engine={"kind": "vllm", **engine})
    body["spec"]["model"]["source"] = "hf://org/llama"
    return InferencePool.model_validate(stored(body))


def test_engines_drain_before_they_stop_and_rollouts_wait_for_a_model_to_load():
    config = OperatorConfig(namespace="serving", engine_image="vllm:1")
    deployment = engine_deployment(vllm_pool(), config)
    spec = deployment["spec"]
    engine = spec["template"]["spec"]["containers"][0]
    assert engine["lifecycle"]["preStop"]["exec"]["command"] == [
        "fairpool",
        "drain",
        "--timeout",
        "120",
    ]
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == 120 + DRAIN_SLACK
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert spec["progressDeadlineSeconds"] == 1800 + 600 + 3600  # load, slack, download
    k8s_validate(deployment)

    quick = engine_deployment(vllm_pool(drainSeconds=0, rollout={"maxSurge": 1}), config)
    assert "lifecycle" not in quick["spec"]["template"]["spec"]["containers"][0]
    assert "terminationGracePeriodSeconds" not in quick["spec"]["template"]["spec"]
    assert quick["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 1}
    k8s_validate(quick)

    sim = engine_deployment(InferencePool.model_validate(stored(pool("chat"))), config)
    assert "strategy" not in sim["spec"] and sim["spec"]["progressDeadlineSeconds"] == 720
    percent = {"maxSurge": "50%", "maxUnavailable": 0}
    chosen = engine_deployment(vllm_pool(rollout=percent), config)
    assert chosen["spec"]["strategy"]["rollingUpdate"] == percent


@pytest.mark.parametrize("bad", [-1, "abc", "50", "1000%", 1.5])
def test_a_rollout_takes_counts_or_percentages(bad):
    with pytest.raises(ValidationError, match="maxSurge"):
        vllm_pool(rollout={"maxSurge": bad})


def k8s_validate(obj: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(obj, "1.37.0", strict=True)
