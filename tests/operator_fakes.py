"""An in-memory `fairpool_operator.api.Api` for the operator's unit tests: it stores what it
is sent, records every write, and defaults fields as an API server does (so that tests see
whether the reconciler mistakes the server's additions for drift)."""

from __future__ import annotations

import base64
import copy
import itertools
from collections.abc import Mapping
from typing import Any

from fairpool.api.stored import schema_of, stored
from fairpool_operator.api import Api, ApiError, Kind, kind_of, matches


class FakeApi(Api):
    def __init__(self, namespace: str = "serving") -> None:
        self.namespace = namespace
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str]] = []  # (verb, kind, name)
        self._versions = itertools.count(1)
        self._uids = itertools.count(1)
        self.node_list: list[dict[str, Any]] = []  # the cluster's Nodes
        self.served_kinds: set[str] = set()  # kinds of optional APIs served (LeaderWorkerSet)
        self.events: list[dict[str, Any]] = []  # Events posted, in order

    # --- the Api ---------------------------------------------------------------------------

    def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind.kind, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, kind: Kind, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        found = [
            copy.deepcopy(obj)
            for (kind_name, _), obj in sorted(self.objects.items())
            if kind_name == kind.kind and matches(obj, labels)
        ]
        return found

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        kind = kind_of(body)
        name = body["metadata"]["name"]
        if (kind.kind, name) in self.objects:
            raise ApiError(409, f"{kind.kind} {name} exists")
        self.writes.append(("create", kind.kind, name))
        return self.put(body)

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        kind = kind_of(body)
        name = body["metadata"]["name"]
        current = self.objects.get((kind.kind, name))
        if current is None:
            raise ApiError(404, "not found")
        self.writes.append(("apply", kind.kind, name))
        merged = copy.deepcopy(current)
        for key, value in body.items():
            if key == "metadata":
                merged["metadata"].update(copy.deepcopy(value))
            elif key != "status":
                merged[key] = copy.deepcopy(value)
        merged["metadata"]["resourceVersion"] = str(next(self._versions))
        if merged.get("spec") != current.get("spec"):
            merged["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        self.objects[kind.kind, name] = server_defaults(merged)
        return copy.deepcopy(self.objects[kind.kind, name])

    def patch_status(self, kind: Kind, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        current = self.objects.get((kind.kind, name))
        if current is None:
            raise ApiError(404, "not found")
        self.writes.append(("status", kind.kind, name))
        merged = {**current.get("status", {}), **copy.deepcopy(dict(status))}
        current["status"] = {key: value for key, value in merged.items() if value is not None}
        return copy.deepcopy(current)

    def delete(self, kind: Kind, name: str) -> None:
        if self.objects.pop((kind.kind, name), None) is not None:
            self.writes.append(("delete", kind.kind, name))

    def nodes(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.node_list)

    def serves(self, kind: Kind) -> bool:
        return kind.kind in self.served_kinds

    def record_event(self, event: Mapping[str, Any]) -> None:
        self.events.append(copy.deepcopy(dict(event)))

    # --- for tests -------------------------------------------------------------------------

    def put(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Stores an object as the API server would (users' objects, or the operator's)."""
        obj = copy.deepcopy(dict(body))
        kind = kind_of(obj)
        metadata = obj.setdefault("metadata", {})
        metadata.setdefault("namespace", self.namespace)
        metadata.setdefault("uid", f"uid-{next(self._uids)}")
        metadata.setdefault("generation", 1)
        metadata.setdefault("creationTimestamp", f"2026-01-01T00:00:{next(self._uids):02d}Z")
        metadata["resourceVersion"] = str(next(self._versions))
        self.objects[kind.kind, metadata["name"]] = server_defaults(obj)
        return copy.deepcopy(self.objects[kind.kind, metadata["name"]])

    def edit(self, kind: str, name: str, spec: Mapping[str, Any]) -> None:
        """A user's change of spec (the generation moves on)."""
        obj = self.objects[kind, name]
        obj["spec"] = {**obj.get("spec", {}), **copy.deepcopy(dict(spec))}
        obj["metadata"]["generation"] += 1
        self.objects[kind, name] = server_defaults(obj)

    def take_writes(self) -> list[tuple[str, str, str]]:
        writes, self.writes = self.writes, []
        return writes


def server_defaults(obj: dict[str, Any]) -> dict[str, Any]:
    """Some of what a real API server adds or rewrites on write; fairpool's own resources
    exactly as it stores them (the CRD's pruning and defaults)."""
    if schema_of(str(obj.get("kind"))) is not None:
        return stored(obj)
    if obj.get("kind") == "Secret" and "stringData" in obj:
        encoded = {
            k: base64.b64encode(v.encode()).decode() for k, v in obj.pop("stringData").items()
        }
        obj["data"] = {**obj.get("data", {}), **encoded}
    if obj.get("kind") == "Service":
        obj["spec"].setdefault("type", "ClusterIP")
        obj["spec"].setdefault("sessionAffinity", "None")
    if obj.get("kind") == "Deployment":
        spec = obj["spec"]
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault("strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}})
        pod = spec["template"]["spec"]
        pod.setdefault("restartPolicy", "Always")
        pod.setdefault("dnsPolicy", "ClusterFirst")
        for container in pod["containers"]:
            container.setdefault("imagePullPolicy", "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            probe = container.get("readinessProbe", {})
            probe.setdefault("successThreshold", 1)
            probe.get("httpGet", {}).setdefault("scheme", "HTTP")
            for kind in ("requests", "limits"):
                quantities = container.get("resources", {}).get(kind, {})
                if quantities.get("cpu") == "0.5":
                    quantities["cpu"] = "500m"
    return obj
