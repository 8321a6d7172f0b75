"""The operator under kopf's own runner (`kopf run` in a thread) against kmock made faithful
(tests/kmock_shim.py: resourceVersions, generations, the status subresource, watches that
resume): create → scale → tenant weight change → delete, then a restart that writes
nothing. kmock runs no controllers: the test plays the Deployment controller where status
from pods is checked, and the garbage collector does not exist (owner references are
checked instead)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import polling
import prometheus_client
import pytest
import yaml

pytest.importorskip("kopf", reason="kopf (the operator extra) runs the operator")
pytest.importorskip("kmock", reason="kmock (the dev extra) emulates the API")

import kmock
import kmock_shim
import kopf
from helpers import tenant_group
from kmock_shim import Refusal, faithful_kmock
from kopf.testing import KopfRunner

NS = "serving"
POOLS = "fairpool.io/v1alpha1/inferencepools"
TENANTS = "fairpool.io/v1alpha1/tenantquotas"
GROUPS = "fairpool.io/v1alpha1/tenantgroups"
KEY = "sk-acme-0001"
HANDLED = "kopf.fairpool.io/last-handled-configuration"

pytestmark = [
    pytest.mark.loopback,
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
]


def pool(name: str = "chat", replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": {"name": f"{name}-model"},
            "engine": {"kind": "sim", "sim": {"speedup": 4}},
            "replicas": replicas,
        },
    }


def tenant(name: str, weight: float, pools: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "TenantQuota",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"weight": weight, "pools": pools, "apiKeySecretRef": {"name": f"{name}-keys"}},
    }


def group(name: str, weight: float = 1, parent: str | None = None) -> dict[str, Any]:
    return tenant_group(name, weight, parent, namespace=NS)


def secret(name: str, key: str, labelled: bool = True) -> dict[str, Any]:
    """A key Secret (labelled `fairpool.io/api-keys: "true"` unless `labelled` is false)."""
    labels = {"fairpool.io/api-keys": "true"} if labelled else {}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "data": {"key": base64.b64encode(key.encode()).decode()},
    }


class Cluster:
    """The emulator, as a test sees it: objects by resource and name, requests by path."""

    def __init__(self, emulator: Any) -> None:
        self.k = emulator

    def get(self, resource: str, name: str) -> dict[str, Any] | None:
        try:
            obj = self.k.objects[resource, NS, name]
        except KeyError:
            return None
        return None if obj.deleted else dict(obj.raw)

    def writes(self, plural_path: str) -> int:
        """POSTs and PATCHes under a path (e.g. apps/v1 deployments), status included."""
        return len(self.k[f"post {plural_path}"]) + len(self.k[f"patch {plural_path}"])

    async def post(self, path: str, body: dict[str, Any]) -> None:
        await self.k.post(path, json=body)

    def gateway(self) -> dict[str, Any]:
        secret = self.get("v1/secrets", "fairpool-gateway-config")
        assert secret is not None
        return yaml.safe_load(base64.b64decode(secret["data"]["gateway.yaml"]))

    def scheduler(self, pool: str) -> dict[str, Any]:
        configmap = self.get("v1/configmaps", f"{pool}-scheduler")
        assert configmap is not None
        return yaml.safe_load(configmap["data"]["scheduler.yaml"])


def eventually(condition: Callable[[], object]) -> Awaitable[object]:
    """Until `condition` holds; an object not there yet (KeyError, TypeError on None, a
    failed assertion in a helper) counts as not yet."""
    return polling.eventually(
        condition, ignoring=(KeyError, TypeError, AssertionError), interval=0.05
    )


def operator_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.watching.client_timeout = 1.0  # watches end every second and resume
    settings.persistence.consistency_timeout = 1.0
    return settings


class Operator:
    """`kopf run -n serving -m fairpool_operator.handlers` in its own thread and loop; the
    emulator serves from the test's loop, which must never block."""

    def __init__(self) -> None:
        args = ["run", "--standalone", "-n", NS, "-m", "fairpool_operator.handlers"]
        self.runner = KopfRunner(args, settings=operator_settings(), timeout=30)

    async def __aenter__(self) -> KopfRunner:
        self.runner.__enter__()
        return self.runner

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.runner.__exit__, None, None, None)


