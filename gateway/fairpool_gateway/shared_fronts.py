"""What the pools' fronts tell each other across the gateway's replicas, through the
shared state: what each request was charged, and what each replica holds.

**Charges.** D2LPM (`fairpool.sched.routers.d2lpm`) moves a tenant off the worker that
caches its prompts once the tenant's service there has used its credit, Q^w, and the fair
queue orders tenants by their weighted service. A replica that counted only its own
requests would see a tenant's credit last N times longer through N replicas (each sees a
N-th of the traffic), and order its queue by a N-th of the service. So each replica tells
the others what every settled request was charged on its worker — one entry added to the
pool's stream in the server (`charges.lua`), sent with the settlement in the same round
trip — and reads what the others charged every `POLL_SECONDS`, applying it to its own
front (`PoolFront.charged_elsewhere`: the router's deficits and the queue's counters).
Every replica refills by the same rule from the same charges, so their tables agree but
for requests still in flight elsewhere (a charge is told at completion) and the last poll.

**Holdings.** With the same poll, each replica publishes for each pool what it holds —
its requests in flight per worker, and per tenant its requests queued and the tenant's
counter (`fairpool.front.peers.ReplicaState`) — and hears the others', in one script call
per pool, all pools in one round trip. The fronts then count the other replicas' requests
in `maxOutstanding` and their queued tenants in the fair order (`PoolFront.share_with`),
and release what the others' reports let go. A report lives `STATE_SECONDS` unless
renewed, so a replica that died stops counting within that; one that stops cleanly
withdraws its reports at once. While the server is down every replica decides alone,
its cap divided by the replicas as the hard limits are (`HeardPeers.lost`).

**Wake-ups.** A slot that frees while another replica holds requests may be that
replica's to take, and a poll's wait would leave it idle: in front of FCFS engines, with
each tenant through its own replica, polling alone cost 37 % of the engines' throughput
(bench_replicas). So a settlement on a pool where another replica has requests queued
has this replica publish its holdings at once (at most every `MIN_INTERVAL` seconds) and
`PUBLISH` a wake-up on the replicas' channel in the same round trip; a replica that hears
one publishes and reads the holdings at once, without waking the others in turn.

**Nothing heard is trusted** (`fairpool_gateway.heard`): a charge counts only if it is
one a replica writes — from a replica's id, of one of the gateway's tenants, a finite
service above zero and no more than one request can cost (`CostModel.most_service`) —
and a report only if its replica is live and it parses within `ReplicaState`'s bounds.
The scripts delete what no replica writes (a key of another type, a report of a replica
that is not live, an expiry further ahead than a report lives) and leave out what is
over the byte bounds; the rest is ignored here, logged and counted.

The prefix tree stays per replica: each learns which worker caches what from what it sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import Callable, Container, Mapping
from importlib import resources
from typing import Any

from redis.exceptions import RedisError

from fairpool.front import FrontListener, PoolFront, Settlement
from fairpool.front.peers import REPORT_BYTES, HeardPeers, ReplicaState
from fairpool.runtime import cancel_and_wait, wait_at_most
from fairpool.sched.cost import tenant_of
from fairpool.sched.errors import ConfigError
from fairpool_gateway import heard
from fairpool_gateway.heard import Untrusted
from fairpool_gateway.shared_limits import SharedLimiter

log = logging.getLogger("fairpool.gateway")

#: How often a replica reads the others' charges and holdings.
POLL_SECONDS = 0.1
#: Entries a pool's stream keeps (older ones are trimmed; a replica far behind skips them).
STREAM_LENGTH = 10_000
#: How long a replica's report of its holdings counts without being renewed.
STATE_SECONDS = 1.0
#: The shortest time between two exchanges, however many wake-ups come.
MIN_INTERVAL = 0.005
#: Charges read at most per pool and poll.
READ_COUNT = 1000
#: The most bytes of one charge (its four fields are far shorter), and of all the reports
#: heard for one pool (each is at most `REPORT_BYTES`).
CHARGE_BYTES = 4096
REPORTS_BYTES = 16 * REPORT_BYTES

_SCRIPTS = resources.files("fairpool_gateway")
STATES_SCRIPT = _SCRIPTS.joinpath("replica_states.lua").read_text()
CHARGES_SCRIPT = _SCRIPTS.joinpath("charges.lua").read_text()


class SharedFronts(FrontListener):
    """Publishes this replica's charges and holdings and applies the others' (module
    docstring). `fronts` gives the pools' fronts by pool name."""

    def __init__(
        self,
        shared: SharedLimiter,
        fronts: Callable[[], Mapping[str, PoolFront]],
        tenants: Callable[[], Container[str]] | None = None,
    ) -> None:
        self.shared = shared
        self.fronts = fronts
        #: The tenants a charge may name (the gateway's table); None: any. A charge of
        #: another would add a tenant to every replica's tables: a forged flood of them
        #: would fill the replicas' memory.
        self.tenants = tenants
        self.replica = uuid.uuid4().hex[:12]
        self._last: dict[str, str] = {}  # pool → id of the last entry read
        self._states = shared.client.register_script(STATES_SCRIPT)
        self._charges = shared.client.register_script(CHARGES_SCRIPT)
        self._tasks: list[asyncio.Task[None]] = []
        self._due = asyncio.Event()  # exchange now, not at the next poll
        self._tell = False  # ... and wake the other replicas with it

    @property
    def channel(self) -> str:
        """Where the replicas wake each other."""
        return f"{self.shared.prefix}:replicas:wake"

    def key(self, pool: str) -> str:
        return f"{self.shared.prefix}:pool:{{{pool}}}:charges"

    def _state_keys(self, pool: str) -> list[str]:
        tag = f"{self.shared.prefix}:pool:{{{pool}}}"
        return [f"{tag}:replicas", f"{tag}:holdings"]

    def settled(self, settlement: Settlement) -> None:
        if settlement.worker is None:
            return
        front = self.fronts().get(settlement.pool)
        peers = None if front is None else front.peers
        if peers is not None and peers.waiting_counters():  # the slot may be theirs
            self._tell = True
            self._due.set()
        if not 0 < settlement.service < math.inf:
            return
        # A charge past what one request can cost is no replica's (the others ignore it):
        # one charged its output limit for want of usage is told as the most there is.
        most = math.inf if front is None else front.cost.most_service()
        arguments = [
            "tell",
            STREAM_LENGTH,
            *("replica", self.replica, "tenant", settlement.flow),
            *("worker", settlement.worker, "service", repr(min(settlement.service, most))),
        ]
        keys = [self.key(settlement.pool)]
        self.shared.send_soon(
            lambda pipeline: self._charges(keys=keys, args=arguments, client=pipeline)
        )

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._follow()), asyncio.create_task(self._listen())]

    async def close(self) -> None:
        await cancel_and_wait(self._tasks)
        if self.shared.up:  # the others stop counting this replica's holdings now
            with contextlib.suppress(TimeoutError, RedisError, OSError):
                pipeline = self.shared.client.pipeline(transaction=False)
                for pool in self.fronts():
                    replicas, holdings = self._state_keys(pool)
                    # the report first: one whose replica is not live is taken for forged
                    pipeline.hdel(holdings, self.replica)
                    pipeline.zrem(replicas, self.replica)
                await pipeline.execute()

    # ------------------------------------------------------------------ charges

    async def poll(self) -> int:
        """Read and apply what the other replicas charged since the last poll; returns
        how many charges were applied. Pools seen for the first time start from now.
        A charge that is not one a replica writes is ignored (`heard.charge`)."""
        fronts = self.fronts()
        for pool in fronts:
            if pool not in self._last:  # after the stream's last entry (or its start)
                last = await self._charges(keys=[self.key(pool)], args=["last"])
                self._last[pool] = _text(last)
        if not fronts:
            return 0
        pipeline = self.shared.client.pipeline(transaction=False)
        for pool in fronts:
            arguments = ["read", self._last[pool], READ_COUNT, CHARGE_BYTES]
            await self._charges(keys=[self.key(pool)], args=arguments, client=pipeline)
        answers = await pipeline.execute()
        applied = 0
        for (pool, front), entries in zip(fronts.items(), answers, strict=True):
            for entry_id, fields in entries:
                self._last[pool] = _text(entry_id)
                applied += self._apply(front, dict(_pairs(fields)))
        return applied

    def _apply(self, front: PoolFront, fields: Mapping[str, Any]) -> int:
        """Apply one charge read from the stream to `front`: 1 if it was another
        replica's, 0 if this one's or ignored."""
        try:
            charge = heard.charge(fields, front.cost.most_service())
            if self.tenants is not None and tenant_of(charge.tenant) not in self.tenants():
                raise Untrusted("charge", f"tenant {charge.tenant!r:.80} is not the gateway's")
        except Untrusted as error:
            self.shared.ignored.untrusted(error)
            return 0
        if charge.replica == self.replica:
            return 0
        front.charged_elsewhere(charge.tenant, charge.worker, charge.service)
        return 1

    # ------------------------------------------------------------------ holdings

    async def exchange(self, wake_others: bool = False) -> None:
        """Publish this replica's holdings of every pool and hear the others' (one round
        trip; `wake_others`: and have them do the same now); then each pool's front
        releases what they let go."""
        fronts = self.fronts()
        if not fronts:
            return
        pipeline = self.shared.client.pipeline(transaction=False)
        for pool, front in fronts.items():
            report = front.replica_state().to_json()
            arguments = [self.replica, report, STATE_SECONDS, REPORT_BYTES, REPORTS_BYTES]
            await self._states(keys=self._state_keys(pool), args=arguments, client=pipeline)
        if wake_others:
            pipeline.publish(self.channel, self.replica)
        answers = (await pipeline.execute())[: len(fronts)]  # the wake-up's answer last
        for front, (reports, ignored) in zip(fronts.values(), answers, strict=True):
            self.shared.ignored("report", f"the script removed or left out {ignored}", ignored)
            self._hear(front, self._reports(reports))

    def _reports(self, reports: Any) -> dict[str, ReplicaState]:
        """The other replicas' reports among the live ones the script returned; one that
        is not a replica's report is ignored (`ReplicaState.from_json`)."""
        states = {}
        for replica, text in _pairs(reports):
            if replica == self.replica:
                continue
            try:
                states[replica] = ReplicaState.from_json(text)
            except ConfigError as error:
                self.shared.ignored("report", f"replica {replica!r:.40}: {error}")
        return states

    def lose_peers(self) -> None:
        """The server is down: each replica decides alone until it is back, its cap
        divided by the replicas (`HeardPeers.lost`)."""
        for front in self.fronts().values():
            self._peers_of(front).lost(self.shared.spec.replicas)
            front.release_waiting()

    @staticmethod
    def _hear(front: PoolFront, states: Mapping[str, ReplicaState]) -> None:
        SharedFronts._peers_of(front).hear(states)
        front.release_waiting()

    @staticmethod
    def _peers_of(front: PoolFront) -> HeardPeers:
        """`front`'s peers; a new pool (or a rebuilt one) starts sharing now."""
        peers = front.peers
        if not isinstance(peers, HeardPeers):
            peers = HeardPeers()
            front.share_with(peers)
        return peers

    async def _follow(self) -> None:
        while True:
            await wait_at_most(self._due, POLL_SECONDS)
            self._due.clear()
            wake_others, self._tell = self._tell, False
            if not self.shared.up:
                self.lose_peers()
                continue
            try:
                await self.poll()
                await self.exchange(wake_others)
            except (TimeoutError, RedisError, OSError) as error:
                log.debug("exchanging state with the other replicas failed: %s", error)
                self.lose_peers()
            except Exception:  # a defect: said loudly, and the replica decides alone
                log.exception("exchanging state with the other replicas failed")
                self.lose_peers()
            await asyncio.sleep(MIN_INTERVAL)

    async def _listen(self) -> None:
        """Exchange at once when another replica says a slot freed (`channel`)."""
        while True:
            pubsub = self.shared.client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                while True:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=POLL_SECONDS
                    )
                    if message is not None and _text(message["data"]) != self.replica:
                        self._due.set()
            except (TimeoutError, RedisError, OSError) as error:
                log.debug("listening for the other replicas failed: %s", error)
                await asyncio.sleep(POLL_SECONDS)  # polling goes on meanwhile
            finally:
                with contextlib.suppress(TimeoutError, RedisError, OSError):
                    await pubsub.aclose()


def _pairs(answer: Any) -> list[tuple[str, Any]]:
    """A flat HGETALL-style list [field, value, ...] as (field, value) pairs (the names as
    text)."""
    items = list(answer or [])
    return [(_text(items[index]), items[index + 1]) for index in range(0, len(items) - 1, 2)]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
