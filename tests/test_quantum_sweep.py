"""The `auto` quantum's sweep (`python -m fairpool_reproduce --only quantum`) at toy scale,
and the rule it checks being the one the library runs and the docs state."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import request, view

from fairpool.sched.cost import CostModel
from fairpool.sched.policies.dlpm import AUTO_QUANTUM_FLOOR, AUTO_QUANTUM_REQUESTS, DLPM
from fairpool_reproduce import quantum_sweep as sweep

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[1] / "docs" / "scheduling.md"


@pytest.fixture(scope="module")
def tiny():
    """One tuning and one held-out family, one sample each, a second of arrivals."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep, "FAMILIES", (sweep.FAMILIES[0], sweep.FAMILIES[2]))
        patch.setattr(sweep, "MULTIPLES", (1, 4))
        patch.setattr(sweep, "FIXED_QUANTA", (2048.0, 32768.0))
        yield sweep.quantum_sweep(scale=0.05, samples=1)


def test_the_sweep_separates_tuning_from_held_out_families(tiny):
    (tuning,), (held_out,) = tiny["tuning"]["samples"], tiny["held_out"]["samples"]
    assert tuning["workload"]["tuning"] and not held_out["workload"]["tuning"]
    chosen = tiny["tuning"]["choice"]["chosen"]
    assert chosen in (1, 4)
    assert set(tuning["runs"]) == {"lpm", "vtc", "Q=2048", "Q=32768", "m=1", "m=4"}
    assert set(held_out["runs"]) == {"lpm", "vtc", "Q=2048", "Q=32768", f"m={chosen}", "auto"}
    assert tiny["runs"] == 12


def test_the_held_out_samples_run_the_library_rule(tiny):
    """`auto` is the library's default, and it settles on the multiple of the sample's one
    prompt cost that the sweep's m-runs stand for."""
    (held_out,) = tiny["held_out"]["samples"]
    workload = sweep.Workload(**held_out["workload"])
    assert held_out["runs"]["auto"]["quantum"] == sweep.multiple_quantum(
        workload, AUTO_QUANTUM_REQUESTS
    )
    (row,) = tiny["held_out"]["rows"]
    for verdict in (row["auto"], row["chosen"]):
        assert verdict["vs_best"] > 0 and verdict["vs_lpm"] > 0
        assert 0 < verdict["jain"] <= 1
        assert verdict["best"] in ("Q=2048", "Q=32768")


def test_the_section_and_its_files_are_written_in_place(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "quantum_sweep", lambda scale: tiny)
    results = tmp_path / "results.md"
    results.write_text("# results\n\n## 8. chains\n\ntext\n\n## Simulator limits\n\nlimits\n")
    sweep.regenerate(tmp_path)
    sweep.regenerate(tmp_path)  # again: replaced, not added
    text = results.read_text()
    assert text.count("## 9. The `auto` quantum") == 1
    assert text.index("## 8.") < text.index("## 9.") < text.index("## Simulator limits")
    assert (tmp_path / "img" / "results-quantum.png").stat().st_size > 0
    assert '"held_out"' in (tmp_path / "img" / "results-quantum.json").read_text()


def test_the_rule_is_the_one_the_docs_state():
    """Q = the largest prompt cost admitted, at least the floor, as docs/scheduling.md's
    `auto` section says; its bound is then at most 4/3 times VTC's."""
    section = DOCS.read_text().split("### A quantum that needs no tuning: `auto`")[1]
    section = " ".join(section.split("\n### ")[0].split())  # lines rewrapped: one line
    assert re.search(r"\*\*Q is the largest prompt cost", section)
    assert f"at least {AUTO_QUANTUM_FLOOR:,.0f}" in section
    assert AUTO_QUANTUM_REQUESTS == 1
    policy = DLPM()
    policy.add(request("a", prompt=3000, request_id="a1"))
    policy.next_request(view())
    policy.admit("a1")
    assert policy.quantum == CostModel().prefill(3000, 0)


def test_the_numbers_docs_scheduling_quotes_are_the_sweeps():
    """docs/scheduling.md's `auto` section quotes the held-out summary generated from the
    recorded sweep (docs/img/results-quantum.json), line for line."""
    data = json.loads((DOCS.parent / "img" / "results-quantum.json").read_text())
    text = DOCS.read_text()
    assert sweep.replace_prose(text, data) == text
    start, end = (text.index(marker) for marker in sweep.PROSE_MARKERS)
    assert all(line in text[start:end] for line in sweep.prose(data))
