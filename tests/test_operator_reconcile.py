"""The reconciler against a fake API: it creates what is missing, applies what differs, writes
statuses that changed — and nothing else. A second reconcile with nothing changed writes
nothing; a weight change rewrites only the scheduler ConfigMaps and the gateway's Secret."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import threading
from typing import Any

import pytest
import yaml
from helpers import tenant_group as group
from operator_fakes import FakeApi
from polling import DEADLINE, wait_until

from fairpool.api.gateway_config import GatewayConfig, key_digest
from fairpool.api.scheduler_config import parse_scheduler_config
from fairpool.sched.errors import ConfigError
from fairpool_operator.api import ApiError
from fairpool_operator.config import GeneratedSecret, OperatorConfig
from fairpool_operator.reconcile import Reconciler, Write, contains, up_to_date
from fairpool_operator.runtime import Operator
from fairpool_operator.served import Served, parse_served

pytestmark = pytest.mark.unit

CONFIG = OperatorConfig(namespace="serving", engine_sim_image="sim:1", engine_image="vllm:1")


def pool(name: str, replicas: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": f"{name}-model"},
            "engine": {"kind": "sim", "resources": {"cpu": "0.5"}},
            "replicas": replicas,
            **spec,
        },
    }


def tenant(name: str, weight: float, pools: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "TenantQuota",
        "metadata": {"name": name},
        "spec": {"weight": weight, "pools": pools, "apiKeySecretRef": {"name": f"{name}-keys"}},
    }


def secret(name: str, *keys: str, labelled: bool = True) -> dict[str, Any]:
    """A key Secret (labelled `fairpool.io/api-keys: "true"` unless `labelled` is false)."""
    data = {f"k{i}": base64.b64encode(key.encode()).decode() for i, key in enumerate(keys)}
    metadata: dict[str, Any] = {"name": name}
    if labelled:
        metadata["labels"] = {"fairpool.io/api-keys": "true"}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "data": data}


def clock() -> Any:
    ticks = itertools.count()
    return lambda: f"2026-11-21T10:{next(ticks) % 60:02d}:00Z"


def namespace() -> tuple[FakeApi, Reconciler]:
    api = FakeApi()
    for body in (
        pool("chat", replicas=2),
        pool("code"),
        tenant("acme", 1, ["chat"]),
        tenant("globex", 2, []),
        secret("acme-keys", "sk-a"),
        secret("globex-keys", "sk-g"),
    ):
        api.put(body)
    return api, Reconciler(api, CONFIG, clock())


def scheduler(api: FakeApi, pool_name: str) -> dict[str, Any]:
    data = api.objects["ConfigMap", f"{pool_name}-scheduler"]["data"]["scheduler.yaml"]
    return yaml.safe_load(data)


def gateway(api: FakeApi) -> dict[str, Any]:
    data = api.objects["Secret", "fairpool-gateway-config"]["data"]["gateway.yaml"]
    return yaml.safe_load(base64.b64decode(data))


def test_first_reconcile_creates_everything_and_the_second_writes_nothing() -> None:
    api, reconciler = namespace()
    reconciler.reconcile()
    created = {(kind, name) for verb, kind, name in api.take_writes() if verb == "create"}
    assert created == {
        ("ConfigMap", "chat-scheduler"),
        ("Service", "chat-engine"),
        ("Deployment", "chat-engine"),
        ("PodDisruptionBudget", "chat-engine"),
        ("ConfigMap", "code-scheduler"),
        ("Service", "code-engine"),
        ("Deployment", "code-engine"),
        ("PodDisruptionBudget", "code-engine"),
        ("Secret", "fairpool-gateway-config"),
    }
    assert scheduler(api, "chat")["tenants"] == {"acme": 1.0, "globex": 2.0}
    assert [t["tenant"] for t in gateway(api)["tenants"]] == ["acme", "globex"]
    # the API server defaulted fields and rewrote "0.5" as "500m": still up to date
    assert reconciler.reconcile() == []
    assert api.take_writes() == []


def test_a_weight_change_patches_only_configmaps_and_the_gateway_secret() -> None:
    api, reconciler = namespace()
    reconciler.reconcile()
    api.take_writes()
    before = {key: obj["metadata"]["resourceVersion"] for key, obj in api.objects.items()}

    api.edit("TenantQuota", "globex", {"weight": 5})  # globex may use every pool
    reconciler.reconcile()
    assert sorted(api.take_writes()) == [
        ("apply", "ConfigMap", "chat-scheduler"),
        ("apply", "ConfigMap", "code-scheduler"),
        ("apply", "Secret", "fairpool-gateway-config"),
        ("status", "TenantQuota", "globex"),  # observedGeneration
    ]
    assert scheduler(api, "code")["tenants"] == {"globex": 5.0}
    for kind in ("Deployment", "Service"):
        for name in ("chat-engine", "code-engine"):
            assert api.objects[kind, name]["metadata"]["resourceVersion"] == before[kind, name]

    api.edit("TenantQuota", "acme", {"weight": 3})  # acme: chat only
    reconciler.reconcile()
    assert sorted(api.take_writes()) == [
        ("apply", "ConfigMap", "chat-scheduler"),
        ("apply", "Secret", "fairpool-gateway-config"),
        ("status", "TenantQuota", "acme"),
    ]


def test_scaling_patches_the_deployment_only() -> None:
    api, reconciler = namespace()
    reconciler.reconcile()
    api.take_writes()
    api.edit("InferencePool", "chat", {"replicas": 4})
    reconciler.reconcile()
    assert api.take_writes() == [
        ("apply", "Deployment", "chat-engine"),
        ("status", "InferencePool", "chat"),
    ]
    assert api.objects["Deployment", "chat-engine"]["spec"]["replicas"] == 4
    assert api.objects["InferencePool", "chat"]["status"]["observedGeneration"] == 2


def test_drift_is_repaired_and_a_rotated_key_reaches_the_gateway() -> None:
    api, reconciler = namespace()
    reconciler.reconcile()
    api.take_writes()
    container = api.objects["Deployment", "chat-engine"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    container["image"] = "someone/else:latest"  # kubectl edit
    del api.objects["ConfigMap", "code-scheduler"]  # kubectl delete
    api.objects["Secret", "acme-keys"]["data"]["k1"] = base64.b64encode(b"sk-new").decode()
    reconciler.reconcile()
    assert sorted(api.take_writes()) == [
        ("apply", "Deployment", "chat-engine"),
        ("apply", "Secret", "fairpool-gateway-config"),
        ("create", "ConfigMap", "code-scheduler"),
    ]
    assert (
        container["image"]
        != api.objects["Deployment", "chat-engine"]["spec"]["template"]["spec"]["containers"][0][
            "image"
        ]
    )
    assert len(gateway(api)["tenants"][0]["apiKeySha256"]) == 2


def test_an_invalid_edit_leaves_what_runs_and_says_why_once() -> None:
    api, reconciler = namespace()
    reconciler.reconcile()
    api.take_writes()
    deployment = api.objects["Deployment", "chat-engine"]
    api.edit("InferencePool", "chat", {"engine": {"kind": "vllm"}, "replicas": 9})  # no source
    reconciler.reconcile()  # no exception
    assert api.take_writes() == [("status", "InferencePool", "chat")]
    assert api.objects["Deployment", "chat-engine"] is deployment  # untouched, still 2 replicas
    status = api.objects["InferencePool", "chat"]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "model.source" in degraded["message"]
    assert [p["name"] for p in gateway(api)["pools"]] == ["chat", "code"]  # still routed
    assert reconciler.reconcile() == []  # said once


def test_an_object_of_the_same_name_that_is_not_ours_is_left_alone() -> None:
    api, reconciler = namespace()
    api.put(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "chat-engine", "labels": {"app": "mine"}},
            "spec": {
                "replicas": 1,
                "template": {"spec": {"containers": [{"name": "x", "image": "mine"}]}},
            },
        }
    )
    reconciler.reconcile()
    assert api.objects["Deployment", "chat-engine"]["metadata"]["labels"] == {"app": "mine"}
    conditions = api.objects["InferencePool", "chat"]["status"]["conditions"]
    degraded = next(c for c in conditions if c["type"] == "Degraded")
    assert degraded["reason"] == "Conflict" and "Deployment chat-engine" in degraded["message"]
    # a status refresh keeps what only the full reconcile knows
    api.take_writes()
    reconciler.refresh_pool_status("chat")
    assert api.take_writes() == []


def test_pool_status_from_the_deployment_and_its_pods() -> None:
    api, reconciler = namespace()
    reconciler.reconcile()
    first = api.objects["InferencePool", "chat"]["status"]
    ready = next(c for c in first["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ReplicasNotReady")
    stamp = ready["lastTransitionTime"]

    api.objects["Deployment", "chat-engine"]["status"] = {
        "replicas": 2,
        "readyReplicas": 2,
        "updatedReplicas": 2,
        "observedGeneration": 1,
    }
    for name, ip in (("chat-engine-b", "10.0.0.2"), ("chat-engine-a", "10.0.0.1")):
        api.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"fairpool.io/pool": "chat"}},
                "status": {
                    "podIP": ip,
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "other", "labels": {"fairpool.io/pool": "code"}},
            "status": {"podIP": "10.0.0.9"},
        }
    )
    api.take_writes()
    reconciler.refresh_pool_status("chat")
    assert api.take_writes() == [("status", "InferencePool", "chat")]
    status = api.objects["InferencePool", "chat"]["status"]
    assert (status["replicas"], status["readyReplicas"]) == (2, 2)
    assert status["endpoints"] == [
        {"pod": "chat-engine-a", "address": "http://10.0.0.1:8000", "ready": True},
        {"pod": "chat-engine-b", "address": "http://10.0.0.2:8000", "ready": True},
    ]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (
        conditions["Ready"]["status"] == "True"
        and conditions["Ready"]["lastTransitionTime"] != stamp
    )
    assert conditions["Progressing"]["status"] == "False"
    assert conditions["Degraded"]["reason"] == "AsExpected"
    degraded_stamp = conditions["Degraded"]["lastTransitionTime"]
    # the other pool's pod shows in its own status only; then nothing changes, nothing is
    # written, and transition times are kept
    assert [str(write) for write in reconciler.reconcile()] == ["status InferencePool/code"]
    assert reconciler.reconcile() == [] and reconciler.refresh_pool_status("chat") == []
    assert conditions["Degraded"]["lastTransitionTime"] == degraded_stamp

    api.objects["Pod", "chat-engine-a"]["status"]["containerStatuses"] = [
        {
            "name": "engine",
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
        }
    ]
    reconciler.refresh_pool_status("chat")
    degraded = next(
        c
        for c in api.objects["InferencePool", "chat"]["status"]["conditions"]
        if c["type"] == "Degraded"
    )
    assert (degraded["reason"], degraded["message"]) == (
        "CrashLoopBackOff",
        "pod chat-engine-a: CrashLoopBackOff: back-off",
    )


def test_a_deleted_pool_leaves_the_gateway_and_its_tenants_weights() -> None:
    api, reconciler = namespace()
    reconciler.reconcile()
    del api.objects["InferencePool", "chat"]  # its objects go with it (garbage collector)
    for key in [
        ("Deployment", "chat-engine"),
        ("Service", "chat-engine"),
        ("ConfigMap", "chat-scheduler"),
    ]:
        del api.objects[key]
    api.take_writes()
    reconciler.reconcile()
    assert [p["name"] for p in gateway(api)["pools"]] == ["code"]
    assert [t["tenant"] for t in gateway(api)["tenants"]] == ["globex"]
    acme = next(
        c
        for c in api.objects["TenantQuota", "acme"]["status"]["conditions"]
        if c["type"] == "Ready"
    )
    assert (acme["status"], acme["reason"]) == ("False", "PoolNotFound")
    assert sorted(api.take_writes()) == [
        ("apply", "Secret", "fairpool-gateway-config"),
        ("status", "TenantQuota", "acme"),
    ]


def test_a_pool_being_deleted_is_not_recreated() -> None:
    api, reconciler = namespace()
    reconciler.reconcile()
    api.objects["InferencePool", "chat"]["metadata"]["deletionTimestamp"] = "2026-11-21T10:00:00Z"
    del api.objects["Deployment", "chat-engine"]  # foreground deletion: dependents go first
    api.take_writes()
    reconciler.reconcile()
    assert ("Deployment", "chat-engine") not in api.objects
    assert api.take_writes() == [
        ("apply", "Secret", "fairpool-gateway-config"),
        ("status", "TenantQuota", "acme"),  # its only pool is going
    ]


def test_served_numbers_are_written_when_they_change_and_kept_when_unreadable() -> None:
    api, reconciler = namespace()
    reconciler.reconcile()
    api.take_writes()
    reports: list[dict[str, Served] | None] = [{"acme": Served(120, 200.5)}]
    now = [0.0]
    operator = Operator(reconciler, lambda: reports[-1], clock=lambda: now[0])
    operator.poll_served(max_age=15)
    assert api.take_writes() == [("status", "TenantQuota", "acme")]
    status = api.objects["TenantQuota", "acme"]["status"]
    assert (status["servedTokens"], status["servedService"]) == (120, 200.5)
    assert status["lastReported"]
    assert operator.poll_served(max_age=15) is None  # asked again too soon
    now[0] = 20.0
    operator.poll_served(max_age=15)  # the same numbers: nothing written
    reports.append(None)  # the gateway is unreachable
    now[0] = 40.0
    assert operator.poll_served(max_age=15) is None
    assert api.take_writes() == []
    assert api.objects["TenantQuota", "acme"]["status"]["servedTokens"] == 120
    assert reconciler.reconcile() == []  # the reconcile leaves them alone


def test_gateway_metrics_are_summed_per_tenant() -> None:
    text = """# HELP fairpool_gateway_tokens_total Tokens
