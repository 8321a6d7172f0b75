"""`fairpool engine --model PATH [vLLM options…]`: vLLM's OpenAI server with the fair
scheduler plugged in.

The launcher checks the scheduler configuration before anything starts (a bad file is
an error naming the field, not a crash inside vLLM's engine process), then runs vLLM's
`serve` as a child with:

- `--scheduler-cls fairpool_engine.vllm.scheduler.FairScheduler`;
- `--middleware fairpool_engine.vllm.middleware.TenantXargsMiddleware` (400 for bad
  `vllm_xargs.fairpool_*`);
- `--enable-prompt-tokens-details`, so usage reports cached prompt tokens (the gateway
  corrects its charges with them);
- FAIRPOOL_SCHEDULER_CONFIG pointing at the configuration (and FAIRPOOL_SCHEDULER_POLICY
  for `--policy`, which then replaces the file's policy in every version of it);
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

from fairpool.api.scheduler_config import CONFIG_ENV, POLICY_ENV
from fairpool_engine.live import LiveScheduler

SCHEDULER_CLS = "fairpool_engine.vllm.scheduler.FairScheduler"
MIDDLEWARE = "fairpool_engine.vllm.middleware.TenantXargsMiddleware"


def vllm_command(model: str, vllm_args: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fairpool_engine.vllm.main",
        "serve",
        model,
        "--scheduler-cls",
        SCHEDULER_CLS,
        "--middleware",
        MIDDLEWARE,
        "--enable-prompt-tokens-details",
        *vllm_args,
    ]


def run(model: str, vllm_args: Sequence[str], config: str | None, policy: str | None) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="fairpool-engine-"))
    try:
        config = config or os.environ.get(CONFIG_ENV)
        # Checked here, where a bad file is an error naming the field, not a crash in
        # vLLM's engine process. vLLM reads the same file and follows its changes.
        LiveScheduler(config, policy_override=policy, queue_only=True)
        metrics_dir = workdir / "metrics"
        metrics_dir.mkdir()
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
        if config is not None:
            env[CONFIG_ENV] = str(Path(config).resolve())
        if policy is not None:
            env[POLICY_ENV] = policy
        child = subprocess.Popen(vllm_command(model, vllm_args), env=env)

        def forward(signum: int, _frame: object) -> None:
            child.send_signal(signum)

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, forward)
        return child.wait()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
