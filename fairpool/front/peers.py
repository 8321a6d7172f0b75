"""The other replicas of a gateway, as a pool's front knows them.

One gateway's fair queue decides which tenant takes a slot that frees on a worker; with
several replicas each would decide among its own requests alone, and each would fill a
worker up to `maxOutstanding` by itself. So each replica tells the others, for each pool,
what it holds (`ReplicaState`: its requests in flight per worker, and per tenant its
requests queued and the tenant's fair-queue counter as it sees it), and a front with
`peers` then decides with theirs:

- a worker is full when the requests of every replica on it reach `maxOutstanding`;
- a queued tenant takes a slot only while more slots are open than the other replicas
  hold requests of tenants that go before it (a smaller counter: less weighted service),
  so a slot goes to the tenant globally furthest below its share, whichever replica holds
  its request — that replica takes it when it hears the slot is open;
- a tenant that starts waiting is lifted (VTC's counter lift) to the smallest counter of
  the tenants waiting anywhere, not only here — unless it waits at another replica: it
  has been backlogged all along, and a lift each time its requests reach a replica whose
  queue of it was empty would take its credit (4 : 1 came out 2.92 : 1 over two replicas
  with the traffic spread).

The counters agree because each replica charges its queue with what the others served
(`PoolFront.charged_elsewhere`). What a replica knows of the others is as old as their
last report (the simulator's replicas see each other at once; the gateway's, through
the shared state, within a poll).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fairpool.sched.errors import ConfigError

#: Bounds on another replica's report (`ReplicaState.from_json`): its length; the requests
#: it may hold in all (a replica takes one request per connection, 4,096 by default: a
#: million is no replica's); a tenant's or worker's name; a queue counter's magnitude
#: (weighted service: 10^18 is decades of a pool's service at any weight in use).
REPORT_BYTES = 1 << 20
MOST_HELD = 1 << 20
LONGEST_NAME = 2048
MOST_COUNTER = 1e18


@dataclass(frozen=True)
class ReplicaState:
    """What one replica holds for one pool, as it tells the other replicas."""

    #: worker → requests this replica dispatched there and has not settled.
    in_flight: Mapping[str, int] = field(default_factory=dict)
    #: tenant → (its requests queued at this replica, its queue counter here).
    queued: Mapping[str, tuple[int, float]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"inFlight": self.in_flight, "queued": self.queued})

    @classmethod
    def from_json(cls, text: str | bytes) -> ReplicaState:
        """Parse another replica's report; ConfigError if it is not one a replica could
        have written: longer than `REPORT_BYTES`, of another shape, a name longer than
        `LONGEST_NAME`, a count or counter that is not finite and within its bounds."""
        if len(text) > REPORT_BYTES:
            raise ConfigError(
                "replica state", f"a report of {len(text)} bytes: the most is {REPORT_BYTES}"
            )
        try:
            document: Any = json.loads(text)
            in_flight = {
                _name(worker): _count(count) for worker, count in document["inFlight"].items()
            }
            queued = {
                _name(tenant): (_count(count), _counter(counter))
                for tenant, (count, counter) in document["queued"].items()
            }
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as error:
            raise ConfigError("replica state", f"not a replica's report: {error}") from error
        held = sum(in_flight.values()) + sum(count for count, _ in queued.values())
        if held > MOST_HELD:
            raise ConfigError("replica state", f"{held} requests held: the most is {MOST_HELD}")
        return cls(in_flight, queued)


def _name(value: str) -> str:
    if len(value) > LONGEST_NAME:
        raise ValueError(f"a name of {len(value)} characters")
    return value


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MOST_HELD:
        raise ValueError(f"a count of {value!r}")
    return value


def _counter(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"a counter of {value!r}")
    if not math.isfinite(value) or abs(value) > MOST_COUNTER:
        raise ValueError(f"a counter of {value!r}")
    return float(value)


class Peers:
    """The other replicas of a front, each as last heard of (`replicas`)."""

    def replicas(self) -> Iterable[ReplicaState]:
        """Override: the other replicas' states."""
        return ()

    def __len__(self) -> int:
        return sum(1 for _ in self.replicas())

    def in_flight(self, worker: str, mine: int = 0) -> int:
        """Requests the other replicas have in flight on `worker` (`mine`: this
        replica's, for peers that can only guess)."""
        return sum(state.in_flight.get(worker, 0) for state in self.replicas())

    def queued_before(self, tenant: str, counter: float) -> int:
        """Requests queued at the other replicas by tenants that go before `tenant` with
        `counter`: a smaller counter, or an equal one and a name first in order."""
        return sum(
            count
            for state in self.replicas()
            for other, (count, other_counter) in state.queued.items()
            if other != tenant and (other_counter, other) < (counter, tenant)
        )

    def queued(self, tenant: str) -> bool:
        """Whether `tenant` has requests queued at another replica."""
        return any(state.queued.get(tenant, (0, 0.0))[0] > 0 for state in self.replicas())

    def waiting_counters(self) -> list[float]:
        """The counters of the tenants queued at the other replicas."""
        return [
            counter
            for state in self.replicas()
            for count, counter in state.queued.values()
            if count > 0
        ]


class HeardPeers(Peers):
    """Peers as their last reports said (the gateway's replicas, through the shared
    state): `hear` replaces them all. While they cannot be heard (`lost`), each of the
    other replicas is taken to hold on each worker what this one holds, so that the
    cap divides among them as the hard limits do, and the fair order is this replica's."""

    def __init__(self) -> None:
        self._states: dict[str, ReplicaState] = {}
        self._unheard = 0  # other replicas guessed at while none can be heard

    def hear(self, states: Mapping[str, ReplicaState]) -> None:
        self._states = dict(states)
        self._unheard = 0

    def lost(self, replicas: int) -> None:
        """The reports cannot be read: `replicas` gateways in all, this one included."""
        self._states = {}
        self._unheard = max(replicas - 1, 0)

    def in_flight(self, worker: str, mine: int = 0) -> int:
        if self._unheard:
            return mine * self._unheard
        return super().in_flight(worker, mine)

    def replicas(self) -> Iterable[ReplicaState]:
        return self._states.values()

    def __len__(self) -> int:
        return len(self._states)
