"""kmock made faithful enough for an operator (test helper; see the k8s-testing reference, §2.4).

kmock 0.8 is a real HTTP server with real watch streams over an in-memory store that leaves
out what a kopf operator leans on. This emulator adds:

- metadata.uid, creationTimestamp, generation and resourceVersion on create; a new
  resourceVersion on every write; generation bumped on spec changes;
- lists that carry the current resourceVersion, and watches that honour
  `?resourceVersion=N` as the API server does: a resumed watch gets every event after N
  (deletions included) and nothing the client already had — kmock alone replays every
  object as ADDED and loses what happened while no watch was open; a deletion event gets
  a resourceVersion of its own;
- the status subresource: a PATCH of `.../status` changes only `.status`, a PATCH of the
  object leaves `.status` alone (for resources that declare the subresource);
- fairpool's resources created as the API server stores them: the CRDs' pruning and
  defaults (`fairpool.api.stored`).

Still missing, and so not tested here: schema validation, pruning and defaults beyond
fairpool's resources and on updates (a merge patch is stored as sent), RBAC, field ownership
of server-side apply (applied as a merge patch), label selectors (ignored), the garbage
collector (owner references are stored, never acted on), and every controller (no pods are
made for a Deployment: tests play the controller).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
import kmock
from kmock._internal import aiobus, enums
from kmock._internal.k8s import KubernetesError

from fairpool.api.stored import schema_of, stored

CRDS = {
    "fairpool.io/v1alpha1/inferencepools": ("InferencePool", "inferencepool", {"fpool"}),
    "fairpool.io/v1alpha1/tenantquotas": ("TenantQuota", "tenantquota", {"tq"}),
    "fairpool.io/v1alpha1/tenantgroups": ("TenantGroup", "tenantgroup", {"tg"}),
}
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.mutable(weakref_slot=True)
class RecordingBus(aiobus.Bus[Any]):
    """A resource's event bus that keeps every event, for watches resumed from the past."""

    next_version: Any = None
    log: list[Any] = attrs.field(factory=list)

    async def put(self, item: Any) -> None:
        if isinstance(item, dict) and item.get("type") == "DELETED" and self.next_version:
            item = {**item, "object": {**item["object"]}}
            metadata = {**item["object"].get("metadata", {})}
            metadata["resourceVersion"] = self.next_version()
            item["object"]["metadata"] = metadata
        self.log.append(item)
        await super().put(item)


@attrs.frozen
class Refusal(KubernetesError):
    """What an admission policy or a ResourceQuota answers: the object is not written."""

    status: int = 403
    reason: str = "Forbidden"
    message: str = "refused"


