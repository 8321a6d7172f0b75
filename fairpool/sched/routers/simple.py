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

    def _choose(self, request: RouteRequest) -> str:
        workers = list(self.workers)
        worker = workers[self._next % len(workers)]
        self._next = (self._next + 1) % len(workers)
        return worker


class LeastLoad(Router):
    """Fewest outstanding requests (ties: lower KV usage, then fewer dispatched)."""

    name = "least_load"

    def _choose(self, request: RouteRequest) -> str:
        return self._least_loaded(self.workers)