# TYPE fairpool_gateway_tokens_total counter
fairpool_gateway_tokens_total{tenant="acme",pool="chat",kind="prompt"} 100.0
fairpool_gateway_tokens_total{tenant="acme",pool="chat",kind="cached"} 60.0
fairpool_gateway_tokens_total{tenant="acme",pool="code",kind="completion"} 20.0
fairpool_gateway_tokens_created{tenant="acme",pool="chat",kind="prompt"} 1.7e9
fairpool_gateway_service_total{tenant="acme",pool="chat"} 80.0
fairpool_gateway_service_total{tenant="acme",pool="code"} 40.0
fairpool_gateway_service_total{tenant="b \\"q\\"",pool="chat"} 1.5
"""
    assert parse_served(text) == {
        "acme": Served(120, 120.0, {"chat": Served(100, 80.0), "code": Served(20, 40.0)}),
        'b \\"q\\"': Served(0, 1.5, {"chat": Served(0, 1.5)}),
    }


def test_concurrent_requests_coalesce_into_few_reconciles() -> None:
    """One reconcile is running (held by the test) when 7 more are requested: they all
    wait for it, then exactly one more runs for all of them (they were requested after
    the first started, so it did not cover them)."""
    _, reconciler = namespace()
    calls = []
    started, gate = threading.Event(), threading.Event()
    original = reconciler.reconcile

    def held() -> list[Any]:
        calls.append(1)
        started.set()
        assert gate.wait(DEADLINE)
        return original()

    reconciler.reconcile = held  # type: ignore[method-assign]
    operator = Operator(reconciler)
    first = threading.Thread(target=operator.reconcile)
    first.start()
    assert started.wait(DEADLINE)
    threads = [threading.Thread(target=operator.reconcile) for _ in range(7)]
    for thread in threads:
        thread.start()
    # All 7 have taken their turn number and wait for the running reconcile.
    wait_until(lambda: operator._requested, lambda requested: requested == 8)
    gate.set()
    for thread in [first, *threads]:
        thread.join()
    assert len(calls) == 2
    now = [100.0]
    timed = Operator(reconciler, clock=lambda: now[0])
    timed.reconcile()
    assert timed.reconcile(max_age=15) is None  # a timer's request, just after one
    now[0] = 120.0
    assert timed.reconcile(max_age=15) == []


def test_up_to_date_reads_quantities_and_ignores_added_fields() -> None:
    desired = {
        "metadata": {"annotations": {"fairpool.io/rendered-hash": "h"}},
        "spec": {"resources": {"cpu": "0.5", "memory": "1Gi"}, "ports": [{"port": 1}]},
    }
    current = {
        "metadata": {"annotations": {"fairpool.io/rendered-hash": "h", "other": "x"}},
        "spec": {
            "resources": {"cpu": "500m", "memory": "1024Mi"},
            "ports": [{"port": 1, "protocol": "TCP"}],
            "more": 1,
        },
    }
    assert up_to_date(current, desired)
    assert not up_to_date(
        {**current, "metadata": {"annotations": {"fairpool.io/rendered-hash": "old"}}}, desired
    )
    assert not contains({"ports": [{"port": 1}, {"port": 2}]}, {"ports": [{"port": 1}]})
    assert not contains({"image": "500m"}, {"image": "0.5"})  # quantities only under resources


def test_api_errors_surface_and_missing_objects_do_not() -> None:
    """A refused write is the refused pool's (a condition, and a retry kopf is asked for:
    tests/test_operator_isolation.py); a failed read stops the reconcile (kopf retries)."""
    api, reconciler = namespace()
    reconciler.reconcile()

    def refuse(*args: Any) -> Any:
        raise ApiError(403, "forbidden")

    api.edit("InferencePool", "chat", {"replicas": 5})
    api.apply = refuse  # type: ignore[method-assign]
    reconciler.reconcile()
    assert reconciler.retry_in() is not None
    conditions = api.objects["InferencePool", "chat"]["status"]["conditions"]
    degraded = next(item for item in conditions if item["type"] == "Degraded")
    assert degraded["reason"] == "ApplyFailed" and "403" in degraded["message"]
    api.list = refuse  # type: ignore[method-assign]
    with pytest.raises(ApiError, match="forbidden"):
        reconciler.reconcile()
    assert reconciler.refresh_pool_status("gone") == []


class ReadRecordingApi(FakeApi):
    """A FakeApi that remembers the name of every Secret it handed to the operator."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets_read: set[str] = set()

    def get(self, kind: Any, name: str) -> dict[str, Any] | None:
        body = super().get(kind, name)
        if body is not None and kind.kind == "Secret":
            self.secrets_read.add(name)
        return body

    def list(self, kind: Any, labels: Any = None) -> list[dict[str, Any]]:
        bodies = super().list(kind, labels)
        if kind.kind == "Secret":
            self.secrets_read |= {body["metadata"]["name"] for body in bodies}
        return bodies


