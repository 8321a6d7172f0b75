"""The engine package's layout rules: only `fairpool_engine.vllm` imports vLLM, the core
library imports no engine code, and every module path the launcher writes into vLLM's
command line names a module that exists."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairpool_engine.vllm import launch

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "engine" / "fairpool_engine"
#: The `fairpool` command imports the components' entry points; it is not the library.
COMMAND_LINE = ROOT / "fairpool" / "cli.py"


def imported_modules(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def python_files(*folders: Path) -> list[Path]:
    return sorted(path for folder in folders for path in folder.rglob("*.py"))


def test_only_the_vllm_subpackage_imports_vllm() -> None:
    outside = [
        path
        for path in python_files(ROOT / "fairpool", ROOT / "gateway", ROOT / "operator", ENGINE)
        if ENGINE / "vllm" not in path.parents
    ]
    assert outside
    offenders = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in outside
        for module in imported_modules(path)
        if module == "vllm" or module.startswith("vllm.")
    ]
    assert offenders == []


def test_the_vllm_subpackage_never_imports_itself_by_a_bare_name() -> None:
    """Inside `fairpool_engine/vllm/`, `import vllm` must mean vLLM: nothing may import
    its siblings relatively or by a path that makes `vllm` ambiguous."""
    for path in python_files(ENGINE / "vllm"):
        tree = ast.parse(path.read_text(), str(path))
        relative = [
            node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level
        ]
        assert relative == [], path
    package_init = (ENGINE / "vllm" / "__init__.py").read_text()
    assert list(imported_modules(ENGINE / "vllm" / "__init__.py")) == [], package_init


def test_the_core_library_imports_no_engine_code() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in python_files(ROOT / "fairpool")
        if path != COMMAND_LINE
        for module in imported_modules(path)
        if module.split(".")[0] in {"fairpool_engine", "fairpool_gateway", "fairpool_operator"}
    ]
    assert offenders == []


@pytest.mark.parametrize("dotted", [launch.SCHEDULER_CLS, launch.MIDDLEWARE])
def test_the_launchers_dotted_paths_name_existing_modules(dotted: str) -> None:
    module, _, name = dotted.rpartition(".")
    spec = importlib.util.find_spec(module)  # found without importing it (no vLLM here)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).is_relative_to(ENGINE / "vllm")
    assert (
        f"def {name}(" in Path(spec.origin).read_text()
        or f"class {name}" in Path(spec.origin).read_text()
    )


def test_the_launcher_runs_vllm_through_the_cpu_build_shim() -> None:
    command = launch.vllm_command("model", ["--port", "1"])
    main = command[command.index("-m") + 1]
    spec = importlib.util.find_spec(main)
    assert spec is not None and spec.origin == str(ENGINE / "vllm" / "main.py")
