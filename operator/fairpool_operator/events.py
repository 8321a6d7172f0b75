"""Kubernetes Events the operator posts about what it did, on the objects it did it for:
`kubectl describe inferencepool chat` then shows "Created Deployment chat-engine", and a
tenant's "Added to the gateway's tenant table". Warnings (a refused object) go the same way.
Posting an Event never fails a reconcile: an Event lost is only a line of history lost."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from fairpool_operator import contract
from fairpool_operator.api import Api, ApiError

log = logging.getLogger("fairpool.operator")

VERBS = {"create": "Created", "apply": "Updated", "delete": "Deleted"}


def event(
    about: Mapping[str, Any], kind: str, reason: str, message: str, now: str, warning: bool = False
) -> dict[str, Any]:
    """A core/v1 Event on `about` (an object as the API serves it, of kind `kind`)."""
    metadata = about.get("metadata", {})
    name = str(metadata.get("name", ""))
    digest = hashlib.sha256(f"{kind}/{name}/{reason}/{message}/{now}".encode()).hexdigest()
    involved = {
        "apiVersion": str(about.get("apiVersion") or f"{contract.GROUP}/{contract.VERSION}"),
        "kind": kind,
        "name": name,
        "namespace": str(metadata.get("namespace", "")),
    }
    if metadata.get("uid"):
        involved["uid"] = str(metadata["uid"])
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{digest[:16]}"},
        "involvedObject": {key: value for key, value in involved.items() if value},
        "type": "Warning" if warning else "Normal",
        "reason": reason,
        "message": message[:1024],
        "source": {"component": contract.FIELD_MANAGER},
        "reportingComponent": contract.FIELD_MANAGER,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def post(api: Api, body: Mapping[str, Any]) -> None:
    try:
        api.record_event(body)
    except ApiError as error:
        log.warning("could not post an Event (%s): %s", body.get("reason"), error)