def test_a_tenant_naming_an_unlabelled_secret_is_told_and_the_secret_never_read() -> None:
    api = ReadRecordingApi()
    api.put(pool("chat"))
    api.put(tenant("acme", 1, ["chat"]))
    api.put(secret("acme-keys", "sk-a"))
    api.put(tenant("mallory", 1, ["chat"]))
    api.objects["TenantQuota", "mallory"]["spec"]["apiKeySecretRef"] = {"name": "db-password"}
    api.put(secret("db-password", "correct-horse", labelled=False))  # someone else's Secret
    reconciler = Reconciler(api, CONFIG, clock())
    reconciler.reconcile()
    assert "db-password" not in api.secrets_read
    assert [t["tenant"] for t in gateway(api)["tenants"]] == ["acme"]
    assert key_digest("correct-horse") not in str(api.objects["Secret", "fairpool-gateway-config"])
    conditions = {
        c["type"]: c for c in api.objects["TenantQuota", "mallory"]["status"]["conditions"]
    }
    missing = conditions["SecretMissing"]
    assert (missing["status"], missing["reason"]) == ("True", "SecretNotFound")
    assert missing["message"] == (
        "spec.apiKeySecretRef: Secret 'db-password' not found in namespace serving among the "
        'Secrets labelled fairpool.io/api-keys: "true" (the operator reads API keys only from '
        "those)"
    )
    assert conditions["Ready"]["status"] == "False"

    # Labelled by whoever owns it, it becomes a key Secret like any other.
    api.objects["Secret", "db-password"]["metadata"]["labels"] = {"fairpool.io/api-keys": "true"}
    reconciler.reconcile()
    assert "db-password" in api.secrets_read
    assert [t["tenant"] for t in gateway(api)["tenants"]] == ["acme", "mallory"]


