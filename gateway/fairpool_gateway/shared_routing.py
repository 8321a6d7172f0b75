"""D2LPM's deficits shared by the gateway's replicas, through the shared state.

D2LPM (`fairpool.sched.routers.d2lpm`) moves a tenant off the worker that caches its
prompts once the tenant's service there has used its credit, Q^w. A replica that counted
only its own requests would see a tenant's credit last N times longer through N replicas
(each sees a N-th of the traffic), and keep it on its favourite worker far longer than one
gateway would. So each replica tells the others what every settled request was charged on
its worker — one `XADD` to the pool's stream in the server, sent with the settlement in
the same round trip — and reads what the others charged every `POLL_SECONDS`, applying it
to its own table (`Router.charge_elsewhere`). Every replica refills by the same rule
from the same charges, so their tables agree but for requests still in flight elsewhere
(a charge is told at completion) and the last poll.

The prefix tree stays per replica: each learns which worker caches what from what it sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable

from redis.exceptions import RedisError

from fairpool.front import FrontListener, Settlement
from fairpool_gateway.shared_limits import SharedLimiter

log = logging.getLogger("fairpool.gateway")

#: How often a replica reads the others' charges.
POLL_SECONDS = 0.1
#: Entries a pool's stream keeps (older ones are trimmed; a replica far behind skips them).
STREAM_LENGTH = 10_000

#: Applies another replica's charge: (pool, tenant, worker, service).
Apply = Callable[[str, str, str, float], None]


class SharedCharges(FrontListener):
    """Publishes this replica's charges and applies the others' (module docstring)."""

    def __init__(
        self, shared: SharedLimiter, pools: Callable[[], Iterable[str]], apply: Apply
    ) -> None:
        self.shared = shared
        self.pools = pools
        self.apply = apply
        self.replica = uuid.uuid4().hex[:12]
        self._last: dict[str, str] = {}  # pool → id of the last entry read
        self._task: asyncio.Task[None] | None = None

    def key(self, pool: str) -> str:
        return f"{self.shared.prefix}:pool:{{{pool}}}:charges"

    def settled(self, settlement: Settlement) -> None:
        if settlement.worker is None or settlement.service <= 0:
            return
        fields = {
            "replica": self.replica,
            "tenant": settlement.request.tenant,
            "worker": settlement.worker,
            "service": repr(settlement.service),
        }
        key = self.key(settlement.pool)
        self.shared.send_soon(
            lambda pipeline: pipeline.xadd(key, fields, maxlen=STREAM_LENGTH, approximate=True)
        )

    async def start(self) -> None:
        self._task = asyncio.create_task(self._follow())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def poll(self) -> int:
        """Read and apply what the other replicas charged since the last poll; returns
        how many charges were applied. Pools seen for the first time start from now."""
        client = self.shared.client
        pools = list(self.pools())
        for pool in pools:
            if pool not in self._last:  # after the stream's last entry (or its start)
                last = await client.xrevrange(self.key(pool), count=1)
                self._last[pool] = _text(last[0][0]) if last else "0-0"
        streams = {self.key(pool): self._last[pool] for pool in pools}
        if not streams:
            return 0
        answer = await client.xread(streams, count=1000)
        applied = 0
        by_key = {self.key(pool): pool for pool in pools}
        for key, entries in answer or []:
            pool = by_key[_text(key)]
            for entry_id, fields in entries:
                self._last[pool] = _text(entry_id)
                values = {_text(name): _text(value) for name, value in fields.items()}
                if values.get("replica") == self.replica:
                    continue
                try:
                    service = float(values["service"])
                    self.apply(pool, values["tenant"], values["worker"], service)
                except (KeyError, ValueError):
                    continue  # not one of ours: nothing to apply
                applied += 1
        return applied

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            if not self.shared.up:
                continue
            try:
                await self.poll()
            except (TimeoutError, RedisError, OSError) as error:
                log.debug("reading the replicas' routing charges failed: %s", error)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
