"""Replicas of a gateway in one process (the simulator's): fronts that share their state
at once, as the gateway's replicas do through the shared state within a poll."""

from __future__ import annotations

from collections.abc import Sequence

from fairpool.front.lifecycle import FrontListener, PoolFront, Settlement
from fairpool.front.peers import Peers, ReplicaState


class LivePeers(Peers):
    """The other fronts, as they are now."""

    def __init__(self, front: PoolFront, fronts: Sequence[PoolFront]) -> None:
        self.others = [other for other in fronts if other is not front]

    def replicas(self) -> list[ReplicaState]:
        return [other.replica_state() for other in self.others]

    def in_flight(self, worker: str, mine: int = 0) -> int:  # the sum, without states
        found = (other.router.workers.get(worker) for other in self.others)
        return sum(state.outstanding for state in found if state is not None)


class _Told(FrontListener):
    """Tells the other fronts what a settled request was charged on its worker, and lets
    them use the capacity it freed."""

    def __init__(self, front: PoolFront, fronts: Sequence[PoolFront]) -> None:
        self.others = [other for other in fronts if other is not front]

    def settled(self, settlement: Settlement) -> None:
        # Every replica hears the charge before any decides who takes the freed slot: one
        # that decided first would compare its counters with another's not yet charged, and
        # both could hold back for the other, leaving the slot idle.
        if settlement.worker is not None:
            for other in self.others:
                other.charged_elsewhere(settlement.flow, settlement.worker, settlement.service)
        for other in self.others:
            other.release_waiting()


def share_among(fronts: Sequence[PoolFront]) -> None:
    """Make `fronts` replicas of one gateway: each counts the others' requests and queues
    (`LivePeers`), hears what each settled request was charged on its worker, and may use
    the capacity it freed."""
    for front in fronts:
        front.listeners.append(_Told(front, fronts))
        front.share_with(LivePeers(front, fronts))