def test_missing_random_secrets_are_made_once_and_existing_ones_never_touched() -> None:
    generated = (GeneratedSecret("admin-token", "token", 48), GeneratedSecret("pw", "password", 40))
    config = dataclasses.replace(CONFIG, generated_secrets=generated)
    api = FakeApi()
    api.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pw"}, "data": {}})
    writes = Reconciler(api, config).reconcile()
    assert [w for w in writes if w.kind == "Secret" and w.name != config.gateway_secret] == [
        Write("create", "Secret", "admin-token")
    ]
    token = base64.b64decode(api.objects["Secret", "admin-token"]["data"]["token"]).decode()
    assert len(token) == 48 and token.isalnum()
    assert api.objects["Secret", "pw"]["data"] == {}  # someone's own: left as it is
    assert Reconciler(api, config).reconcile() == []
    other = FakeApi()
    Reconciler(other, config).reconcile()
    assert (
        other.objects["Secret", "admin-token"]["data"]
        != api.objects["Secret", "admin-token"]["data"]
    )


@pytest.mark.parametrize("text", ["a/b", "a/b/x", "a//48", "a/b/8", "a/b/999"])
def test_a_bad_generated_secret_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError, match="FAIRPOOL_GENERATED_SECRETS"):
        OperatorConfig.from_environment({"FAIRPOOL_GENERATED_SECRETS": text})


