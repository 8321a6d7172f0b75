"""The fake of vLLM's scheduler the fast tier drives the plugin with (`tests/fake_vllm`)
against the real vLLM 0.32: every name it provides exists at the same module path; its
methods take parameters that real vLLM's take (same names, same order, the real extra
ones optional); the attributes it sets are attributes real vLLM sets too; the statuses
and the block-hash key format are the same. What the fake leaves out is in its docstring;
what is its own (counters for tests, internal helpers) is in `FAKE_ONLY`."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
from collections.abc import Iterator
from typing import Any

import fake_vllm
import pytest
from fake_vllm import FAKE_ONLY, LAYOUT, kv_cache

pytestmark = pytest.mark.vllm

PAIRS = [
    (module, name, fake, importlib.import_module(module))
    for module, names in LAYOUT.items()
    for name, fake in names.items()
]
CLASSES = [
    (f"{module}.{name}", fake, getattr(real, name))
    for module, name, fake, real in PAIRS
    if inspect.isclass(fake)
]


@pytest.mark.parametrize(("module", "name"), [(module, name) for module, name, _, _ in PAIRS])
def test_every_fake_name_is_at_vllms_module_path(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def own_methods(cls: type) -> Iterator[tuple[str, Any]]:
    for name, member in vars(cls).items():
        if f"{cls.__name__}.{name}" in FAKE_ONLY:
            continue
        if inspect.isfunction(member) and (name == "__init__" or not name.startswith("__")):
            yield name, member


def check_parameters(where: str, fake: Any, real: Any) -> None:
    """A call the fake accepts, real vLLM accepts the same way."""
    fake_parameters = list(inspect.signature(fake).parameters.values())
    real_parameters = inspect.signature(real).parameters
    real_names = list(real_parameters)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in real_parameters.values())
    positions = []
    for parameter in fake_parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name not in real_parameters:
            assert takes_any, f"{where}: vLLM has no parameter {parameter.name!r}"
            continue
        real_parameter = real_parameters[parameter.name]
        positions.append(real_names.index(parameter.name))
        if parameter.default is not parameter.empty and isinstance(
            real_parameter.default, bool | int | float | str | type(None)
        ):
            assert parameter.default == real_parameter.default, (
                f"{where}: default of {parameter.name}"
            )
    assert positions == sorted(positions), f"{where}: parameters in another order"
    fake_names = {parameter.name for parameter in fake_parameters}
    for name, parameter in real_parameters.items():
        if name not in fake_names and parameter.kind not in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            assert parameter.default is not parameter.empty, f"{where}: vLLM requires {name!r}"


@pytest.mark.parametrize(("where", "fake", "real"), CLASSES, ids=[where for where, _, _ in CLASSES])
def test_fake_methods_take_what_vllms_take(where: str, fake: type, real: type) -> None:
    for name, method in own_methods(fake):
        assert hasattr(real, name), f"{where}.{name}: not in vLLM"
        real_method = inspect.getattr_static(real, name)
        if isinstance(real_method, staticmethod | classmethod):
            real_method = real_method.__func__
        if dataclasses.is_dataclass(real) and name == "__init__":
            continue  # generated: compared field by field below
        check_parameters(f"{where}.{name}", method, real_method)


def assigned_attributes(cls: type) -> set[str]:
    """`self.NAME` assignments in the class's (and its bases') source, plus its fields."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        names.update(vars(klass))
        names.update(getattr(klass, "__annotations__", {}))
        fields = getattr(klass, "__struct_fields__", ())  # msgspec
        names.update(fields if isinstance(fields, tuple) else ())
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for target in targets:
                for element in ast.walk(target):
                    if (
                        isinstance(element, ast.Attribute)
                        and isinstance(element.value, ast.Name)
                        and element.value.id == "self"
                    ):
                        names.add(element.attr)
    return names


@pytest.mark.parametrize(("where", "fake", "real"), CLASSES, ids=[where for where, _, _ in CLASSES])
def test_fake_attributes_are_vllms(where: str, fake: type, real: type) -> None:
    if issubclass(fake, BaseException) or fake.__module__ == "enum":
        return
    fake_names = {
        name
        for name in assigned_attributes(fake) - set(dir(object))
        if not name.startswith("__")
        and not any(f"{klass.__name__}.{name}" in FAKE_ONLY for klass in fake.__mro__)
    }
    missing = sorted(fake_names - assigned_attributes(real) - set(dir(real)))
    assert missing == [], f"{where}: vLLM has no {missing}"


def test_request_statuses_are_vllms_in_vllms_order() -> None:
    from vllm.v1.request import RequestStatus

    assert [status.name for status in fake_vllm.request.RequestStatus] == [
        status.name for status in RequestStatus
    ]
    for status in RequestStatus:
        fake = fake_vllm.request.RequestStatus[status.name]
        assert fake.is_finished(fake) == status.is_finished(status)
        reason = status.get_finished_reason(status)
        assert fake.get_finished_reason(fake) == (None if reason is None else str(reason))


def test_block_hash_keys_are_vllms() -> None:
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    key = bytes(range(32))
    for group in (0, 1, 300):
        assert kv_cache.make_block_hash_with_group_id(key, group) == make_block_hash_with_group_id(
            key, group
        )


def test_import_vllm_in_the_plugin_is_vllm_itself() -> None:
    """`fairpool_engine.vllm.compat` says `import vllm`: that must be vLLM, not the
    `fairpool_engine.vllm` subpackage it lives in."""
    from fairpool_engine.vllm import compat

    assert compat.vllm.__name__ == "vllm"
    assert hasattr(compat.vllm, "LLM") and compat.Scheduler.__module__.startswith("vllm.")
