"""One pool's object refused by the API server (a 422, an admission policy, a ResourceQuota)
stops neither the other pools nor the gateway's Secret; the pool says why, and the object is
tried again after a delay that doubles per refusal — at once when its rendering changes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from operator_fakes import FakeApi
from test_operator_reconcile import CONFIG, gateway, pool, secret, tenant

from fairpool_operator.api import POOL, ApiError
from fairpool_operator.reconcile import RETRY_FIRST, RETRY_LAST, Reconciler

pytestmark = pytest.mark.unit


class RefusingApi(FakeApi):
    """The fake API server, refusing writes of the objects in `refused`."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: dict[tuple[str, str], ApiError] = {}
        self.attempts: list[tuple[str, str]] = []

    def create(self, body: Any) -> dict[str, Any]:
        self._check(body)
        return super().create(body)

    def apply(self, body: Any) -> dict[str, Any]:
        self._check(body)
        return super().apply(body)

    def _check(self, body: Any) -> None:
        key = (body["kind"], body["metadata"]["name"])
        self.attempts.append(key)
        if key in self.refused:
            raise self.refused[key]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def namespace() -> tuple[RefusingApi, Reconciler, Clock]:
    api = RefusingApi()
    for name in ("alpha", "beta"):
        api.put(pool(name))
    api.put(tenant("acme", 1, ["alpha", "beta"]))
    api.put(secret("acme-keys", "sk-acme"))
    clock = Clock()
    reconciler = Reconciler(api, CONFIG, clock=lambda: "2026-11-28T00:00:00Z", monotonic=clock)
    return api, reconciler, clock


def degraded(api: FakeApi, name: str) -> dict[str, Any]:
    conditions = api.objects["InferencePool", name]["status"]["conditions"]
    return next(item for item in conditions if item["type"] == "Degraded")


def gateway_pools(api: FakeApi) -> list[str]:
    return [entry["name"] for entry in gateway(api)["pools"]]


QUOTA = ApiError(403, 'deployments "beta-engine" is forbidden: exceeded quota: gpus')


def test_a_refused_deployment_leaves_the_other_pool_and_the_gateway_in_effect():
    api, reconciler, _ = namespace()
    api.refused["Deployment", "beta-engine"] = QUOTA
    reconciler.reconcile()
    assert ("Deployment", "alpha-engine") in api.objects
    assert ("ConfigMap", "beta-scheduler") in api.objects  # the pool's other objects too
    assert ("Deployment", "beta-engine") not in api.objects
    assert gateway_pools(api) == ["alpha", "beta"]
    beta = degraded(api, "beta")
    assert (beta["status"], beta["reason"]) == ("True", "ApplyFailed")
    assert "Deployment beta-engine" in beta["message"] and "exceeded quota" in beta["message"]
    assert degraded(api, "alpha")["status"] == "False"
    assert reconciler.retry_in() == RETRY_FIRST


def test_a_refused_object_waits_a_doubling_delay_then_clears_when_accepted():
    api, reconciler, clock = namespace()
    api.refused["Deployment", "beta-engine"] = QUOTA
    reconciler.reconcile()
    delays = []
    for _ in range(7):
        api.attempts.clear()
        reconciler.reconcile()  # within the delay: not tried
        assert ("Deployment", "beta-engine") not in api.attempts
        delay = reconciler.retry_in()
        assert delay is not None
        delays.append(delay)
        clock.now += delay
        reconciler.reconcile()
    assert delays == [min(RETRY_FIRST * 2**n, RETRY_LAST) for n in range(7)]
    assert reconciler.refresh_pool_status("beta") == []  # a pod event keeps the condition
    assert degraded(api, "beta")["reason"] == "ApplyFailed"

    del api.refused["Deployment", "beta-engine"]
    clock.now += RETRY_LAST
    reconciler.reconcile()
    assert ("Deployment", "beta-engine") in api.objects
    assert degraded(api, "beta")["status"] == "False"
    assert reconciler.retry_in() is None


def test_a_spec_change_is_tried_at_once_and_a_deleted_pool_forgotten():
    api, reconciler, _ = namespace()
    api.refused["Deployment", "beta-engine"] = ApiError(422, "spec.replicas: Invalid value")
    reconciler.reconcile()
    api.attempts.clear()
    api.edit("InferencePool", "beta", {"replicas": 3})
    reconciler.reconcile()
    assert ("Deployment", "beta-engine") in api.attempts
    api.delete(POOL, "beta")
    reconciler.reconcile()
    assert reconciler.retry_in() is None and gateway_pools(api) == ["alpha"]


OBJECTS = [
    (kind, f"{pool_name}-{suffix}")
    for pool_name in ("alpha", "beta")
    for kind, suffix in (
        ("ConfigMap", "scheduler"),
        ("Service", "engine"),
        ("Deployment", "engine"),
    )
]


@given(st.sets(st.sampled_from(OBJECTS)), st.sampled_from([403, 409, 422, 500, 0]))
def test_whatever_is_refused_the_rest_is_in_effect_and_each_refusal_on_its_pool(refused, status):
    api, reconciler, _ = namespace()
    for key in refused:
        api.refused[key] = ApiError(status, "no")
    reconciler.reconcile()
    for key in OBJECTS:
        assert (key in api.objects) == (key not in refused), key
    assert gateway_pools(api) == ["alpha", "beta"]
    tenant_ready = api.objects["TenantQuota", "acme"]["status"]["conditions"][0]
    assert tenant_ready["status"] == "True"
    for name in ("alpha", "beta"):
        mine = [key for key in refused if key[1].startswith(f"{name}-")]
        condition = degraded(api, name)
        assert (condition["reason"] == "ApplyFailed") == bool(mine), (name, condition)


def test_a_pool_whose_status_cannot_be_written_delays_nobody_and_is_retried():
    api, reconciler, _ = namespace()
    written = api.patch_status

    def refuse_alpha(kind: Any, name: str, status: Any) -> Any:
        if name == "alpha":
            raise ApiError(500, "etcd leader changed")
        return written(kind, name, status)

    api.patch_status = refuse_alpha  # type: ignore[method-assign]
    with pytest.raises(ApiError, match="etcd"):  # kopf retries the handler after a delay
        reconciler.reconcile()
    assert ("Deployment", "beta-engine") in api.objects
    assert "conditions" in api.objects["InferencePool", "beta"].get("status", {})
    assert gateway_pools(api) == ["alpha", "beta"]
    assert api.objects["TenantQuota", "acme"]["status"]["conditions"][0]["status"] == "True"
