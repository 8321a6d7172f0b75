"""Memory-safe admission (seed 002, Eq. 1 and Algorithm 2) on hand-checked cases."""

from __future__ import annotations

import pytest
from helpers import request, view

from fairpool.sched import Running
from fairpool.sched.errors import ConfigError
from fairpool.sched.memory import admission_is_memory_safe, projected_peak, semi_online_schedule

pytestmark = pytest.mark.unit


def test_peak_is_at_a_completion_step():
    # held 10 finishing in 5 steps, held 0 finishing in 20: at step 5 both run (15 + 5),
    # at step 20 only the second (20).
    assert projected_peak([(10, 5), (0, 20)]) == 20
    assert projected_peak([(10, 5), (0, 6)]) == 15 + 5
    assert projected_peak([]) == 0


def test_two_jobs_whose_final_sizes_exceed_memory_can_still_run_together():
    """§2.3: P1 finishes before P2 grows large, so both fit although s+o1 + s+o2 > M."""
    running = [Running(request(prompt=2, max_tokens=4))]
    candidate = request(prompt=2, max_tokens=8)
    assert (2 + 4) + (2 + 8) > 12
    assert admission_is_memory_safe(view(memory=12, running=running), candidate)


def test_the_candidates_own_completion_is_a_checkpoint():
    """The paper's listing checks only the running requests' completion steps: wrong."""
    running = [Running(request(prompt=10, max_tokens=2))]
    candidate = request(prompt=5, max_tokens=30)  # alone it needs 35 at its last step
    assert projected_peak([(10, 2), (5, 2)]) <= 30  # the running request's checkpoint passes
    assert not admission_is_memory_safe(view(memory=30, running=running), candidate)


def test_running_requests_count_what_they_have_generated():
    started = Running(request(prompt=10, max_tokens=20), output_tokens=15)
    # holds 25 now, 5 more to come: peak 30 alone, 30 + (1 + 5) with the candidate at step 5
    candidate = request(prompt=1, max_tokens=5)
    assert admission_is_memory_safe(view(memory=36, running=[started]), candidate)
    assert not admission_is_memory_safe(view(memory=35, running=[started]), candidate)


def test_a_custom_predictor_replaces_max_tokens():
    candidate = request(prompt=10, max_tokens=1000)
    assert not admission_is_memory_safe(view(memory=100), candidate)
    assert admission_is_memory_safe(view(memory=100), candidate, predictor=lambda r: 50)


def test_semi_online_schedule_of_algorithm_1():
    """§4, Algorithm 1: ascending o, each start while Eq. (1) holds, break at the first
    that fails. o = [1, 3, 2, 1], s = 1, M = 4: the two o = 1 start at round 0 (peak 2 + 2),
    o = 2 once they are gone (round 2), o = 3 when o = 2 is at its last round (3 + 1)."""
    assert semi_online_schedule([1, 3, 2, 1], prompt=1, memory=4) == [0, 4, 2, 0]
    assert semi_online_schedule([], prompt=1, memory=4) == []
    with pytest.raises(ConfigError) as error:
        semi_online_schedule([1, 4], prompt=1, memory=4)  # 1 + 4 > 4 even alone
    assert error.value.parameter == "outputs[1]"
