"""Load-only baselines: round robin, and least outstanding requests."""

from __future__ import annotations

from collections.abc import Iterable

from fairpool.sched.routers.base import Router, RouteRequest


class RoundRobin(Router):
    """Each worker in turn (the RR of RR+LPM, SGLang's default data-parallel policy)."""

    name = "round_robin"

    def __init__(self, workers: Iterable[str] = ()) -> None:
        self._next = 0
        super().__init__(workers)

    def _choose(self, request: RouteRequest, candidates: list[str]) -> str:
        """The next worker in turn, skipping those not among the candidates."""
        workers = list(self.workers)
        eligible = set(candidates)
        for step in range(len(workers)):
            position = (self._next + step) % len(workers)
            if workers[position] in eligible:
                self._next = (position + 1) % len(workers)
                return workers[position]
        raise AssertionError("the candidates are workers of the pool")


class LeastLoad(Router):
    """Fewest outstanding requests (ties: lower KV usage, then fewer dispatched)."""

    name = "least_load"

    def _choose(self, request: RouteRequest, candidates: list[str]) -> str:
        return self._least_loaded(candidates)
