"""The prefix hits the fair scheduler orders by follow vLLM's prefix cache exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_child

pytestmark = pytest.mark.vllm


def test_followed_hits_equal_fresh_lookups_through_eviction_growth_and_reset(
    scratch: Path, tiny_model: Path
):
    counts: dict[str, int] = run_child("hit_tracking_run.py", scratch, str(tiny_model))  # type: ignore[assignment]
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
