"""The prefix hits the fair scheduler orders by follow vLLM's prefix cache exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import vllm_environment

pytestmark = pytest.mark.vllm

RUN = Path(__file__).with_name("hit_tracking_run.py")


def test_followed_hits_equal_fresh_lookups_through_eviction_growth_and_reset(
    scratch: Path, tiny_model: Path
):
    done = subprocess.run(
        [sys.executable, str(RUN), str(tiny_model)],
        capture_output=True, text=True, timeout=600, env=vllm_environment(scratch),
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    # The run exercised what can change a hit: blocks stored, blocks evicted, a reset.
    assert counts["stored"] > 100 and counts["dropped"] > 100, counts
    assert counts["reset"] == 1, counts
    assert counts["checked"] > 1000, counts
    assert counts.get("mismatched", 0) == 0, counts
    # ... and the lookup itself agrees with vLLM's own, on hits that are not all zero.
    assert counts.get("unlike_vllm", 0) == 0 and counts["hit_blocks"] > 1000, counts
    # The hit charged at admission is the one vLLM computed.
    assert counts["admitted"] > 100, counts
    assert counts.get("charged_wrong", 0) == 0, counts
