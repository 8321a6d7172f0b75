"""Reads from what the operator already watches, instead of a request per read.

kopf keeps an index per watched resource (`handlers.cached_*`): every object of the kind as
its last watch event showed it, filled by the initial listing before any handler runs.
`CachedApi` answers the reconciler's `get` and `list` of those kinds from them and sends
everything else — writes, and reads of kinds nobody watches (the gateway's and model
Secrets, Nodes) — to the API server. A read that must be current (after a create that
conflicted) goes to the server: `fresh`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from fairpool_operator.api import Api, Kind, Objects, matches

#: kind -> the objects of that kind, as kopf's index holds them (a Store of bodies).
Indexes = Mapping[str, Mapping[str, Iterable[Mapping[str, Any]]]]


class CachedApi:
    """`Api` with the reads of the indexed kinds served from kopf's indexes."""

    def __init__(self, base: Api, indexes: Indexes) -> None:
        self.base = base
        self.namespace = base.namespace
        self.indexes = indexes

    def _objects(self, kind: Kind) -> list[Mapping[str, Any]] | None:
        index = self.indexes.get(kind.kind)
        if index is None:
            return None
        return list(index.get(kind.kind, ()))

    def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        objects = self._objects(kind)
        if objects is None:
            return self.base.get(kind, name)
        for obj in objects:
            if obj.get("metadata", {}).get("name") == name:
                return copy.deepcopy(dict(obj))
        return None

    def list(self, kind: Kind, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        objects = self._objects(kind)
        if objects is None:
            return self.base.list(kind, labels)
        found = [copy.deepcopy(dict(obj)) for obj in objects if matches(obj, labels)]
        return sorted(found, key=lambda obj: str(obj.get("metadata", {}).get("name")))

    def fresh(self, kind: Kind, name: str) -> dict[str, Any] | None:
        return self.base.get(kind, name)

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.base.create(body)

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.base.apply(body)

    def patch_status(self, kind: Kind, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        return self.base.patch_status(kind, name, status)

    def delete(self, kind: Kind, name: str) -> None:
        self.base.delete(kind, name)

    def nodes(self) -> Objects:
        return self.base.nodes()

    def serves(self, kind: Kind) -> bool:
        return self.base.serves(kind)

    def record_event(self, event: Mapping[str, Any]) -> None:
        self.base.record_event(event)


def fresh_get(api: Api, kind: Kind, name: str) -> dict[str, Any] | None:
    """`kind/name` as the API server holds it now, whatever `api` caches."""
    fresh = getattr(api, "fresh", None)
    return fresh(kind, name) if fresh is not None else api.get(kind, name)