def test_events_tell_what_was_done_once_and_a_refusal_once() -> None:
    api, reconciler = namespace()
    reconciler.reconcile()
    by_object = {
        (e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"]) for e in api.events
    }
    assert ("InferencePool", "chat", "Created") in by_object
    assert ("TenantQuota", "acme", "InGatewayTable") in by_object
    created = [e["message"] for e in api.events if e["involvedObject"]["name"] == "chat"]
    assert "Created Deployment chat-engine" in created
    assert all(e["type"] == "Normal" for e in api.events)
    assert all(e["involvedObject"].get("uid") for e in api.events)  # on the very object
    api.events.clear()
    reconciler.reconcile()
    assert api.events == []  # nothing done, nothing told

    api.edit("InferencePool", "chat", {"replicas": 5})

    def refuse(body: Any) -> Any:
        raise ApiError(422, "Invalid")

    api.apply = refuse  # type: ignore[method-assign]
    reconciler.reconcile()
    reconciler.refusals = {
        key: dataclasses.replace(refusal, retry_at=0.0)
        for key, refusal in reconciler.refusals.items()
    }
    reconciler.reconcile()  # tried again, refused again: no second warning
    warnings = [e for e in api.events if e["type"] == "Warning"]
    assert [(e["reason"], e["involvedObject"]["name"]) for e in warnings] == [
        ("ApplyFailed", "chat")
    ]
    assert "422" in warnings[0]["message"]


def test_the_operator_counts_its_reconciles_writes_and_refusals() -> None:
    from prometheus_client import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {
        "ok": sample("fairpool_operator_reconciles_total", result="ok"),
        "error": sample("fairpool_operator_reconciles_total", result="error"),
        "created": sample("fairpool_operator_writes_total", verb="create", kind="Deployment"),
        "timed": sample("fairpool_operator_reconcile_seconds_count"),
    }
    api, reconciler = namespace()
    operator = Operator(reconciler)
    operator.reconcile()
    assert sample("fairpool_operator_reconciles_total", result="ok") == before["ok"] + 1
    created = sample("fairpool_operator_writes_total", verb="create", kind="Deployment")
    assert created == before["created"] + 2  # chat's and code's
    assert sample("fairpool_operator_reconcile_seconds_count") == before["timed"] + 1
    assert sample("fairpool_operator_refused_objects") == 0

    def refuse(*args: Any) -> Any:
        raise ApiError(503, "unavailable")

    api.list = refuse  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        operator.reconcile()
    assert sample("fairpool_operator_reconciles_total", result="error") == before["error"] + 1


# --- the fair order's tree: TenantGroups, groups of tenants, bands -------------------------------


def grouped(name: str, group_name: str | None, pools: list[str], **spec: Any) -> dict[str, Any]:
    body = tenant(name, 1, pools)
    if group_name is not None:
        body["spec"]["group"] = group_name
    body["spec"].update(spec)
    return body


def ready_condition(api: FakeApi, kind: str, name: str) -> dict[str, Any]:
    conditions = api.objects[kind, name]["status"]["conditions"]
    return next(c for c in conditions if c["type"] == "Ready")


def organisations() -> tuple[FakeApi, Reconciler]:
    """acme (two teams, three tenants) and globex (one batch tenant) sharing chat; code has
    one of acme's tenants."""
    api = FakeApi()
    for body in (
        pool("chat"),
        pool("code", scheduler={"bands": {"batch": {"minShare": 0.2}}}),
        group("acme", 3),
        group("support", 2, parent="acme"),
        group("research", 1, parent="acme"),
        group("globex"),
        grouped("chat-ui", "support", ["chat"], slo={"class": "interactive"}),
        grouped("tickets", "support", ["chat"]),
        grouped("papers", "research", ["chat", "code"]),
        grouped("jobs", "globex", ["chat"], slo={"class": "batch"}),
        *(
            secret(f"{name}-keys", f"sk-{name}")
            for name in ("chat-ui", "tickets", "papers", "jobs")
        ),
    ):
        api.put(body)
    return api, Reconciler(api, CONFIG, clock())


def test_groups_and_bands_reach_the_scheduler_configmaps_and_the_gateway() -> None:
    api, reconciler = organisations()
    reconciler.reconcile()
    chat = scheduler(api, "chat")
    assert chat["groups"] == {
        "acme": {"weight": 3.0},
        "globex": {"weight": 1.0},
        "research": {"weight": 1.0, "parent": "acme"},
        "support": {"weight": 2.0, "parent": "acme"},
    }
    assert chat["tenantGroups"] == {
        "chat-ui": "support",
        "tickets": "support",
        "papers": "research",
        "jobs": "globex",
    }
    assert chat["tenantBands"] == {"chat-ui": "interactive", "jobs": "batch"}  # not standard
    assert chat["bands"] == {"standard": {"minShare": 0.1}, "batch": {"minShare": 0.05}}
    code = scheduler(api, "code")  # only the groups on its one tenant's path
    assert code["groups"] == {
        "acme": {"weight": 3.0},
        "research": {"weight": 1.0, "parent": "acme"},
    }
    assert code["tenantGroups"] == {"papers": "research"} and "tenantBands" not in code
    assert code["bands"]["batch"] == {"minShare": 0.2}
    config = gateway(api)
    assert set(config["groups"]) == {"acme", "globex", "research", "support"}
    assert {t["tenant"]: t.get("group") for t in config["tenants"]} == chat["tenantGroups"]
    assert {p["name"]: p["bands"]["batch"]["minShare"] for p in config["pools"]} == {
        "chat": 0.05,
        "code": 0.2,
    }
    # the gateway's tree of a pool is the engines' tree of it
    parsed = GatewayConfig.model_validate(config)
    for name in ("chat", "code"):
        engines = parse_scheduler_config(scheduler(api, name)).weights()
        ours = parsed.shares(name)
        assert (ours.groups, ours.tenant_groups, ours.tenant_bands, ours.min_shares) == (
            engines.groups,
            engines.tenant_groups,
            engines.tenant_bands,
            engines.min_shares,
        )
        assert dict(ours) == dict(engines)
    for name in ("acme", "support", "research", "globex"):
        assert ready_condition(api, "TenantGroup", name)["status"] == "True"
    members = {
        name: api.objects["TenantGroup", name]["status"]["members"]
        for name in ("acme", "support", "research", "globex")
    }
    assert members == {
        "acme": {"groups": ["research", "support"], "tenants": []},
        "support": {"groups": [], "tenants": ["chat-ui", "tickets"]},
        "research": {"groups": [], "tenants": ["papers"]},
        "globex": {"groups": [], "tenants": ["jobs"]},
    }
    assert reconciler.reconcile() == []


def test_a_group_weight_change_rewrites_only_the_pools_with_its_tenants() -> None:
    api, reconciler = organisations()
    reconciler.reconcile()
    api.take_writes()
    api.edit("TenantGroup", "globex", {"weight": 4})  # its one tenant uses chat only
    reconciler.reconcile()
    assert sorted(api.take_writes()) == [
        ("apply", "ConfigMap", "chat-scheduler"),
        ("apply", "Secret", "fairpool-gateway-config"),
        ("status", "TenantGroup", "globex"),  # observedGeneration
    ]
    assert scheduler(api, "chat")["groups"]["globex"] == {"weight": 4.0}


def test_a_broken_tree_is_reported_on_the_groups_and_the_rest_keeps_serving() -> None:
    api, reconciler = organisations()
    reconciler.reconcile()
    api.take_writes()
    api.edit("TenantGroup", "acme", {"parent": "support"})  # acme → support → acme
    api.edit("TenantGroup", "globex", {"parent": "initech"})  # no such group
    api.edit("TenantQuota", "tickets", {"group": "helpdesk"})  # no such group either
    reconciler.reconcile()  # no exception
    cycle = ready_condition(api, "TenantGroup", "acme")
    assert (cycle["status"], cycle["reason"]) == ("False", "ParentCycle")
    assert cycle["message"].startswith("spec.parent: the groups acme → support → acme")
    assert ready_condition(api, "TenantGroup", "support")["reason"] == "ParentCycle"
    missing = ready_condition(api, "TenantGroup", "globex")
    assert (missing["status"], missing["reason"]) == ("False", "ParentNotFound")
    assert "no TenantGroup named 'initech'" in missing["message"]
    # the tree stays one: the broken groups are directly under their bands ...
    chat = scheduler(api, "chat")
    assert chat["groups"]["acme"] == {"weight": 3.0}
    assert chat["groups"]["support"] == {"weight": 2.0}
    assert chat["groups"]["globex"] == {"weight": 1.0}
    # ... and the tenant of a missing group too, still served, saying so
    assert "tickets" not in chat["tenantGroups"]
    tickets = ready_condition(api, "TenantQuota", "tickets")
    assert (
        tickets["status"] == "True"
        and "spec.group: TenantGroup 'helpdesk' not found" in (tickets["message"])
    )
    assert "tickets" in [t["tenant"] for t in gateway(api)["tenants"]]
    assert reconciler.reconcile() == []

    api.put(group("helpdesk", parent="acme"))  # the group comes: the tenant joins it
    api.edit("TenantGroup", "acme", {"parent": None})
    reconciler.reconcile()
    assert scheduler(api, "chat")["tenantGroups"]["tickets"] == "helpdesk"
    assert ready_condition(api, "TenantGroup", "acme")["status"] == "True"
    assert ready_condition(api, "TenantQuota", "tickets")["message"] == (
        "in the gateway's tenant table"
    )


def test_an_invalid_group_is_not_ready_and_its_members_stand_alone() -> None:
    api, reconciler = organisations()
    api.edit("TenantGroup", "research", {"weight": 0})
    api.put(group("lab", parent="research"))
    reconciler.reconcile()
    invalid = ready_condition(api, "TenantGroup", "research")
    assert (invalid["status"], invalid["reason"]) == ("False", "InvalidSpec")
    assert invalid["message"].startswith("spec.weight")
    lab = ready_condition(api, "TenantGroup", "lab")
    assert lab["reason"] == "ParentNotFound" and "'research' is invalid" in lab["message"]
    assert "research" not in scheduler(api, "code").get("groups", {})
    assert "papers" not in scheduler(api, "code").get("tenantGroups", {})


def test_group_shares_of_each_pool_are_written_from_the_gateways_numbers() -> None:
    api, reconciler = organisations()
    reconciler.reconcile()
    api.take_writes()
    report = {
        "chat-ui": Served(100, 60.0, {"chat": Served(100, 60.0)}),
        "tickets": Served(50, 20.0, {"chat": Served(50, 20.0)}),
        "papers": Served(30, 40.0, {"chat": Served(10, 10.0), "code": Served(20, 30.0)}),
        "jobs": Served(10, 10.0, {"chat": Served(10, 10.0)}),
    }
    reconciler.record_served(report)
    writes = api.take_writes()
    assert ("status", "TenantGroup", "acme") in writes
    assert ("status", "TenantGroup", "globex") in writes
    status = api.objects["TenantGroup", "acme"]["status"]
    assert status["pools"] == [
        {"pool": "chat", "servedTokens": 160, "servedService": 90.0, "share": 0.9},
        {"pool": "code", "servedTokens": 20, "servedService": 30.0, "share": 1.0},
    ]
    assert status["lastReported"]
    assert api.objects["TenantGroup", "support"]["status"]["pools"][0]["share"] == 0.8
    assert api.objects["TenantGroup", "globex"]["status"]["pools"][0] == {
        "pool": "chat",
        "servedTokens": 10,
        "servedService": 10.0,
        "share": 0.1,
    }
    reconciler.record_served(report)  # the same numbers: nothing written
    assert api.take_writes() == []
    assert reconciler.reconcile() == []  # the reconcile leaves them alone


class NoGroupsApi(FakeApi):
    """An API server without the TenantGroup CRD (an upgrade that has not applied it)."""

    def list(self, kind: Any, labels: Any = None) -> list[dict[str, Any]]:
        if kind.kind == "TenantGroup":
            raise ApiError(404, "the server could not find the requested resource")
        return super().list(kind, labels)


def test_without_the_tenantgroup_crd_everything_else_is_reconciled() -> None:
    api = NoGroupsApi()
    for body in (pool("chat"), grouped("acme", "org", ["chat"]), secret("acme-keys", "sk-a")):
        api.put(body)
    reconciler = Reconciler(api, CONFIG, clock())
    reconciler.reconcile()
    assert scheduler(api, "chat")["tenants"] == {"acme": 1.0}
    assert "org" in ready_condition(api, "TenantQuota", "acme")["message"]
    assert reconciler.record_served({"acme": Served(1, 1.0, {"chat": Served(1, 1.0)})})
