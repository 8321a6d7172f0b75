"""Small builders shared by the tests."""

from __future__ import annotations

import itertools
from typing import Any

from fairpool.sched.requests import EngineSnapshot, Request, Running

_ids = itertools.count()


def request(
    tenant: str = "a",
    prompt: int = 10,
    max_tokens: int = 10,
    arrival: float = 0.0,
    request_id: str | None = None,
) -> Request:
    return Request(request_id or f"r{next(_ids)}", tenant, prompt, max_tokens, arrival)


def view(
    memory: int = 10_000,
    running: list[Running] | None = None,
    hits: dict[str, int] | None = None,
    **state: float,
) -> EngineSnapshot:
    return EngineSnapshot(memory_tokens=memory, running=running or [], hits=hits or {}, **state)


def drain(
    policy,
    snapshot: EngineSnapshot | None = None,
    cached: dict[str, int] | None = None,
    limit: int = 1000,
) -> list[Request]:
    """Admit everything the policy offers (no memory limit beyond its own checks)."""
    snapshot = snapshot or view()
    admitted = []
    for _ in range(limit):
        chosen = policy.next_request(snapshot)
        if chosen is None:
            break
        policy.admit(chosen.request_id, (cached or {}).get(chosen.request_id, 0))
        snapshot.running.append(Running(chosen))
        admitted.append(chosen)
    return admitted


def tenant_group(
    name: str, weight: float = 1.0, parent: str | None = None, namespace: str | None = None
) -> dict[str, Any]:
    """A TenantGroup manifest."""
    spec: dict[str, Any] = {"weight": weight}
    if parent is not None:
        spec["parent"] = parent
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "TenantGroup",
        "metadata": metadata,
        "spec": spec,
    }
