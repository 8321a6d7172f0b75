"""Pure functions: whether a pool's weights are where its engines load them, as the pool's
ModelReady condition — with the cause when they are not: the credentials Secret missing or
incomplete (read by the operator), or the init step's fetch failing (its termination
message: GatedModel, RevisionNotFound, ... `fairpool.api.model_source.FETCH_REASONS`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fairpool.api.inference_pool import InferencePool
from fairpool.api.model_source import CREDENTIAL_KEYS, FETCH_REASONS
from fairpool_operator import contract
from fairpool_operator.plan import Problem

#: Degraded reasons about the credentials Secret, which the ModelReady condition repeats.
SECRET_REASONS = frozenset({"SecretNotFound", "SecretKeyMissing"})


def credentials_problem(pool: InferencePool, secret: Mapping[str, Any] | None) -> Problem | None:
    """What is wrong with the Secret of `model.secretRef` (`secret`: as read, None if absent);
    only the names of its keys are looked at."""
    reference, uri = pool.spec.model.secret_ref, pool.spec.model.uri
    if reference is None or uri is None:
        return None
    where = f"spec.model.secretRef: Secret {reference.name!r}"
    if secret is None:
        return Problem("SecretNotFound", f"{where} not found in the pool's namespace")
    keys = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
    missing = [key for key in CREDENTIAL_KEYS[uri.scheme] if key not in keys]
    if missing:
        needed = ", ".join(missing)
        return Problem("SecretKeyMissing", f"{where} has no key {needed} ({uri.scheme}://)")
    return None


def fetch_failure(pods: Sequence[Mapping[str, Any]]) -> Problem | None:
    """The cause of a failed fetch in any of the pods (the first, by pod name)."""
    for pod in sorted(pods, key=_name):
        terminated = _fetch_state(pod, "terminated")
        if terminated is not None and terminated.get("exitCode") not in (0, None):
            reason, message = parse_termination_message(str(terminated.get("message") or ""))
            return Problem(reason, f"pod {_name(pod)}: {message}")
    return None


def parse_termination_message(text: str) -> tuple[str, str]:
    """`fairpool fetch-model`'s termination message as (reason, message); a message it did
    not write (a crash: the log's tail) as FetchFailed with its last line."""
    first, _, rest = text.strip().partition(": ")
    if first in FETCH_REASONS and rest:
        return first, rest
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "FetchFailed", lines[-1][-300:] if lines else "the fetch failed without a message"


def model_readiness(
    pool: InferencePool | None, problem: Problem | None, pods: Sequence[Mapping[str, Any]]
) -> tuple[bool, str, str] | None:
    """The ModelReady condition of a vLLM pool as (status, reason, message); None for a pool
    without weights to load. `problem` is the pool's Degraded cause, if any."""
    uri = pool.spec.model.uri if pool is not None else None
    if pool is None or uri is None or pool.spec.engine.kind != "vllm":
        return None
    if problem is not None and problem.reason in SECRET_REASONS:
        return False, problem.reason, problem.message
    if not uri.fetched:
        return True, "OnVolume", f"{uri}, mounted read-only"
    failure = fetch_failure(pods)
    if failure is not None:
        return False, failure.reason, failure.message
    for pod in sorted(pods, key=_name):
        done = _fetch_state(pod, "terminated")
        if done is not None and done.get("exitCode") == 0:
            cache = pool.spec.model.cache.volume
            return True, "Fetched", f"{uri}, in the {cache} cache of pod {_name(pod)}"
    fetching = [
        _name(pod) for pod in sorted(pods, key=_name) if _fetch_state(pod, "running") is not None
    ]
    if fetching:
        return False, "Fetching", f"pod {fetching[0]} is fetching {uri}"
    return False, "Pending", f"no pod has fetched {uri} yet"


def _fetch_state(pod: Mapping[str, Any], state: str) -> dict[str, Any] | None:
    """The fetch container's current `state` (running, terminated) of a pod, or for
    terminated also its last one (a container that failed and waits to be restarted)."""
    for status in pod.get("status", {}).get("initContainerStatuses", []) or []:
        if status.get("name") != contract.FETCH_CONTAINER:
            continue
        found = (status.get("state") or {}).get(state)
        if found is None and state == "terminated":
            found = (status.get("lastState") or {}).get(state)
        return dict(found) if found is not None else None
    return None


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))
