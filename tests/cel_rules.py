"""The CRDs' admission rules as the API server applies them, for tests: every CEL rule
(`x-kubernetes-validations`, evaluated with cel-python) on the object it sits on, and the
uniqueness of keyed lists (`x-kubernetes-list-type: map`)."""

from __future__ import annotations

import functools
from typing import Any

import celpy

Schema = dict[str, Any]


@functools.cache
def program(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def passes(rule: str, value: Any) -> bool:
    """Whether `rule` holds with `self` = `value` (an error counts as a failure, as in the
    API server)."""
    try:
        result = program(rule).evaluate({"self": celpy.json_to_cel(value)})
    except Exception:
        return False
    return result is True or (isinstance(result, celpy.celtypes.BoolType) and bool(result))


def admission_errors(schema: Schema, value: Any, path: str = "") -> list[str]:
    """`path: message` for each rule `value` breaks, at any depth."""
    errors = [
        f"{path}: {rule['message']}"
        for rule in schema.get("x-kubernetes-validations", [])
        if not passes(rule["rule"], value)
    ]
    if isinstance(value, dict):
        for name, child in schema.get("properties", {}).items():
            if value.get(name) is not None:
                errors += admission_errors(child, value[name], f"{path}.{name}".lstrip("."))
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            for name, child in value.items():
                errors += admission_errors(values, child, f"{path}.{name}".lstrip("."))
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema.get("x-kubernetes-list-map-keys", [])
            seen = [tuple(item.get(key) for key in keys) for item in value]
            if len(set(seen)) < len(seen):
                errors.append(f"{path}: Duplicate value")
        for index, item in enumerate(value):
            errors += admission_errors(schema["items"], item, f"{path}[{index}]")
    return errors
