"""`cache.CachedApi`: the reconciler's reads of watched kinds from kopf's indexes, the rest
from the API server — and a cache that lags behind the server (a watch event not in yet)
costs at most a repeated write, never a wrong verdict."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from operator_fakes import FakeApi
from test_operator_reconcile import CONFIG, pool, secret, tenant

from fairpool_operator.api import DEPLOYMENT, POOL, SECRET
from fairpool_operator.cache import CachedApi
from fairpool_operator.reconcile import Reconciler

pytestmark = pytest.mark.unit

CACHED = ("InferencePool", "TenantQuota", "Deployment", "Service", "ConfigMap", "Pod")


class LiveIndex(Mapping[str, list[dict[str, Any]]]):
    """kopf's index of one kind, as a view of the fake server's objects (minus `hidden`:
    objects whose watch events have not arrived yet)."""

    def __init__(self, api: FakeApi, kind: str, hidden: set[tuple[str, str]]) -> None:
        self.api, self.kind, self.hidden = api, kind, hidden

    def __getitem__(self, key: str) -> list[dict[str, Any]]:
        if key != self.kind:
            raise KeyError(key)
        return [
            obj
            for (kind, name), obj in self.api.objects.items()
            if kind == self.kind and (kind, name) not in self.hidden
        ]

    def __iter__(self) -> Iterator[str]:
        return iter([self.kind])

    def __len__(self) -> int:
        return 1


class CountingApi(FakeApi):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, str]] = []

    def get(self, kind: Any, name: str) -> dict[str, Any] | None:
        self.reads.append(("get", kind.kind))
        return super().get(kind, name)

    def list(self, kind: Any, labels: Any = None) -> list[dict[str, Any]]:
        self.reads.append(("list", kind.kind))
        return super().list(kind, labels)


def cached(api: FakeApi, hidden: set[tuple[str, str]]) -> CachedApi:
    return CachedApi(api, {kind: LiveIndex(api, kind, hidden) for kind in CACHED})


def namespace() -> CountingApi:
    api = CountingApi()
    for body in (pool("chat"), tenant("acme", 1, ["chat"]), secret("acme-keys", "sk-a")):
        api.put(body)
    return api


def test_watched_kinds_are_read_from_the_indexes_and_the_rest_from_the_server():
    api = namespace()
    view = cached(api, set())
    assert view.get(POOL, "chat")["metadata"]["name"] == "chat"
    assert [body["metadata"]["name"] for body in view.list(POOL)] == ["chat"]
    assert view.list(POOL, {"team": "x"}) == []
    assert api.reads == []
    assert view.get(SECRET, "acme-keys") is not None  # Secrets: not watched (all of them)
    assert api.reads == [("get", "Secret")]
    body = view.get(POOL, "chat")
    body["spec"]["replicas"] = 99  # a copy: the index is not touched
    assert view.get(POOL, "chat")["spec"]["replicas"] != 99


def test_a_reconcile_through_the_cache_reads_no_watched_kind_from_the_server():
    api = namespace()
    Reconciler(cached(api, set()), CONFIG).reconcile()
    assert not [read for read in api.reads if read[1] in CACHED]
    assert ("Deployment", "chat-engine") in api.objects


def test_a_cache_that_has_not_seen_a_new_object_yet_still_converges():
    """The Deployment exists, its watch event is not in: the reconcile's create meets 409,
    reads the server, and finds it as planned: no Conflict, no refusal."""
    api = namespace()
    Reconciler(api, CONFIG).reconcile()
    api.take_writes()
    reconciler = Reconciler(cached(api, {("Deployment", "chat-engine")}), CONFIG)
    reconciler.reconcile()
    assert reconciler.refusals == {}
    conditions = api.objects["InferencePool", "chat"]["status"]["conditions"]
    degraded = next(item for item in conditions if item["type"] == "Degraded")
    assert degraded["status"] == "False", degraded
    assert [write for write in api.take_writes() if write[1] == "Deployment"] == []
    assert ("get", DEPLOYMENT.kind) in api.reads  # the one read that had to be fresh