@attrs.define(kw_only=True)
class FaithfulEmulator(kmock.KubernetesEmulator):
    _versions: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)
    _last_version: int = attrs.field(default=999, init=False)
    #: Writes (create, update) to refuse, by (plural, name): a test's admission policy.
    refused: dict[tuple[str, str], Refusal] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = collections.defaultdict(lambda: RecordingBus(next_version=self._next_version))

    def _next_version(self) -> str:
        self._last_version = next(self._versions)
        return str(self._last_version)

    def _has_status(self, resource: Any) -> bool:
        try:
            return "status" in (self.resources[resource].subresources or ())
        except KeyError:
            return False

    def _current(self, request: Any) -> Any:
        key = (request.resource, request.namespace, request.name)
        try:
            obj = self.objects[key]
        except KeyError:
            return None
        return None if obj.deleted else obj

    async def _handle(self, request: Any) -> Any:
        data = request.data
        if request.action in (enums.action.CREATE, enums.action.UPDATE):
            name = request.name or (data.get("metadata", {}) if isinstance(data, dict) else {}).get(
                "name"
            )
            plural = getattr(request.resource, "plural", None)
            refusal = self.refused.get((str(plural), str(name)))
            if refusal is not None and request.subresource is None:
                raise refusal
        if request.resource is not None and request.action == enums.action.CREATE:
            if isinstance(data, dict):
                if schema_of(str(data.get("kind"))) is not None:
                    kept = stored(data)
                    data.clear()
                    data.update(kept)
                metadata = data.setdefault("metadata", {})
                metadata.setdefault("uid", str(uuid.uuid4()))
                metadata.setdefault("creationTimestamp", _now())
                metadata["generation"] = 1
                metadata["resourceVersion"] = self._next_version()
                if request.namespace:
                    metadata.setdefault("namespace", request.namespace)
        elif (
            request.resource is not None and request.action == enums.action.UPDATE and request.name
        ):
            current = self._current(request)
            generation = int((current or {}).get("metadata", {}).get("generation", 1) or 1)
            if isinstance(data, dict):
                if request.subresource == "status":
                    for key in [key for key in data if key != "status"]:
                        del data[key]
                elif self._has_status(request.resource):
                    data.pop("status", None)
                for key in ("uid", "creationTimestamp", "generation", "resourceVersion"):
                    data.get("metadata", {}).pop(key, None)  # the server's, not the client's
                if current is not None and "spec" in data and _changes(current, data["spec"]):
                    data.setdefault("metadata", {})["generation"] = generation + 1
                data.setdefault("metadata", {})["resourceVersion"] = self._next_version()
            elif isinstance(data, list):  # JSON patch: keep its `test` ops meaningful, then bump
                if any(str(op.get("path", "")).startswith("/spec") for op in data):
                    data.append(
                        {"op": "add", "path": "/metadata/generation", "value": generation + 1}
                    )
                data.append(
                    {
                        "op": "add",
                        "path": "/metadata/resourceVersion",
                        "value": self._next_version(),
                    }
                )
        elif (
            request.resource is not None and request.action == enums.action.DELETE and request.name
        ):
            current = self._current(request)
            if current is not None:
                current.patch({"metadata": {"resourceVersion": self._next_version()}})
        return await super()._handle(request)

    async def _serve_list(self, request: Any) -> Any:
        result = await super()._serve_list(request)
        result["metadata"] = {"resourceVersion": str(self._last_version)}
        return result

    async def _serve_watch(self, request: Any) -> AsyncIterator[Any]:
        since = request.params.get("resourceVersion")
        if not since or not since.isdigit() or int(since) == 0:
            async for event in super()._serve_watch(request):  # every object, then changes
                yield event
            return
        yield b""  # the headers: the stream is open
        bus = self._buses[request.resource]
        marker = await bus.mark()  # live events from here on ...
        history = list(bus.log)  # ... and every earlier one: no gap, no repeat
        try:
            for event in history:
                if _version(event) > int(since) and _in_scope(request, event):
                    yield event
            async for event in bus.stream(since=marker):
                if _in_scope(request, event):
                    yield event
        finally:
            await bus.unmark(marker)


def _version(event: Any) -> int:
    version = event.get("object", {}).get("metadata", {}).get("resourceVersion", "")
    return int(version) if str(version).isdigit() else 0


def _in_scope(request: Any, event: Any) -> bool:
    namespace = event.get("object", {}).get("metadata", {}).get("namespace")
    return request.namespace is None or namespace == request.namespace


def _changes(current: Any, spec: Any) -> bool:
    """Whether merging `spec` into the object's spec changes it."""
    before = current.get("spec", {})
    if not isinstance(spec, dict) or not isinstance(before, dict):
        return spec != before
    return any(before.get(key) != value for key, value in spec.items())


@contextlib.asynccontextmanager
async def faithful_kmock() -> AsyncIterator[FaithfulEmulator]:
    """The emulator serving on loopback, with the cluster's built-in resources and
    fairpool's CRDs (namespaced, with status subresources)."""
    async with FaithfulEmulator() as emulator, kmock.Server(emulator):
        emulator.resources.load_bundled()
        for resource, (kind, singular, short) in CRDS.items():
            emulator.resources[resource] = kmock.ResourceInfo(
                kind=kind,
                singular=singular,
                namespaced=True,
                verbs=VERBS,
                shortnames=short,
                subresources={"status"},
            )
        yield emulator