@pytest.fixture
def cluster_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    kubeconfig = tmp_path / "kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    import kubernetes.config.kube_config

    # kopf's login reads the library's default location, fixed when it was imported.
    monkeypatch.setattr(
        kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig)
    )
    monkeypatch.setenv("FAIRPOOL_NAMESPACE", NS)
    monkeypatch.setenv("FAIRPOOL_ENGINE_SIM_IMAGE", "registry.example/fairpool-engine-sim:test")
    monkeypatch.delenv("FAIRPOOL_GATEWAY_ADMIN_URL", raising=False)
    return kubeconfig


def write_kubeconfig(path: Path, url: str) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: kmock\n"
        f"clusters: [{{name: kmock, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: operator, user: {token: not-a-real-token}}]\n"
        "contexts: [{name: kmock, context: {cluster: kmock, user: operator}}]\n"
    )


def test_create_scale_reweigh_delete_and_restart(cluster_env: Path) -> None:
    async def scenario() -> list[str]:
        async with faithful_kmock() as emulator:
            write_kubeconfig(cluster_env, str(emulator.url).rstrip("/"))
            k = Cluster(emulator)
            base = f"/apis/fairpool.io/v1alpha1/namespaces/{NS}"
            await k.post(f"/api/v1/namespaces/{NS}/secrets", secret("acme-keys", KEY))
            await k.post(f"{base}/inferencepools", pool(replicas=2))
            outputs = []

            async with Operator() as runner:
                # create: the pool's objects appear, owned by the pool ...
                await eventually(lambda: k.get("apps/v1/deployments", "chat-engine"))
                await eventually(lambda: k.get("v1/services", "chat-engine"))
                await eventually(lambda: k.get("v1/configmaps", "chat-scheduler"))
                uid = k.get(POOLS, "chat")["metadata"]["uid"]
                for resource, name in [
                    ("apps/v1/deployments", "chat-engine"),
                    ("v1/services", "chat-engine"),
                    ("v1/configmaps", "chat-scheduler"),
                ]:
                    owner = k.get(resource, name)["metadata"]["ownerReferences"][0]
                    assert (owner["kind"], owner["name"], owner["uid"]) == (
                        "InferencePool",
                        "chat",
                        uid,
                    )
                deployment = k.get("apps/v1/deployments", "chat-engine")
                assert deployment["spec"]["replicas"] == 2
                container = deployment["spec"]["template"]["spec"]["containers"][0]
                assert container["image"] == "registry.example/fairpool-engine-sim:test"
                await eventually(lambda: k.gateway()["pools"][0]["name"] == "chat")
                await eventually(lambda: k.get(POOLS, "chat")["status"]["conditions"])

                # ... and a tenant created later joins the gateway and the scheduler.
                await k.post(f"{base}/tenantquotas", tenant("acme", 1, ["chat"]))
                await eventually(lambda: k.scheduler("chat")["tenants"] == {"acme": 1.0})
                await eventually(lambda: [t["tenant"] for t in k.gateway()["tenants"]] == ["acme"])
                digest = k.gateway()["tenants"][0]["apiKeySha256"]
                assert KEY not in str(k.get("v1/secrets", "fairpool-gateway-config"))
                assert len(digest) == 1 and len(digest[0]) == 64
                await eventually(lambda: ready(k.get(TENANTS, "acme")) == "True")

                # scale: the Deployment is patched; the ConfigMap is not rewritten.
                configmap_writes = k.writes(f"/api/v1/namespaces/{NS}/configmaps")
                await emulator.patch(f"{base}/inferencepools/chat", json={"spec": {"replicas": 3}})
                await eventually(
                    lambda: k.get("apps/v1/deployments", "chat-engine")["spec"]["replicas"] == 3
                )
                await eventually(lambda: k.get(POOLS, "chat")["status"]["observedGeneration"] == 2)
                assert k.writes(f"/api/v1/namespaces/{NS}/configmaps") == configmap_writes

                # the Deployment's pods come up (the test plays the controller): status follows.
                await k.post(
                    f"/api/v1/namespaces/{NS}/pods", engine_pod("chat-engine-a", "10.1.0.7")
                )
                await emulator.patch(
                    f"/apis/apps/v1/namespaces/{NS}/deployments/chat-engine/status",
                    json={
                        "status": {
                            "replicas": 3,
                            "readyReplicas": 1,
                            "updatedReplicas": 3,
                            "observedGeneration": 2,
                        }
                    },
                )
                await eventually(lambda: k.get(POOLS, "chat")["status"]["readyReplicas"] == 1)
                status = k.get(POOLS, "chat")["status"]
                assert status["endpoints"] == [
                    {"pod": "chat-engine-a", "address": "http://10.1.0.7:8000", "ready": True}
                ]
                assert ready(k.get(POOLS, "chat")) == "False"  # 1 of 3

                # weight change: scheduler ConfigMap and gateway Secret, the engines untouched.
                deployment_writes = k.writes(f"/apis/apps/v1/namespaces/{NS}/deployments")
                deployment_version = k.get("apps/v1/deployments", "chat-engine")["metadata"]
                await emulator.patch(f"{base}/tenantquotas/acme", json={"spec": {"weight": 3}})
                await eventually(lambda: k.scheduler("chat")["tenants"] == {"acme": 3.0})
                await eventually(lambda: k.gateway()["tenants"][0]["weight"] == 3.0)
                assert k.writes(f"/apis/apps/v1/namespaces/{NS}/deployments") == deployment_writes
                assert (
                    k.get("apps/v1/deployments", "chat-engine")["metadata"]["resourceVersion"]
                    == deployment_version["resourceVersion"]
                )

                # delete: the gateway forgets the pool; the tenant says why it is not ready.
                await emulator.delete(f"{base}/inferencepools/chat")
                await eventually(lambda: k.gateway()["pools"] == [])
                assert k.gateway()["tenants"] == []
                await eventually(lambda: reason(k.get(TENANTS, "acme")) == "PoolNotFound")
                # the watches end every second and resume from where they were ...
                await eventually(lambda: resumed_watches(emulator) >= {POOLS, TENANTS})
            outputs.append(runner.output)
            assert runner.exit_code == 0 and runner.exception is None
            # Secrets are listed and watched by the key label only: no other is ever read.
            collection = f"/api/v1/namespaces/{NS}/secrets"
            reads = [r for r in emulator["get"] if r.url.path == collection]
            assert {r.params.get("watch") for r in reads} >= {None, "true"}  # lists and watches
            assert {r.params.get("labelSelector") for r in reads} == {"fairpool.io/api-keys=true"}
            # ... and nothing was handled twice (one Deployment created, patched once).
            assert len(emulator[f"post /apis/apps/v1/namespaces/{NS}/deployments"]) == 1

            # restart with nothing changed: the resumed reconcile writes nothing.
            await k.post(f"{base}/inferencepools", pool("chat", replicas=1))
            async with Operator() as runner:
                await eventually(lambda: k.scheduler("chat")["tenants"] == {"acme": 3.0})
                await eventually(lambda: ready(k.get(TENANTS, "acme")) == "True")
                await eventually(lambda: HANDLED in k.get(POOLS, "chat")["metadata"]["annotations"])
            before, since = total_writes(emulator), last_request(emulator)
            with kopf_log() as log:
                async with Operator() as runner:
                    # Everything this start does is done: the resume of the pool and of
                    # the tenant (their handling cycles finished, kopf's own patches
                    # included), the first look at each child and secret, the tenant's
                    # first timer; and the watches ended and resumed once.
                    for kind, name, message in [
                        ("InferencePool", "chat", "Handling cycle is finished"),
                        ("TenantQuota", "acme", "Handling cycle is finished"),
                        ("Deployment", "chat-engine", "Handler 'child_changed' succeeded"),
                        ("Service", "chat-engine", "Handler 'child_changed' succeeded"),
                        ("ConfigMap", "chat-scheduler", "Handler 'child_changed' succeeded"),
                        ("Secret", "acme-keys", "Handler 'key_secret_changed' succeeded"),
                        ("TenantQuota", "acme", "Timer 'tenant_timer' succeeded"),
                    ]:
                        await eventually(lambda line=(kind, name, message): log.saw(*line))
                    await eventually(lambda: resumed_watches(emulator, since) >= {POOLS, TENANTS})
                    assert total_writes(emulator) == before, recent_writes(
                        emulator, total_writes(emulator) - before
                    )
            outputs.append(runner.output)
        return outputs

    outputs = asyncio.run(scenario())
    assert "Traceback" not in "".join(outputs)


