"""Where a Tree-of-Thoughts burst goes: the mechanism behind docs/results.md §5's
Tree-of-Thoughts finding ([DLPM] Cao et al., arXiv 2501.14312, §5.2, Algorithm 2, against
VTC + round robin).

A thought's children arrive together and share its whole path as their prompt prefix. In
the four-worker runs no tree waited long for admission (0.04-0.15 s of 15-35 s trees);
its time was decoding, and each output token took longer under D2LPM (0.041 s) than under
round robin (0.029 s): D2LPM's SelectWorker sends every request of the burst to the worker
holding the path while the tenant has credit there (Q^w covers at least eight prompts), so
that worker's batch grows by the whole burst, where round robin deals the burst over every
worker. `fairpool_reproduce.results.tot_check` measures the latencies; this test pins the
placement.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.sched.routers import D2LPM, RoundRobin, RouteRequest
from fairpool.sched.routers.base import Router
from fairpool.sched.routers.d2lpm import AUTO_WORKER_QUANTUM_FLOOR

pytestmark = pytest.mark.unit

WORKERS = ["w0", "w1", "w2", "w3"]
#: The ToT workload's longest prompt: the question and three thoughts (90 + 3 · 200).
LONGEST_TOT_PROMPT = 690
#: A parent and the largest burst whose prompts' cost Q^w's floor covers.
LARGEST_BURST = int(AUTO_WORKER_QUANTUM_FLOOR // (LONGEST_TOT_PROMPT + 1)) - 1


def burst_workers(router: Router, path: int, siblings: int, earlier: int) -> set[str]:
    """After `earlier` unrelated requests, route a thought (a `path`-token prompt) and
    then its `siblings` children (the path plus one token each) together, none finished;
    returns the workers the children went to."""
    ids = itertools.count()

    def send(key: list[object]) -> str:
        request = RouteRequest(f"r{next(ids)}", "c1", key, len(key))
        return router.route(request).worker

    for other in range(earlier):
        send([("other", other)] * path)
    parent = [("path", token) for token in range(path)]
    send(parent)
    return {send([*parent, ("child", child)]) for child in range(siblings)}


@settings(max_examples=60, deadline=None)
@given(
    path=st.integers(90, LONGEST_TOT_PROMPT),
    siblings=st.integers(2, LARGEST_BURST),
    earlier=st.integers(0, 3),
)
def test_d2lpm_keeps_a_sibling_burst_on_one_worker_where_round_robin_spreads_it(
    path: int, siblings: int, earlier: int
) -> None:
    """Algorithm 2, SelectWorker (lines 3-9): the first request refills the tenant on every
    worker by Q^w (`auto`: at least its floor, 8,192), and the parent's children, prompts
    of ToT length, all go where the parent's path is cached while that credit lasts
    (a parent and ten children); round robin sends them to min(burst, 4) workers."""
    assert len(burst_workers(D2LPM(WORKERS), path, siblings, earlier)) == 1
    spread = burst_workers(RoundRobin(WORKERS), path, siblings, earlier)
    assert len(spread) == min(siblings, len(WORKERS))
