"""The operator's pure functions: a pool and its tenants → Deployment, Service, ConfigMap and
the gateway's Secret; invalid specs → problems naming the field; `fairpool render`. Every
rendered object is checked against Kubernetes' own schemas (kubernetes-validate, strict:
unknown fields are errors), statuses against the CRDs' status schemas."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from fairpool.api.gateway_config import GatewayConfig, key_digest
from fairpool.api.inference_pool import InferencePool
from fairpool.api.rendering import engine_arguments
from fairpool.api.stored import stored
from fairpool.sched.errors import ConfigError
from fairpool_cli.local.plan import HOST, engine_process, fairpool_command
from fairpool_cli.main import main
from fairpool_operator import contract
from fairpool_operator.config import OperatorConfig
from fairpool_operator.plan import plan_namespace
from fairpool_operator.render import engine_deployment, pool_objects
from fairpool_operator.status import group_status, pool_status, tenant_status

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
CONFIG = OperatorConfig(
    namespace="serving",
    engine_image="registry.example/engine:1",
    engine_sim_image="registry.example/engine-sim:1",
)


def pool_body(name: str = "chat", uid: str = "uid-chat", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name, "uid": uid, "generation": 3},
        "spec": {
            "model": {"name": f"{name}-model", "source": "pvc://weights/llama"},
            "engine": {"kind": "vllm"},
            "replicas": 2,
        },
    }
    body["spec"].update(spec)
    return stored(body)  # what the operator reads: the CRD's defaults filled in


def tenant_body(name: str, weight: float = 1, pools: list[str] | None = None, **spec: Any):
    body: dict[str, Any] = {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "TenantQuota",
        "metadata": {"name": name, "generation": 1},
        "spec": {
            "weight": weight,
            "pools": pools or [],
            "apiKeySecretRef": {"name": f"{name}-keys"},
        },
    }
    body["spec"].update(spec)
    return stored(body)


def group_body(name: str, weight: float = 1, parent: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": weight}
    if parent is not None:
        spec["parent"] = parent
    body = {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "TenantGroup",
        "metadata": {"name": name, "generation": 1},
        "spec": spec,
    }
    return stored(body)


def secret_body(name: str, labelled: bool = True, **keys: str) -> dict[str, Any]:
    """A key Secret (labelled `fairpool.io/api-keys: "true"` unless `labelled` is false)."""
    data = {key: base64.b64encode(value.encode()).decode() for key, value in keys.items()}
    metadata: dict[str, Any] = {"name": name}
    if labelled:
        metadata["labels"] = {"fairpool.io/api-keys": "true"}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "data": data}


def pool(**spec: Any) -> InferencePool:
    return InferencePool.model_validate(pool_body(**spec))


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def volumes(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}


def mounts(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container(deployment)["volumeMounts"]}


def k8s_validate(obj: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(obj, "1.37.0", strict=True)  # raises, naming the field


# --- one pool ---------------------------------------------------------------------------------


def test_a_pool_becomes_a_configmap_a_headless_service_a_deployment_and_a_budget_it_owns():
    configmap, service, deployment, budget = pool_objects(pool(), [], CONFIG)
    assert [o["kind"] for o in (configmap, service, deployment, budget)] == [
        "ConfigMap",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
    ]
    assert configmap["metadata"]["name"] == "chat-scheduler"
    assert service["metadata"]["name"] == deployment["metadata"]["name"] == "chat-engine"
    assert budget["metadata"]["name"] == "chat-engine"
    assert budget["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
    }
    labels = {
        "app.kubernetes.io/name": "fairpool-engine",
        "app.kubernetes.io/instance": "chat",
        "app.kubernetes.io/managed-by": "fairpool-operator",
        "fairpool.io/pool": "chat",
    }
    owner = {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "InferencePool",
        "name": "chat",
        "uid": "uid-chat",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for obj in (configmap, service, deployment, budget):
        assert obj["metadata"]["namespace"] == "serving"
        assert obj["metadata"]["labels"] == labels
        assert obj["metadata"]["ownerReferences"] == [owner]
        k8s_validate(obj)
    assert deployment["spec"]["template"]["metadata"]["labels"] == labels
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_engine_pods_are_non_root_read_only_and_ready_on_health() -> None:
    deployment = engine_deployment(pool(), CONFIG)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    engine = container(deployment)
    assert engine["securityContext"]["readOnlyRootFilesystem"] is True
    assert engine["securityContext"]["allowPrivilegeEscalation"] is False
    # /tmp and /dev/shm are bounded: a pod that writes past them is evicted, not its node
    assert volumes(deployment)["tmp"] == {"name": "tmp", "emptyDir": {"sizeLimit": "32Gi"}}
    assert volumes(deployment)["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert mounts(deployment)["tmp"]["mountPath"] == "/tmp"
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        assert engine[probe]["httpGet"] == {"path": "/health", "port": "http"}
    # a vLLM replica may load its model for 30 minutes before liveness counts
    startup = engine["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 1800
    assert engine["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    # the scheduler configuration: a directory (no subPath), so ConfigMap updates reach it
    scheduler = mounts(deployment)["scheduler"]
    assert scheduler == {
        "name": "scheduler",
        "mountPath": "/etc/fairpool/scheduler",
        "readOnly": True,
    }
    assert volumes(deployment)["scheduler"]["configMap"] == {"name": "chat-scheduler"}


def test_probes_and_volumes_follow_the_pool_and_engines_get_the_charts_pull_secrets() -> None:
    sized = pool(engine={"kind": "vllm", "startupSeconds": 3605, "shmSize": "1Gi"})
    config = dataclasses.replace(CONFIG, pull_secrets=("registry-a", "registry-b"))
    deployment = engine_deployment(sized, config)
    startup = container(deployment)["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3605
    assert volumes(deployment)["dshm"]["emptyDir"]["sizeLimit"] == "1Gi"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
    assert "imagePullSecrets" not in engine_deployment(pool(), CONFIG)["spec"]["template"]["spec"]
    env = {contract.PULL_SECRETS_ENV: "registry-a, registry-b,"}
    assert OperatorConfig.from_environment(env).pull_secrets == ("registry-a", "registry-b")
    sim = engine_deployment(pool(engine={"kind": "sim"}), CONFIG)
    sim_startup = container(sim)["startupProbe"]
    assert sim_startup["periodSeconds"] * sim_startup["failureThreshold"] == 120
    k8s_validate(deployment)


def test_a_pool_may_let_its_engines_start_on_an_untested_vllm() -> None:
    def env(deployment: dict[str, Any]) -> dict[str, str]:
        return {var["name"]: var.get("value") for var in container(deployment)["env"]}

    assert "FAIRPOOL_ALLOW_UNTESTED_VLLM" not in env(engine_deployment(pool(), CONFIG))
    trying = pool(engine={"kind": "vllm", "allowUntestedVllm": True})
    assert env(engine_deployment(trying, CONFIG))["FAIRPOOL_ALLOW_UNTESTED_VLLM"] == "1"


def test_resources_are_kubernetes_quantities_of_any_resource() -> None:
    resources = {
        "gpus": 2,
        "gpuResource": "nvidia.com/mig-3g.40gb",
        "cpu": 8,  # unquoted: an integer quantity
        "memory": "64Gi",
        "requests": {"cpu": "4", "ephemeral-storage": "100Gi"},
        "limits": {"rdma/ib": 1},
    }
    deployment = engine_deployment(pool(engine={"kind": "vllm", "resources": resources}), CONFIG)
    assert container(deployment)["resources"] == {
        "requests": {"cpu": "4", "memory": "64Gi", "ephemeral-storage": "100Gi"},
        "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/mig-3g.40gb": "2", "rdma/ib": "1"},
    }
    k8s_validate(deployment)
    for bad, field in (
        ({"cpu": "lots"}, "cpu"),
        ({"memory": True}, "memory"),
        ({"limits": {"Not A Name!": 1}}, "limits"),
        ({"gpuResource": "nvidia.com/"}, "gpuResource"),
    ):
        with pytest.raises(ValidationError, match=field):
            pool(engine={"kind": "vllm", "resources": bad})


def test_a_vllm_pool_gets_one_gpu_unless_it_says_otherwise() -> None:
    assert container(engine_deployment(pool(), CONFIG))["resources"]["limits"] == {
        "nvidia.com/gpu": "1"
    }
    none = engine_deployment(pool(engine={"kind": "vllm", "resources": {"gpus": 0}}), CONFIG)
    assert "resources" not in container(none)
    assert "resources" not in container(engine_deployment(pool(engine={"kind": "sim"}), CONFIG))


def test_vllm_runs_fairpool_engine_on_the_mounted_weights() -> None:
    deployment = engine_deployment(pool(), CONFIG)
    engine = container(deployment)
    assert engine["image"] == "registry.example/engine:1"
    assert engine["command"] == ["fairpool"]
    assert engine["args"] == [
        "engine",
        "--model",
        "/models",
        "--served-model-name",
        "chat-model",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--scheduler-config",
        "/etc/fairpool/scheduler/scheduler.yaml",
    ]
    claim = {"claimName": "weights", "readOnly": True}
    assert volumes(deployment)["model"]["persistentVolumeClaim"] == claim
    assert mounts(deployment)["model"] == {
        "name": "model",
        "mountPath": "/models",
        "readOnly": True,
        "subPath": "llama",
    }
    assert volumes(deployment)["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


def test_model_from_a_whole_volume_claim() -> None:
    deployment = engine_deployment(pool(model={"name": "m", "source": "pvc://weights"}), CONFIG)
    assert volumes(deployment)["model"]["persistentVolumeClaim"]["claimName"] == "weights"
    assert "subPath" not in mounts(deployment)["model"]
    assert "initContainers" not in deployment["spec"]["template"]["spec"]
    assert container(deployment)["args"][2] == "/models"
    k8s_validate(deployment)


def test_gpus_resources_placement_and_extra_args() -> None:
    engine = {
        "kind": "vllm",
        "image": "my/vllm:2",
        "resources": {"gpus": 2, "cpu": "8", "memory": "64Gi"},
        "nodeSelector": {"gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "extraArgs": ["--gpu-memory-utilization", "0.9"],
    }
    deployment = engine_deployment(pool(engine=engine), CONFIG)
    spec = container(deployment)
    assert spec["image"] == "my/vllm:2"
    assert spec["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi"},
        "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"},
    }
    assert spec["args"][-4:] == ["--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9"]
    template = deployment["spec"]["template"]["spec"]
    assert template["nodeSelector"] == {"gpu": "h100"}
    assert template["tolerations"] == engine["tolerations"]
    # a full GPU pool has no spare GPU for a surge: replace one replica at a time
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    k8s_validate(deployment)

    chosen = {**engine, "extraArgs": ["--tensor-parallel-size=1"]}
    args = container(engine_deployment(pool(engine=chosen), CONFIG))["args"]
    assert args.count("--tensor-parallel-size=1") == 1 and "--tensor-parallel-size" not in args


def test_a_simulated_pool_runs_engine_sim_without_weights() -> None:
    engine = {
        "kind": "sim",
        "sim": {"profile": "llama3-8b-h100", "speedup": 4, "memoryTokens": 20000},
    }
    model = {"name": "demo", "maxModelLen": 4096}
    deployment = engine_deployment(pool(engine=engine, model=model), CONFIG)
    spec = container(deployment)
    assert spec["image"] == "registry.example/engine-sim:1"
    assert spec["args"] == [
        "engine-sim",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--scheduler-config",
        "/etc/fairpool/scheduler/scheduler.yaml",
        "--model",
        "demo",
        "--profile",
        "llama3-8b-h100",
        "--speedup",
        "4.0",
        "--memory-tokens",
        "20000",
        "--max-model-len",
        "4096",
    ]
    assert {"model", "dshm"}.isdisjoint(volumes(deployment))
    assert "resources" not in spec and "strategy" not in deployment["spec"]
    k8s_validate(deployment)


def test_local_mode_runs_the_same_engine_command_line(tmp_path: Path) -> None:
    sim = pool(engine={"kind": "sim"}, model={"name": "demo"})
    process = engine_process("engine chat-0", sim, 9100, tmp_path / "s.yaml")
    arguments = engine_arguments(
        sim, host=HOST, port=9100, scheduler_config=str(tmp_path / "s.yaml"), model=None
    )
    assert process.command == [*fairpool_command(), *arguments, "--disable-uvicorn-access-log"]


# --- tenants: weights and the gateway's table ----------------------------------------------------


def test_weights_of_the_tenants_allowed_on_a_pool_go_to_its_configmap_only() -> None:
    pools = [pool_body("chat"), pool_body("code", uid="uid-code")]
    tenants = [
        tenant_body("acme", 2, ["chat"]),
        tenant_body("globex", 1),
        tenant_body("initech", 5, ["code"]),
    ]
    secrets = {
        f"{t}-keys": secret_body(f"{t}-keys", key=f"sk-{t}") for t in ("acme", "globex", "initech")
    }
    plan = plan_namespace(pools, tenants, secrets, CONFIG)
    chat, code = (yaml.safe_load(p.objects[0]["data"]["scheduler.yaml"]) for p in plan.pools)
    assert chat["tenants"] == {"acme": 2.0, "globex": 1.0}
    assert code["tenants"] == {"globex": 1.0, "initech": 5.0}
    assert chat["policy"] == "dlpm"

    # a weight change: the ConfigMaps and the gateway Secret change, nothing else does
    tenants[0]["spec"]["weight"] = 3
    again = plan_namespace(pools, tenants, secrets, CONFIG)
    changed = [
        (a["kind"], a["metadata"]["name"])
        for a, b in zip(plan.objects, again.objects, strict=True)
        if a != b
    ]
    assert changed == [("ConfigMap", "chat-scheduler"), ("Secret", "fairpool-gateway-config")]


def test_the_gateway_secret_holds_digests_and_watches_endpoint_slices() -> None:
    pools = [pool_body("chat")]
    tenants = [tenant_body("acme", 2, ["chat"], limits={"requestsPerMinute": 60})]
    secrets = {"acme-keys": secret_body("acme-keys", a="sk-one", b="sk-two")}
    plan = plan_namespace(pools, tenants, secrets, CONFIG)
    secret = plan.gateway_secret
    assert secret["metadata"]["name"] == "fairpool-gateway-config"
    assert "labels" not in secret["metadata"]  # the chart owns the Secret's metadata
    text = secret["stringData"]["gateway.yaml"]
    assert "sk-one" not in text and "sk-two" not in text
    config = GatewayConfig.model_validate(yaml.safe_load(text))
    assert (config.listen.host, config.listen.port) == ("0.0.0.0", 8080)
    assert (config.admin.host, config.admin.port) == ("0.0.0.0", 8081)
    (entry,) = config.pools
    assert entry.model == "chat-model"
    assert entry.workers.kubernetes is not None
    assert entry.workers.kubernetes.model_dump(by_alias=True) == {
        "namespace": "serving",
        "service": "chat-engine",
        "portName": "http",
    }
    (acme,) = config.tenants
    assert acme.api_key_sha256 == sorted([key_digest("sk-one"), key_digest("sk-two")])
    assert (acme.weight, acme.pools, acme.limits.requests_per_minute) == (2.0, ["chat"], 60)
    k8s_validate(secret)


# --- invalid specs: a problem naming the field, never an exception ------------------------------


@pytest.mark.parametrize(
    ("change", "reason", "field"),
    [
        (
            {"model": {"name": "m", "source": "ftp://x/y"}},
            "InvalidSpec",
            "spec.model.source",
        ),
        ({"model": {"name": "m"}}, "InvalidSpec", "model.source is required"),
        ({"replicas": -1}, "InvalidSpec", "spec.replicas"),
        ({"scheduler": {"policy": "nope"}}, "InvalidSpec", "spec.scheduler.policy"),
        ({"engine": {"kind": "tpu"}}, "InvalidSpec", "spec.engine.kind"),
    ],
)
def test_an_invalid_pool_gets_a_problem_naming_the_field(change, reason, field) -> None:
    body = pool_body()
    body["spec"].update(change)
    plan = plan_namespace([body], [], {}, CONFIG)
    (pool_plan,) = plan.pools
    assert pool_plan.pool is None and pool_plan.objects == []  # what runs is left alone
    assert pool_plan.problem is not None
    assert pool_plan.problem.reason == reason and field in pool_plan.problem.message
    degraded = condition(pool_status(pool_plan, None, []), "Degraded")
    assert degraded["status"] == "True" and field in degraded["message"]
    assert degraded["observedGeneration"] == 3


def test_an_invalid_pool_keeps_its_place_in_the_gateway() -> None:
    good = plan_namespace([pool_body()], [], {}, CONFIG)
    broken = pool_body()
    broken["spec"]["model"]["source"] = "nope"
    plan = plan_namespace([broken], [], {}, CONFIG, previous_gateway=good.gateway)
    assert [p.name for p in plan.gateway.pools] == ["chat"]
    assert plan_namespace([broken], [], {}, CONFIG).gateway.pools == []


def test_names_and_duplicates() -> None:
    older = pool_body("chat")
    older["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    newer = pool_body("chat2", uid="u2")
    newer["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    newer["spec"]["model"]["name"] = "chat-model"
    numeric = pool_body("1chat", uid="u3")
    plan = plan_namespace([newer, numeric, older], [], {}, CONFIG)
    problems = {p.name: p.problem for p in plan.pools}
    assert problems["chat"] is None
    assert problems["chat2"] is not None and problems["chat2"].reason == "DuplicateModel"
    assert "spec.model.name" in problems["chat2"].message and "chat" in problems["chat2"].message
    assert problems["1chat"] is not None and problems["1chat"].message.startswith("metadata.name")

    first = tenant_body("acme")
    first["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    second = tenant_body("acme-2", tenant="acme")
    second["metadata"]["creationTimestamp"] = "2026-03-01T00:00:00Z"
    secrets = {
        "acme-keys": secret_body("acme-keys", key="k1"),
        "acme-2-keys": secret_body("acme-2-keys", key="k2"),
    }
    plan = plan_namespace([older], [second, first], secrets, CONFIG)
    duplicate = next(t for t in plan.tenants if t.name == "acme-2")
    assert duplicate.problem is not None and duplicate.problem.reason == "DuplicateTenant"
    assert [t.tenant for t in plan.gateway.tenants] == ["acme"]


def test_tenant_secrets_missing_or_without_the_key_name_the_secret_and_key() -> None:
    tenants = [
        tenant_body("nosecret"),
        tenant_body("nokey", apiKeySecretRef={"name": "shared", "key": "token"}),
        tenant_body("empty", apiKeySecretRef={"name": "blank"}),
        tenant_body("nokeys", apiKeySecretRef=None),
        tenant_body("ok", apiKeySecretRef={"name": "shared", "key": "primary"}),
        tenant_body("lost", pools=["gone"], apiKeySecretRef={"name": "shared"}),
        tenant_body("stray", apiKeySecretRef={"name": "app-credentials"}),
    ]
    secrets = {
        "shared": secret_body("shared", primary="sk-primary"),
        "blank": secret_body("blank", key="  "),
        "app-credentials": secret_body("app-credentials", labelled=False, password="hunter2"),
    }
    plan = plan_namespace([pool_body()], tenants, secrets, CONFIG)
    by_name = {t.name: t for t in plan.tenants}
    expected = {
        "nosecret": (
            "SecretNotFound",
            "Secret 'nosecret-keys' not found in namespace serving among the Secrets labelled "
            'fairpool.io/api-keys: "true"',
        ),
        "stray": (
            "SecretNotLabelled",
            "Secret 'app-credentials' lacks the label fairpool.io/api-keys: \"true\"",
        ),
        "nokey": ("KeyNotFound", "Secret 'shared' has no key 'token'"),
        "empty": ("NoKeys", "holds no API key"),
    }
    for name, (reason, text) in expected.items():
        status = tenant_status(by_name[name])
        missing, ready = condition(status, "SecretMissing"), condition(status, "Ready")
        assert (missing["status"], missing["reason"]) == ("True", reason), name
        assert missing["message"].startswith("spec.apiKeySecretRef") and text in missing["message"]
        assert ready["status"] == "False"
    assert condition(tenant_status(by_name["nokeys"]), "Ready")["reason"] == "NoApiKeys"
    lost = condition(tenant_status(by_name["lost"]), "Ready")
    assert (lost["reason"], lost["message"]) == (
        "PoolNotFound",
        "spec.pools: no InferencePool named gone exists",
    )
    ok = tenant_status(by_name["ok"])
    assert condition(ok, "Ready")["status"] == "True"
    assert condition(ok, "SecretMissing")["status"] == "False"
    assert [t.tenant for t in plan.gateway.tenants] == ["ok"]
    assert key_digest("hunter2") not in json.dumps(plan.gateway_secret)


def test_a_key_shared_by_two_tenants_stays_with_the_older_and_the_other_is_told() -> None:
    older = tenant_body("acme", apiKeySecretRef={"name": "team-keys"})
    older["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    newer = tenant_body("zeta", apiKeySecretRef={"name": "copied-keys"})
    newer["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    also = tenant_body("beta", apiKeySecretRef={"name": "team-keys"})  # the same Secret
    also["metadata"]["creationTimestamp"] = "2026-03-01T00:00:00Z"
    secrets = {
        "team-keys": secret_body("team-keys", key="sk-team"),
        "copied-keys": secret_body("copied-keys", mine="sk-zeta", copied="sk-team"),
    }
    plan = plan_namespace([pool_body()], [newer, also, older], secrets, CONFIG)  # no raise
    assert [t.tenant for t in plan.gateway.tenants] == ["acme"]
    by_name = {t.name: t for t in plan.tenants}
    for name, secret in (("zeta", "copied-keys"), ("beta", "team-keys")):
        ready = condition(tenant_status(by_name[name]), "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "DuplicateKey"), name
        assert ready["message"] == (
            f"spec.apiKeySecretRef: a key in Secret {secret!r} is already the key of "
            "TenantQuota acme; a key must name one tenant"
        )
    assert condition(tenant_status(by_name["acme"]), "Ready")["status"] == "True"


# --- statuses fit the CRDs ----------------------------------------------------------------------


def crd_status_schema(plural: str) -> dict[str, Any]:
    path = ROOT / "crds" / f"{plural}.fairpool.io.yaml"
    if not path.exists():
        pytest.skip(f"{path} not generated")
    crd = yaml.safe_load(path.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    assert "status" in version.get("subresources", {})
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"]["properties"]["status"])
    return strict(schema)


def strict(schema: Any) -> Any:
    """The schema with unknown properties refused: what a real API server would prune."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema:
            schema.setdefault("additionalProperties", False)
        return {key: strict(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def test_statuses_validate_against_the_crd_status_schemas() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from fairpool_operator.status import status_patch

    plan = plan_namespace([pool_body()], [tenant_body("acme")], {}, CONFIG)
    deployment = {
        "metadata": {"generation": 2},
        "spec": {"replicas": 2},
        "status": {
            "replicas": 2,
            "readyReplicas": 1,
            "updatedReplicas": 2,
            "observedGeneration": 2,
        },
    }
    pods = [{"metadata": {"name": "p"}, "status": {"podIP": "fd00::1", "phase": "Running"}}]
    pool_patch = status_patch(
        {}, pool_status(plan.pools[0], deployment, pods), "2026-11-21T10:00:00Z"
    )
    assert (
        pool_patch is not None and pool_patch["endpoints"][0]["address"] == "http://[fd00::1]:8000"
    )
    tenant_patch = status_patch({}, tenant_status(plan.tenants[0]), "2026-11-21T10:00:00Z")
    served = {"servedTokens": 10, "servedService": 12.5, "lastReported": "2026-11-21T10:00:00Z"}
    groups = [group_body("org"), group_body("team", parent="org"), group_body("lab", parent="x")]
    plan = plan_namespace(
        [pool_body()], [tenant_body("acme", group="team")], {}, CONFIG, groups=groups
    )
    shares = {
        "pools": [{"pool": "chat", "servedTokens": 10, "servedService": 12.5, "share": 0.25}],
        "lastReported": "2026-11-21T10:00:00Z",
    }
    group_patches = [
        {**(status_patch({}, group_status(group), "2026-11-21T10:00:00Z") or {}), **shares}
        for group in plan.groups
    ]
    assert [patch["conditions"][0]["status"] for patch in group_patches] == [
        "False",
        "True",
        "True",
    ]
    for plural, status in (
        ("inferencepools", pool_patch),
        ("tenantquotas", {**(tenant_patch or {}), **served}),
        *(("tenantgroups", patch) for patch in group_patches),
    ):
        jsonschema.validate(status, crd_status_schema(plural))


# --- fairpool render -----------------------------------------------------------------------------


def test_fairpool_render_prints_what_the_operator_creates(tmp_path: Path, capsys) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump_all(
            [
                secret_body("flood-keys", key="sk-local-flood-0001"),
                secret_body("light-keys", key="k"),
            ]
        )
    )
    example = str(ROOT / "examples" / "local.yaml")
    assert main(["render", "-f", example, "-f", str(keys), "-n", "team-a"]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ConfigMap", "chat-scheduler"),
        ("Service", "chat-engine"),
        ("Deployment", "chat-engine"),
        ("PodDisruptionBudget", "chat-engine"),
        ("Secret", "fairpool-gateway-config"),
    ]
    assert {o["metadata"]["namespace"] for o in objects} == {"team-a"}
    for obj in objects:
        k8s_validate(obj)
    gateway = objects[-1]["stringData"]["gateway.yaml"]
    assert "sk-local" not in gateway and key_digest("sk-local-flood-0001") in gateway
    assert objects[2]["metadata"]["ownerReferences"][0]["uid"] == "<uid of the InferencePool>"

    assert main(["render", "-f", example, "-f", str(keys), "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["kind"] == "List" and len(listed["items"]) == 5


def test_fairpool_render_reports_problems_on_stderr(tmp_path: Path, capsys) -> None:
    manifests = tmp_path / "bad.yaml"
    bad = pool_body()
    bad["spec"]["model"]["source"] = "ftp://a"
    manifests.write_text(yaml.safe_dump_all([bad, tenant_body("acme")]))
    assert main(["render", "-f", str(manifests)]) == 1
    captured = capsys.readouterr()
    assert "InferencePool chat: spec.model.source" in captured.err
    assert "TenantQuota acme: spec.apiKeySecretRef: Secret 'acme-keys' not found" in captured.err
    kinds = [o["kind"] for o in yaml.safe_load_all(captured.out)]
    assert kinds == ["Secret"]  # the gateway's, with neither pool nor tenant
    assert main(["render", "-f", str(tmp_path / "none.yaml")]) == 2


def test_fairpool_render_of_groups_and_bands(tmp_path: Path, capsys) -> None:
    """examples/tenants-slo.yaml, with its keys in Secrets the operator reads: the tree
    reaches the scheduler ConfigMap and the gateway's configuration; a broken one is
    reported naming the object and field, and the rest still renders."""
    documents = list(yaml.safe_load_all((ROOT / "examples" / "tenants-slo.yaml").read_text()))
    names = [d["spec"]["apiKeySecretRef"]["name"] for d in documents if d["kind"] == "TenantQuota"]
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump_all([secret_body(n, key=f"sk-{n}") for n in names]))
    example = str(ROOT / "examples" / "tenants-slo.yaml")
    assert main(["render", "-f", example, "-f", str(keys)]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    scheduler = yaml.safe_load(objects[0]["data"]["scheduler.yaml"])
    gateway = yaml.safe_load(objects[-1]["stringData"]["gateway.yaml"])
    assert (
        set(gateway["groups"])
        == set(scheduler["groups"])
        == {
            "acme",
            "acme-support",
            "acme-research",
            "globex",
        }
    )
    assert {t["tenant"]: t["group"] for t in gateway["tenants"]} == scheduler["tenantGroups"]
    assert scheduler["tenantBands"] == {"chat": "interactive", "batch": "batch"}
    shares = GatewayConfig.model_validate(gateway).shares("assistant")
    assert shares.path("chat") == ("acme", "acme-support")
    assert shares.tenant_band("chat") == "interactive"

    broken = [d for d in documents if d["kind"] != "TenantGroup" or d["metadata"]["name"] != "acme"]
    broken.append({**documents[1], "spec": {"parent": "acme-support"}})  # acme in a cycle
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump_all(broken))
    assert main(["render", "-f", str(path), "-f", str(keys)]) == 1
    captured = capsys.readouterr()
    assert (
        "TenantGroup acme: spec.parent: the groups acme → acme-support → acme form a cycle"
        in captured.err
    )
    assert "ConfigMap" in captured.out


def test_rendering_is_deterministic() -> None:
    bodies = [pool_body(), pool_body("code", uid="u2")]
    tenants = [tenant_body("acme")]
    secrets = {"acme-keys": secret_body("acme-keys", key="k")}
    first = plan_namespace(bodies, tenants, secrets, CONFIG).objects
    second = plan_namespace(list(reversed(bodies)), tenants, secrets, CONFIG).objects
    assert first == second
    for obj in first:
        assert obj["metadata"]["annotations"][contract.HASH_ANNOTATION]
    template = first[2]["spec"]["template"]["metadata"]
    assert "annotations" not in template  # nothing on the pods that a weight change would touch


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(item for item in status["conditions"] if item["type"] == kind)


def test_several_gateway_pods_get_the_shared_state_in_gateway_yaml():
    """What the chart sets for gateway.replicas > 1 reaches the gateway's configuration."""
    environment = {
        contract.SHARED_STATE_URL_ENV: "redis://fp-shared-state.serving:6379/0",
        contract.GATEWAY_REPLICAS_ENV: "3",
        contract.SHARED_STATE_PASSWORD_ENV: "true",
        contract.SHARED_STATE_USERNAME_ENV: "fairpool-gateway",
        contract.SHARED_STATE_KEY_PREFIX_ENV: "serving.fp",
    }
    config = OperatorConfig.from_environment(environment, namespace="serving")
    shared = plan_namespace([pool_body()], [], {}, config).gateway.shared_state
    assert shared is not None
    assert (shared.url, shared.replicas) == ("redis://fp-shared-state.serving:6379/0", 3)
    assert shared.password_file == contract.SHARED_STATE_PASSWORD_PATH
    assert (shared.username, shared.key_prefix) == ("fairpool-gateway", "serving.fp")
    assert plan_namespace([pool_body()], [], {}, CONFIG).gateway.shared_state is None
    with pytest.raises(ConfigError) as error:
        OperatorConfig.from_environment({contract.GATEWAY_REPLICAS_ENV: "two"})
    assert error.value.parameter == contract.GATEWAY_REPLICAS_ENV
