"""Each tenant's waiting requests in longest-prefix-match order, kept between picks.

LPM and DLPM (Cao et al., arXiv 2501.14312, §4.1, Algorithm 1 line 11: "the request
with the longest prefix match") admit, among some tenants, the waiting request with the
most cached prompt tokens, ties in FCFS order. Sorting the whole queue at every pick
costs O(waiting requests) hit lookups; a heap per tenant makes a pick cost O(tenants)
plus O(log n) per request that arrived or left since the last one.

A tenant's heap is kept while the engine's `hit_epoch(tenant)` stays the same (its hits
have not changed) and rebuilt when it moves. Requests that arrive are pushed at the next
pick, when the engine can be asked their hit; requests that leave are dropped when they
reach the top.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING

from fairpool.sched.requests import EngineView

if TYPE_CHECKING:
    from fairpool.sched.policy import Waiting


class _TenantHeap:
    __slots__ = ("arrived", "epoch", "heap")

    def __init__(self, epoch: int, heap: list[tuple[int, int, Waiting]]) -> None:
        self.epoch = epoch
        self.heap = heap
        self.arrived: list[Waiting] = []


class MatchOrder:
    def __init__(self) -> None:
        self._tenants: dict[str, _TenantHeap] = {}

    def arrived(self, entry: Waiting) -> None:
        """`entry` joined its tenant's waiting queue (at either end)."""
        known = self._tenants.get(entry.request.tenant)
        if known is not None:
            known.arrived.append(entry)

    def forget(self, tenant: str) -> None:
        """`tenant` has no waiting request left."""
        self._tenants.pop(tenant, None)

    def first(
        self,
        view: EngineView,
        tenants: Iterable[str],
        queues: Mapping[str, Collection[Waiting]],
    ) -> Waiting | None:
        """The first request in LPM order among `tenants`' waiting requests (`queues`,
        none empty)."""
        best: tuple[int, int, Waiting] | None = None
        known_tenants, hit_epoch = self._tenants, view.hit_epoch
        for tenant in tenants:  # a hot loop: the usual case is checked inline
            known = known_tenants.get(tenant)
            if known is None or known.arrived or known.epoch != hit_epoch(tenant):
                top = self._top(view, tenant, queues[tenant])
            else:
                top = known.heap[0]
                if not top[2].queued:
                    top = self._top(view, tenant, queues[tenant])
            if best is None or top < best:  # orders are unique: entries are never compared
                best = top
        return None if best is None else best[2]

    def _top(
        self,
        view: EngineView,
        tenant: str,
        queue: Collection[Waiting],
    ) -> tuple[int, int, Waiting]:
        epoch = view.hit_epoch(tenant)
        known = self._tenants.get(tenant)
        if known is None or epoch is None or known.epoch != epoch or _bloated(known, queue):
            heap = [(-view.cached_tokens(entry.request), entry.order, entry) for entry in queue]
            heapq.heapify(heap)
            if epoch is not None:
                self._tenants[tenant] = _TenantHeap(epoch, heap)
            else:
                self._tenants.pop(tenant, None)
            return heap[0]
        heap = known.heap
        for entry in known.arrived:
            heapq.heappush(heap, (-view.cached_tokens(entry.request), entry.order, entry))
        known.arrived.clear()
        while not heap[0][2].queued:
            heapq.heappop(heap)  # left the queue since it was pushed
        return heap[0]


def _bloated(known: _TenantHeap, queue: Collection[Waiting]) -> bool:
    """Requests that left from deep in the heap are only dropped at a rebuild."""
    return len(known.heap) > 2 * len(queue) + 16
