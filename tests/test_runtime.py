"""The collector settings the gateway and engine-sim processes apply once started."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fairpool.runtime import FULL_COLLECTION_INTERVAL

pytestmark = pytest.mark.subprocess

PROBE = """
import gc, json
before = gc.get_threshold()
import fairpool.runtime
fairpool.runtime.tune_collector_for_serving()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_startup_objects_are_frozen_and_full_collections_spaced_out():
    # In a child process: freezing is for the whole life of a process.
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    state = json.loads(done.stdout)
    young, middle, _ = state["before"]
    assert state["after"] == [young, middle, FULL_COLLECTION_INTERVAL]
    assert state["frozen"] > 1000  # the interpreter's and fairpool's modules, at least
