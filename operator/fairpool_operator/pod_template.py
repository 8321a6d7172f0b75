"""A pool's `engine.template`: what the CRD does not model, merged under what the operator
must own.

The template is shaped like a Deployment's pod template (`metadata` with labels and
annotations, `spec` with anything a pod spec holds: env and envFrom of the `engine`
container, sidecars, tolerations, affinity, topology spread, priority and runtime class,
extra volumes, ...). The operator's pod template is laid over it:

- a key the operator sets wins (the engine's command, image, probes, ports, security
  context, the selector labels, ...), a key it leaves unset comes from the template;
- maps (labels, annotations, nodeSelector) are merged key by key, the operator's winning;
- lists of named things (volumes, their mounts, env, ports, pull Secrets) are merged by
  name: the operator's entries, then the template's whose names are not taken (an entry
  of the operator's replaces the template's of its name whole: a volume or a variable has
  one source); containers too, but a container of the template that the operator also
  has (`engine`) is merged with the operator's in the same way as the pod;
- tolerations, envFrom and the other lists add the template's entries to the operator's;
- security contexts are the operator's alone (a template cannot loosen them).

So a template can add to a pod but never take away what makes it an engine of the pool.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

#: Lists whose entries are identified by a key: merged by it.
KEYED_LISTS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "volumeMounts": "name",
    "env": "name",
    "ports": "name",
    "imagePullSecrets": "name",
}
#: Lists of named things whose same-named entries are merged, not replaced.
MERGED_BY_NAME = frozenset({"containers", "initContainers"})
#: Keys the operator's value replaces whole, never merged with the template's.
WHOLE = frozenset({"securityContext"})


def merged(owned: Mapping[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """`owned` laid over `template` (see the module's docstring); neither is changed."""
    result = copy.deepcopy(dict(template))
    for key, value in owned.items():
        below = result.get(key)
        if key in WHOLE:
            result[key] = copy.deepcopy(value)
        elif isinstance(value, Mapping) and isinstance(below, Mapping):
            result[key] = merged(value, below)
        elif isinstance(value, list) and isinstance(below, list):
            result[key] = _merged_lists(key, value, below)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merged_lists(key: str, owned: list[Any], template: list[Any]) -> list[Any]:
    name = KEYED_LISTS.get(key)
    if name is None:
        added = [item for item in template if item not in owned]
        return copy.deepcopy([*owned, *added])
    theirs = {item.get(name): item for item in template if isinstance(item, Mapping)}
    result = []
    for item in owned:
        below = theirs.pop(item.get(name), None) if isinstance(item, Mapping) else None
        if below is not None and key in MERGED_BY_NAME:
            result.append(merged(item, below))
        else:
            result.append(copy.deepcopy(item))
    return [*result, *(copy.deepcopy(item) for item in theirs.values())]
