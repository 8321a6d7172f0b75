"""`fairpool engine --model PATH [vLLM options…]`: vLLM's OpenAI server with the fair
scheduler plugged in.

The launcher checks the scheduler configuration before anything starts (a bad file is
an error naming the field, not a crash inside vLLM's engine process), then runs vLLM's
`serve` as a child with:

- `--scheduler-cls fairpool_engine.vllm_scheduler.FairScheduler`;
- `--middleware fairpool_engine.vllm_middleware.TenantXargsMiddleware` (400 for bad
  `vllm_xargs.fairpool_*`);
- `--enable-prompt-tokens-details`, so usage reports cached prompt tokens (the gateway
  corrects its charges with them);
- FAIRPOOL_SCHEDULER_CONFIG pointing at the configuration;
- PROMETHEUS_MULTIPROC_DIR set to a fresh directory, so the scheduler's per-tenant
  metrics (written in vLLM's engine process) appear on vLLM's `/metrics`.

SIGINT and SIGTERM are passed on to vLLM, which stops its engine processes; the
launcher waits for it and removes the metrics directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fairpool.api.scheduler_config import CONFIG_ENV, load_scheduler_config, parse_scheduler_config

SCHEDULER_CLS = "fairpool_engine.vllm_scheduler.FairScheduler"
MIDDLEWARE = "fairpool_engine.vllm_middleware.TenantXargsMiddleware"


def vllm_command(model: str, vllm_args: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fairpool_engine.vllm_main",
        "serve",
        model,
        "--scheduler-cls",
        SCHEDULER_CLS,
        "--middleware",
        MIDDLEWARE,
        "--enable-prompt-tokens-details",
        *vllm_args,
    ]


def resolve_config(config: str | None, policy: str | None, workdir: Path) -> Path | None:
    """The configuration file vLLM will read: `config`, with `policy` overriding its
    policy (written to `workdir`). Raises ConfigError naming the field."""
    if config is None and policy is None:
        return None
    if policy is None:
        assert config is not None
        load_scheduler_config(config)
        return Path(config).resolve()
    document = load_scheduler_config(config).model_dump(by_alias=True) if config else {}
    document["policy"] = policy
    parse_scheduler_config(document, "--policy")
    import yaml

    path = workdir / "scheduler.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run(model: str, vllm_args: Sequence[str], config: str | None, policy: str | None) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="fairpool-engine-"))
    try:
        config_path = resolve_config(config or os.environ.get(CONFIG_ENV), policy, workdir)
        metrics_dir = workdir / "metrics"
        metrics_dir.mkdir()
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
        if config_path is not None:
            env[CONFIG_ENV] = str(config_path)
        child = subprocess.Popen(vllm_command(model, vllm_args), env=env)

        def forward(signum: int, _frame: object) -> None:
            child.send_signal(signum)

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, forward)
        return child.wait()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
