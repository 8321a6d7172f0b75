"""Priority bands inside real vLLM (its CPU build), through in-process engines so that
arrivals are in the test's order: tenant `fast` in band interactive and `bulk` in batch
(`tenantBands` in the scheduler configuration).

- An interactive request that arrives while batch requests are queued is admitted ahead
  of all of them (the batch band's minimum share is owed nothing: it was just served).
- Under KV pressure, vLLM's victims come from the batch band while any batch request
  runs — for a policy that shares memory by weight (VTC) and for one that keeps vLLM's
  own order inside a band (FCFS) — and every preempted request still produces all its
  tokens.

Counted events only: the order of admissions and the preemptions, as the scheduler saw
them (`band_run.py`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_child

pytestmark = pytest.mark.vllm

RANK = {"interactive": 0, "standard": 1, "batch": 2}


@pytest.mark.parametrize("policy", ["dlpm"])
def test_an_interactive_request_is_admitted_ahead_of_queued_batch_ones(
    scratch: Path, tiny_model: Path, policy: str
):
    admitted = run_child("band_run.py", scratch, str(tiny_model), "admission", policy)["admitted"]
    print(f"{policy}: admission order {''.join(tenant[0] for tenant in admitted)}")  # type: ignore[union-attr]
    assert admitted == ["bulk"] * 2 + ["fast"] * 4 + ["bulk"] * 10


@pytest.mark.parametrize("policy", ["vtc", "fcfs"])
def test_under_kv_pressure_the_batch_band_is_preempted_first(
    scratch: Path, tiny_model: Path, policy: str
):
    result = run_child("band_run.py", scratch, str(tiny_model), "preemption", policy)
    preemptions = result["preemptions"]
    victims = [victim for victim, _ in preemptions]  # type: ignore[union-attr]
    print(f"{policy}: {len(victims)} preemptions, by band {sorted(set(victims))}")
    assert victims and victims[0] == "batch"
    for victim, still_running in preemptions:  # type: ignore[union-attr]
        assert all(RANK[victim] >= RANK[band] for band in still_running), (victim, still_running)
    assert result["produced"] == {
        f"{tenant}-{index}": 400 for tenant in ("bulk", "fast") for index in range(8)
    }
