"""What the Kubernetes API server stores of a fairpool resource.

Between `kubectl apply` and the operator, the API server changes a custom resource by its
CRD's structural schema (apiextensions.k8s.io/v1, "Defaulting" and "Pruning"):

- fields the schema does not name are pruned (unless the node says
  `x-kubernetes-preserve-unknown-fields`); `metadata` is Kubernetes' own and kept;
- a null in a field that is not `nullable` is pruned, then defaulted if it has a default;
- every absent field with a `default` gets it, parents first, so a defaulted object gets
  its own fields' defaults too.

A dry run (`fairpool render`, `fairpool plan`) and the tests read documents through
`stored`, so they see what the operator will: a rule that passes on the file and fails on
the stored object (a default that looks explicitly set) shows up before a cluster does.
The schemas are the CRDs generated from the models (`fairpool.api.crds`), the ones
`make crds` writes.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

from fairpool.api.crds import RESOURCES, crd

Schema = dict[str, Any]


@functools.cache
def _schemas() -> dict[str, Schema]:
    """Kind → the openAPIV3Schema of its CRD."""
    found = {}
    for resource in RESOURCES:
        document = crd(resource)
        (version,) = document["spec"]["versions"]
        found[document["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return found


def schema_of(kind: str) -> Schema | None:
    """The openAPIV3Schema of a fairpool kind (None for any other kind)."""
    return _schemas().get(kind)


def stored(document: Mapping[str, Any]) -> dict[str, Any]:
    """`document` as the API server would store it (see the module's docstring); documents
    of other kinds come back unchanged (as a copy)."""
    schema = schema_of(str(document.get("kind")))
    if schema is None:
        return copy.deepcopy(dict(document))
    result: dict[str, Any] = as_stored(document, schema)
    if "metadata" in document:  # Kubernetes' own: the CRD's schema does not prune it
        result["metadata"] = copy.deepcopy(document["metadata"])
    return result


def as_stored(value: Any, schema: Schema | None) -> Any:
    """`value` pruned and defaulted by `schema` (None: kept as it is)."""
    if schema is None or schema.get("x-kubernetes-preserve-unknown-fields"):
        return copy.deepcopy(value)
    if isinstance(value, list):
        return [as_stored(item, schema.get("items")) for item in value]
    if not isinstance(value, Mapping):
        return value
    properties: Mapping[str, Schema] = schema.get("properties", {})
    values = _values(schema)

    def schema_for(key: str) -> Schema | None:
        """A named field's schema, else a map's value schema; None: pruned."""
        return properties.get(key, values)

    result: dict[str, Any] = {}
    for key, item in value.items():
        prop = schema_for(key)
        if prop is None:
            continue
        if item is None and not prop.get("nullable"):
            if "default" not in prop:
                continue
            item = copy.deepcopy(prop["default"])
        result[key] = item
    for key, prop in properties.items():
        if key not in result and "default" in prop:
            result[key] = copy.deepcopy(prop["default"])
    return {key: as_stored(item, schema_for(key)) for key, item in result.items()}


def pruned_fields(document: Mapping[str, Any]) -> list[str]:
    """The fields of `document` its CRD does not know, as dotted paths: what `kubectl apply`
    refuses (strict field validation, the default) or the API server prunes."""
    schema = schema_of(str(document.get("kind")))
    if schema is None:
        return []
    found: list[str] = []
    top = {key: value for key, value in document.items() if key != "metadata"}
    _unknown(top, schema, "", found)
    return found


def _unknown(value: Any, schema: Schema | None, path: str, found: list[str]) -> None:
    if schema is None or schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _unknown(item, schema.get("items"), f"{path}[{index}]", found)
        return
    if not isinstance(value, Mapping):
        return
    properties: Mapping[str, Schema] = schema.get("properties", {})
    values = _values(schema)
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        prop = properties.get(key, values)
        if prop is None:
            found.append(where)
        else:
            _unknown(item, prop, where, found)


def _values(schema: Schema) -> Schema | None:
    values = schema.get("additionalProperties")
    return values if isinstance(values, dict) else None