def engine_pod(name: str, ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            # as the Deployment's template labels them (contract.engine_labels)
            "labels": {
                "fairpool.io/pool": "chat",
                "app.kubernetes.io/name": "fairpool-engine",
                "app.kubernetes.io/instance": "chat",
                "app.kubernetes.io/managed-by": "fairpool-operator",
            },
        },
        "status": {
            "podIP": ip,
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def ready(obj: dict[str, Any] | None) -> str | None:
    return condition(obj, "Ready").get("status")


def reason(obj: dict[str, Any] | None) -> str | None:
    return condition(obj, "Ready").get("reason")


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for item in ((obj or {}).get("status") or {}).get("conditions", []):
        if item["type"] == kind:
            return item
    return {}


class KopfLog(logging.Handler):
    """kopf's log lines about objects, as (kind, name, message), as they are written."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        ref = getattr(record, "k8s_ref", None) or {}
        self.lines.append((ref.get("kind"), ref.get("name"), record.getMessage()))

    def saw(self, kind: str, name: str, start: str) -> bool:
        return any(line[:2] == (kind, name) and line[2].startswith(start) for line in self.lines)


@contextlib.contextmanager
def kopf_log() -> Iterator[KopfLog]:
    """kopf's per-object log, debug lines included, for the block."""
    logger = logging.getLogger("kopf.objects")
    handler, level = KopfLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def last_request(emulator: Any) -> int:
    return max((request.id for request in emulator[kmock.action.WATCH]), default=-1)


def resumed_watches(emulator: Any, since: int = -1) -> set[str]:
    """The resources (group/version/plural) whose watch resumed from a resourceVersion in
    a request after request `since`."""
    resumed = set()
    for request in emulator[kmock.action.WATCH]:
        if request.id > since and request.params.get("resourceVersion"):
            parts = request.url.path.strip("/").split("/")
            resumed.add("/".join([*parts[1:3], parts[-1]]))
    return resumed


def total_writes(emulator: Any) -> int:
    return len(emulator["post"]) + len(emulator["patch"]) + len(emulator["delete"])


def recent_writes(emulator: Any, count: int) -> list[str]:
    writes = [r for verb in ("post", "patch", "delete") for r in emulator[verb]]
    writes.sort(key=lambda r: r.id)
    return [f"{r.method.name} {r.url.path} {r.data}" for r in writes[-count:]]


def test_reconciles_read_the_operators_objects_from_its_watches(cluster_env: Path) -> None:
    """Once running, a reconcile reads pools, tenants and the pools' objects from kopf's
    indexes (what the watches already brought), not with a request per read."""

    async def scenario() -> None:
        async with faithful_kmock() as emulator:
            write_kubeconfig(cluster_env, str(emulator.url).rstrip("/"))
            k = Cluster(emulator)
            base = f"/apis/fairpool.io/v1alpha1/namespaces/{NS}"
            deployment = f"get /apis/apps/v1/namespaces/{NS}/deployments/chat-engine"
            await k.post(f"/api/v1/namespaces/{NS}/secrets", secret("acme-keys", KEY))
            await k.post(f"{base}/inferencepools", pool())
            async with Operator():
                await eventually(lambda: k.get("apps/v1/deployments", "chat-engine"))
                await eventually(lambda: k.get(POOLS, "chat")["status"]["conditions"])
                before = len(emulator[deployment])
                await k.post(f"{base}/tenantquotas", tenant("acme", 1, ["chat"]))
                await eventually(lambda: k.scheduler("chat")["tenants"] == {"acme": 1.0})
                await eventually(lambda: [t["tenant"] for t in k.gateway()["tenants"]] == ["acme"])
                assert len(emulator[deployment]) == before  # the reconciles read it cached

    asyncio.run(scenario())


def test_tenant_groups_join_the_tree_and_say_what_is_under_them(cluster_env: Path) -> None:
    """A TenantGroup and a TenantQuota in it (an interactive one): the scheduler ConfigMap
    and the gateway's configuration carry the tree, the group's status its members; a
    group under one that does not exist says so; a group's weight change and its deletion
    reach the ConfigMap."""

    async def scenario() -> list[str]:
        async with faithful_kmock() as emulator:
            write_kubeconfig(cluster_env, str(emulator.url).rstrip("/"))
            k = Cluster(emulator)
            base = f"/apis/fairpool.io/v1alpha1/namespaces/{NS}"
            await k.post(f"/api/v1/namespaces/{NS}/secrets", secret("acme-keys", KEY))
            await k.post(f"{base}/inferencepools", pool())
            await k.post(f"{base}/tenantgroups", group("org", 2))
            member = tenant("acme", 1, ["chat"])
            member["spec"].update({"group": "org", "slo": {"class": "interactive"}})
            await k.post(f"{base}/tenantquotas", member)
            async with Operator() as runner:
                await eventually(lambda: k.scheduler("chat")["tenantGroups"] == {"acme": "org"})
                assert k.scheduler("chat")["groups"] == {"org": {"weight": 2.0}}
                assert k.scheduler("chat")["tenantBands"] == {"acme": "interactive"}
                await eventually(lambda: k.gateway()["groups"] == {"org": {"weight": 2.0}})
                assert k.gateway()["tenants"][0]["group"] == "org"
                await eventually(lambda: ready(k.get(GROUPS, "org")) == "True")
                members = k.get(GROUPS, "org")["status"]["members"]
                assert members == {"groups": [], "tenants": ["acme"]}

                await k.post(f"{base}/tenantgroups", group("team", parent="nowhere"))
                await eventually(lambda: reason(k.get(GROUPS, "team")) == "ParentNotFound")
                message = condition(k.get(GROUPS, "team"), "Ready")["message"]
                assert message.startswith("spec.parent: no TenantGroup named 'nowhere'")

                await emulator.patch(f"{base}/tenantgroups/org", json={"spec": {"weight": 5}})
                await eventually(lambda: k.scheduler("chat")["groups"] == {"org": {"weight": 5.0}})

                await emulator.delete(f"{base}/tenantgroups/org")
                await eventually(lambda: "tenantGroups" not in k.scheduler("chat"))
                await eventually(
                    lambda: "spec.group" in condition(k.get(TENANTS, "acme"), "Ready")["message"]
                )
                assert ready(k.get(TENANTS, "acme")) == "True"  # still served
            return [runner.output]

    outputs = asyncio.run(scenario())
    assert "Traceback" not in "".join(outputs)


def test_without_the_tenantgroup_crd_the_operator_runs_as_before(
    cluster_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade whose new CRD is not applied yet: the API server does not serve
    TenantGroups, and pools and tenants are reconciled all the same (at start, and from
    kopf's handlers after a change)."""
    monkeypatch.delitem(kmock_shim.CRDS, GROUPS)

    async def scenario() -> list[str]:
        async with faithful_kmock() as emulator:
            write_kubeconfig(cluster_env, str(emulator.url).rstrip("/"))
            k = Cluster(emulator)
            base = f"/apis/fairpool.io/v1alpha1/namespaces/{NS}"
            await k.post(f"/api/v1/namespaces/{NS}/secrets", secret("acme-keys", KEY))
            await k.post(f"{base}/inferencepools", pool())
            await k.post(f"{base}/tenantquotas", tenant("acme", 1, ["chat"]))
            async with Operator() as runner:
                await eventually(lambda: k.scheduler("chat")["tenants"] == {"acme": 1.0})
                await eventually(lambda: ready(k.get(TENANTS, "acme")) == "True")
                await emulator.patch(f"{base}/tenantquotas/acme", json={"spec": {"weight": 3}})
                await eventually(lambda: k.scheduler("chat")["tenants"] == {"acme": 3.0})
            return [runner.output]

    outputs = asyncio.run(scenario())
    assert "Traceback" not in "".join(outputs)


def condition_of(body: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    conditions = (body or {}).get("status", {}).get("conditions", [])
    return next(item for item in conditions if item["type"] == kind)


def test_a_pool_the_api_server_refuses_leaves_the_others_and_the_gateway_in_effect(
    cluster_env: Path,
) -> None:
    """Fault injection: the API server refuses one pool's Deployment (a ResourceQuota's 403).
    The other pool and the gateway's table (the tenant, both pools) still come into effect,
    the refused pool says why, and once the quota allows it the retry creates it."""

    async def scenario() -> list[str]:
        async with faithful_kmock() as emulator:
            quota = 'deployments "beta-engine" is forbidden: exceeded quota: gpus'
            emulator.refused["deployments", "beta-engine"] = Refusal(message=quota)
            write_kubeconfig(cluster_env, str(emulator.url).rstrip("/"))
            k = Cluster(emulator)
            base = f"/apis/fairpool.io/v1alpha1/namespaces/{NS}"
            await k.post(f"/api/v1/namespaces/{NS}/secrets", secret("acme-keys", KEY))
            for name in ("alpha", "beta"):
                await k.post(f"{base}/inferencepools", pool(name))
            await k.post(f"{base}/tenantquotas", tenant("acme", 1, ["alpha", "beta"]))
            async with Operator() as runner:
                await eventually(lambda: k.get("apps/v1/deployments", "alpha-engine"))
                await eventually(
                    lambda: [entry["name"] for entry in k.gateway()["pools"]] == ["alpha", "beta"]
                )
                await eventually(lambda: [t["tenant"] for t in k.gateway()["tenants"]] == ["acme"])
                await eventually(
                    lambda: (
                        condition_of(k.get(POOLS, "beta"), "Degraded")["reason"] == "ApplyFailed"
                    )
                )
                message = condition_of(k.get(POOLS, "beta"), "Degraded")["message"]
                assert "Deployment beta-engine" in message and "exceeded quota" in message
                assert k.get("apps/v1/deployments", "beta-engine") is None
                assert condition_of(k.get(POOLS, "alpha"), "Degraded")["status"] == "False"
                assert k.get("v1/configmaps", "beta-scheduler")  # the pool's other objects

                del emulator.refused["deployments", "beta-engine"]  # the quota is raised
                await eventually(lambda: k.get("apps/v1/deployments", "beta-engine"))
                await eventually(
                    lambda: condition_of(k.get(POOLS, "beta"), "Degraded")["status"] == "False"
                )
            return [runner.output]

    outputs = asyncio.run(scenario())
    assert "Traceback" not in "".join(outputs)


# --- the handlers as plain functions, and `fairpool operator` ------------------------------------


def test_handlers_are_plain_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    from operator_fakes import FakeApi

    from fairpool_operator import handlers
    from fairpool_operator.api import ApiError
    from fairpool_operator.config import OperatorConfig

    api = FakeApi(NS)
    api.put(pool(replicas=1))
    api.put(tenant("acme", 1, ["chat"]))
    api.put(secret("acme-keys", KEY))
    monkeypatch.setattr(handlers, "KubernetesApi", lambda namespace: api)
    settings = kopf.OperatorSettings()
    memo = kopf.Memo(config=OperatorConfig(namespace=NS))

    handlers.start(settings=settings, memo=memo)  # configures kopf, reconciles once
    assert settings.scanning.disabled is True
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.finalizer == "fairpool.io/kopf-finalizer"
    secrets = kopf.Resource("", "v1", "secrets", namespaced=True)
    assert list(settings.watching.label_selectors.collect(secrets)) == ["fairpool.io/api-keys=true"]
    created = {(kind, name) for verb, kind, name in api.take_writes() if verb == "create"}
    assert ("Secret", "fairpool-gateway-config") in created and len(created) == 5

    handlers.pool_changed(memo=memo)  # nothing changed: nothing written
    handlers.tenant_changed(memo=memo)
    handlers.deleted(type="MODIFIED", memo=memo)
    assert api.take_writes() == []

    api.edit("InferencePool", "chat", {"replicas": 3})
    handlers.pool_changed(memo=memo)
    assert ("apply", "Deployment", "chat-engine") in api.take_writes()

    assert handlers._referenced(name="acme-keys", memo=memo)
    assert not handlers._referenced(name="fairpool-gateway-config", memo=memo)

    api.objects["Deployment", "chat-engine"]["status"] = {"replicas": 3, "readyReplicas": 3}
    labels = {"fairpool.io/pool": "chat"}
    handlers.child_changed(type="MODIFIED", body={"kind": "Deployment"}, labels=labels, memo=memo)
    assert api.take_writes() == [("status", "InferencePool", "chat")]
    del api.objects["ConfigMap", "chat-scheduler"]
    handlers.child_changed(type="DELETED", body={"kind": "ConfigMap"}, labels=labels, memo=memo)
    assert api.take_writes() == [("create", "ConfigMap", "chat-scheduler")]
    handlers.tenant_timer(memo=memo)  # no gateway admin URL; a reconcile ran just now
    assert api.take_writes() == []

    def unavailable(*args: object) -> None:
        raise ApiError(503, "the API server is restarting")

    api.objects["ConfigMap", "chat-scheduler"]["data"] = {"scheduler.yaml": "edited: true"}
    handlers.child_changed(type="MODIFIED", body={"kind": "ConfigMap"}, labels=labels, memo=memo)
    assert api.take_writes() == [("apply", "ConfigMap", "chat-scheduler")]  # an edit reverted

    api.objects["Secret", "fairpool-gateway-config"]["data"] = {}  # nobody tells the operator
    assert memo.operator.resync(max_age=0.0) is not None
    assert ("apply", "Secret", "fairpool-gateway-config") in api.take_writes()

    monkeypatch.setattr(api, "list", unavailable)
    with pytest.raises(kopf.TemporaryError, match="503"):
        handlers.tenant_changed(memo=memo)
    handlers.stop(memo=memo)
    assert not memo.resync._thread.is_alive()


def test_fairpool_operator_runs_kopf_for_one_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    from fairpool_cli.main import main

    calls: list[dict[str, Any]] = []
    configured: list[dict[str, Any]] = []
    served: list[int] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(kopf, "configure", lambda **kwargs: configured.append(kwargs))
    monkeypatch.setattr(prometheus_client, "start_http_server", served.append)
    monkeypatch.setenv("FAIRPOOL_NAMESPACE", "from-env")
    monkeypatch.setenv("POD_IP", "10.0.0.5")
    liveness = "http://0.0.0.0:8080/healthz"
    assert main(["operator", "--liveness", liveness]) == 0
    assert main(["operator", "--namespace", "ns", "--standalone", "--priority", "7"]) == 0
    first, second = calls
    assert first["namespaces"] == ["from-env"] and first["memo"]["config"].namespace == "from-env"
    assert (first["peering_name"], first["standalone"]) == ("fairpool", False)
    assert first["priority"] == 1 + (10 << 24 | 5) and first["liveness_endpoint"] == liveness
    assert (second["namespaces"], second["peering_name"], second["priority"]) == (["ns"], None, 7)
    assert configured[-1]["log_format"] == kopf.LogFormat.PLAIN and served == []
    assert main(["operator", "--log-format", "json", "--metrics-port", "9090"]) == 0
    assert configured[-1]["log_format"] == kopf.LogFormat.JSON and served == [9090]
    assert main(["operator", "--metrics-port", "0"]) == 2  # refused, naming the option
    from fairpool_operator import handlers

    watched: list[bool] = []
    monkeypatch.setattr(handlers, "watch_nodes", lambda: watched.append(True))
    assert main(["operator"]) == 0 and watched == []  # Nodes only where RBAC lets it read them
    monkeypatch.setenv("FAIRPOOL_WATCH_NODES", "true")
    assert main(["operator"]) == 0 and watched == [True]


def test_a_placement_pool_becomes_chains_whose_stage_0_pods_make_it_ready(
    cluster_env: Path,
) -> None:
    """Without the LeaderWorkerSet API the chains are StatefulSets; the gateway lists them;
    a chain's stage-0 pod becoming ready (a pod event) shows in the pool's status."""
    body = yaml.safe_load((Path(__file__).parent.parent / "examples" / "pipeline.yaml").read_text())
    body["metadata"]["namespace"] = NS
    body["spec"]["placement"]["workload"]["arrivalRate"] = 1.0  # one chain of three H100s

    async def scenario() -> str:
        async with faithful_kmock() as emulator:
            write_kubeconfig(cluster_env, str(emulator.url).rstrip("/"))
            k = Cluster(emulator)
            await k.post(f"/apis/fairpool.io/v1alpha1/namespaces/{NS}/inferencepools", body)
            async with Operator() as runner:
                for stage in range(3):
                    name = f"llama-70b-chain-0-s{stage}"
                    await eventually(lambda name=name: k.get("apps/v1/statefulsets", name))
                await eventually(lambda: k.get("v1/services", "llama-70b-chain-0-head"))
                await eventually(lambda: k.gateway()["pools"][0]["chains"][0]["name"] == "chain-0")
                await eventually(lambda: k.get(POOLS, "llama-70b")["status"]["placement"])
                placement = k.get(POOLS, "llama-70b")["status"]["placement"]
                assert placement["chains"][0]["layerPartition"] == "27,27,26"
                pod = engine_pod("llama-70b-chain-0-s0-0", "10.1.0.9")
                pod["metadata"]["labels"] = {
                    "fairpool.io/pool": "llama-70b",
                    "app.kubernetes.io/managed-by": "fairpool-operator",
                    "fairpool.io/chain": "chain-0",
                    "fairpool.io/stage": "0",
                }
                await k.post(f"/api/v1/namespaces/{NS}/pods", pod)
                await eventually(lambda: k.get(POOLS, "llama-70b")["status"]["readyReplicas"] == 1)
                assert ready(k.get(POOLS, "llama-70b")) == "True"
            assert runner.exit_code == 0 and runner.exception is None
            return str(runner.output)

    output = asyncio.run(scenario())
    assert "Traceback" not in output and "chains as StatefulSets" in output
