"""The `fairpool` command and the repository layout rules."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fairpool_cli.main import main

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parent.parent


def test_demo_prints_a_fairness_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "demo.json"
    code = main(
        [
            "sim-demo",
            "--duration",
            "10",
            "--policy",
            "vtc",
            "--policy",
            "fcfs",
            "--scenario",
            "overload",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "overload" in printed and "vtc" in printed and "Jain" in printed
    results = json.loads(out.read_text())
    assert {r["policy"] for r in results} == {"vtc", "fcfs"}
    assert {t["tenant"] for t in results[0]["tenants"]} == {"a", "b"}


def test_demo_plots_service_over_time(tmp_path):
    out = tmp_path / "service.png"
    args = ["sim-demo", "--duration", "5", "--policy", "dlpm", "--scenario", "overload"]
    assert main([*args, "--plot", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_demo_priority_prints_bands_on_and_off_and_plots_ttft(tmp_path, capsys):
    out, plot = tmp_path / "priority.json", tmp_path / "priority.png"
    args = ["sim-demo", "--scenario", "priority", "--duration", "20", "--json", str(out)]
    assert main([*args, "--plot", str(plot)]) == 0
    printed = capsys.readouterr().out
    assert "interactive" in printed and "TTFT p99" in printed and "priority" in printed
    [result] = json.loads(out.read_text())
    assert (result["scenario"], result["policy"]) == ("priority", "dlpm")
    assert [run["label"] for run in result["runs"]] == ["on", "off", "alone"]
    for finding in result["findings"]:
        assert f"dlpm: {finding}" in printed.replace("\n", " ")
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_unknown_policy_is_a_clear_error_without_traceback(capsys):
    assert main(["sim-demo", "--duration", "1", "--policy", "nope"]) == 2
    err = capsys.readouterr().err
    assert "policy" in err and "nope" in err and "Traceback" not in err


def test_bad_duration_names_the_option(capsys):
    with pytest.raises(SystemExit):
        main(["sim-demo", "--duration", "-3"])
    assert "--duration" in capsys.readouterr().err


def test_policies_lists_every_registered_policy(capsys):
    assert main(["policies"]) == 0
    printed = capsys.readouterr().out
    for name in ("fcfs", "lpm", "vtc", "dlpm", "mcsf", "slai", "+memsafe"):
        assert name in printed


def test_console_script_runs():
    fairpool = Path(sys.executable).parent / "fairpool"
    result = subprocess.run([str(fairpool), "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and "fairpool" in result.stdout


#: The folders beside the core library, each holding one import package: the components
#: (deployed on their own) and the programs (the command line and the tools around it).
COMPONENTS = {
    "operator": "fairpool_operator",
    "gateway": "fairpool_gateway",
    "engine": "fairpool_engine",
}
PROGRAMS = {"cli": "fairpool_cli", "reproduce": "fairpool_reproduce"}
FOLDERS = COMPONENTS | PROGRAMS


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_component_and_program_folders_have_no_init_of_their_own(folder):
    assert not (ROOT / folder / "__init__.py").exists()
    assert (ROOT / folder / FOLDERS[folder] / "__init__.py").exists()


def test_every_mapped_folder_is_a_component_or_a_program():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    expected = {package: f"{folder}/{package}" for folder, package in FOLDERS.items()}
    assert config["package-dir"] == expected


def imported_top_level(package_folder: Path) -> dict[str, set[str]]:
    """Every top-level package that a file under `package_folder` imports (anywhere in the
    file: lazy imports inside functions count), by file."""
    found: dict[str, set[str]] = {}
    for path in sorted(package_folder.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def test_the_core_library_imports_no_component_and_no_program():
    ours = set(COMPONENTS.values()) | set(PROGRAMS.values())
    offenders = {
        path: sorted(names & ours)
        for path, names in imported_top_level(ROOT / "fairpool").items()
        if names & ours
    }
    assert offenders == {}


@pytest.mark.parametrize("folder", sorted(COMPONENTS))
def test_a_component_imports_the_core_library_and_itself_only(folder):
    package = COMPONENTS[folder]
    others = (set(COMPONENTS.values()) | set(PROGRAMS.values())) - {package}
    offenders = {
        path: sorted(names & others)
        for path, names in imported_top_level(ROOT / folder / package).items()
        if names & others
    }
    assert offenders == {}


def test_import_operator_is_the_standard_library_even_with_the_root_first_on_sys_path():
    probe = (
        "import sys; sys.modules.pop('operator', None); sys.path.insert(0, sys.argv[1]); "
        "import operator; assert hasattr(operator, 'itemgetter'), operator"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(ROOT)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_python_dash_m_works_from_the_repository_root():
    result = subprocess.run(
        [sys.executable, "-m", "fairpool_cli", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_packaging_lists_every_package_on_disk():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    roots = {"fairpool": ROOT / "fairpool"} | {
        package: ROOT / folder for package, folder in config["package-dir"].items()
    }
    # What a non-editable install (every image) ships: a package left out is missing there.
    on_disk = {
        ".".join([package, *init.parent.relative_to(folder).parts])
        for package, folder in roots.items()
        for init in folder.rglob("__init__.py")
    }
    assert on_disk == declared
    for package, folder in config["package-dir"].items():
        assert (ROOT / folder / "__init__.py").exists(), package


def core_subpackage_imports() -> dict[str, set[str]]:
    """Which of the core library's subpackages (api, sched, placement, sim) each imports."""
    graph: dict[str, set[str]] = {}
    core = ROOT / "fairpool"
    for path in sorted(core.rglob("*.py")):
        parts = path.relative_to(core).parts
        if len(parts) < 2:
            continue  # fairpool/*.py: helpers beside the subpackages
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module)
        targets = {name.split(".")[1] for name in imported if name.startswith("fairpool.")}
        graph.setdefault(parts[0], set()).update(targets - {parts[0]})
    return graph


def test_the_core_subpackages_import_each_other_without_a_cycle():
    graph = core_subpackage_imports()
    path: list[str] = []
    done: set[str] = set()

    def visit(package: str) -> None:
        if package in path:
            cycle = [*path[path.index(package) :], package]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if package in done:
            return
        path.append(package)
        for target in sorted(graph.get(package, ())):
            visit(target)
        path.pop()
        done.add(package)

    for package in sorted(graph):
        visit(package)


def test_placement_does_not_import_the_simulator():
    # The chain simulator uses placement (chains, capacities); the other way round was a
    # cycle (the PETALS and BPRR baselines, which now live beside the simulator).
    assert "sim" not in core_subpackage_imports()["placement"]
