"""What a replica reads from the shared state, checked before it is used.

Every replica writes to the server the replicas share, and so can anyone who reaches it
(an external server gets no NetworkPolicy). One forged entry must stop no tenant and no
replica, so nothing read from it is used as is (docs/gateway.md, "Shared state is not
trusted"): a number must be finite and within what a replica could have written, a text
well formed and short, a report of a replica that is live. What fails is ignored, logged
and counted by `Ignored`; a flood of forged entries costs one warning per kind every
`WARN_INTERVAL` seconds, with the number ignored since the last.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fairpool.front.peers import LONGEST_NAME

log = logging.getLogger("fairpool.gateway")

#: What was ignored: a D2LPM/queue charge, a replica's report of its holdings, an answer or
#: an entry of the limits script, a reading of the fleet's service or of a tenant's usage;
#: and a write the server refused (its error).
Kind = Literal["charge", "report", "limits", "service", "usage", "refused"]

#: Seconds between two warnings of one kind; the ones in between are counted, not logged.
WARN_INTERVAL = 10.0

#: A replica's id (`SharedFronts.replica`): what a charge must say it came from.
REPLICA_ID = re.compile(r"[0-9a-f]{12}")
#: The most fields a charge may have (it has four).
MOST_FIELDS = 8


class Untrusted(ValueError):
    """A value read from the shared state that no replica could have written."""

    def __init__(self, kind: Kind, detail: str) -> None:
        super().__init__(detail)
        self.kind: Kind = kind
        self.detail = detail


@dataclass
class _Quiet:
    warned_at: float
    ignored_since: int = 0


class Ignored:
    """Logs and counts what was ignored: at most one warning per kind every `interval`
    seconds, saying how many were ignored since the last one; `count(kind, times)` is
    told of every one (the gateway's counter metric)."""

    def __init__(
        self,
        count: Callable[[Kind, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = WARN_INTERVAL,
    ) -> None:
        self.count = count
        self.clock = clock
        self.interval = interval
        self.totals: Counter[Kind] = Counter()
        self._quiet: dict[Kind, _Quiet] = {}

    def __call__(self, kind: Kind, detail: str, times: int = 1) -> None:
        if times <= 0:
            return
        self.totals[kind] += times
        if self.count is not None:
            self.count(kind, times)
        now = self.clock()
        quiet = self._quiet.get(kind)
        if quiet is not None and now - quiet.warned_at < self.interval:
            quiet.ignored_since += times
            return
        since = f"; {quiet.ignored_since} more ignored since the last warning" if quiet else ""
        log.warning("ignored %s from the shared state: %s%s", kind, detail[:300], since)
        self._quiet[kind] = _Quiet(now)

    def untrusted(self, error: Untrusted) -> None:
        self(error.kind, error.detail)


def number(kind: Kind, what: str, value: object, low: float, high: float) -> float:
    """`value` (a reply: bytes, text or a number) as a finite float in [low, high]."""
    found = _float(value)
    if found is None:
        raise Untrusted(kind, f"{what} is not a number: {_shown(value)}")
    if not math.isfinite(found) or not low <= found <= high:
        raise Untrusted(kind, f"{what} {found!r} is outside [{low:g}, {high:g}]")
    return found


def whole(kind: Kind, what: str, value: object, low: int, high: int) -> int:
    """`value` as an integer in [low, high] (a float that holds one exactly passes)."""
    found = number(kind, what, value, low, high)
    if not found.is_integer():
        raise Untrusted(kind, f"{what} {found!r} is not a whole number")
    return int(found)


def name(kind: Kind, what: str, value: object) -> str:
    """`value` as a non-empty text of at most `LONGEST_NAME` characters."""
    text = _text(value) if isinstance(value, (bytes, str)) else None
    if not text or len(text) > LONGEST_NAME:
        raise Untrusted(kind, f"{what} is not a name: {_shown(value)}")
    return text


@dataclass(frozen=True)
class Charge:
    """One entry of a pool's charges stream, as a replica writes it."""

    replica: str
    tenant: str
    worker: str
    service: float


def charge(fields: Mapping[Any, Any], most: float) -> Charge:
    """A charges-stream entry's fields as a `Charge` of at most `most` service (what one
    request can cost), or `Untrusted`."""
    if len(fields) > MOST_FIELDS:
        raise Untrusted("charge", f"an entry of {len(fields)} fields")
    values = {_text(key): value for key, value in fields.items()}
    replica = name("charge", "replica", values.get("replica"))
    if not REPLICA_ID.fullmatch(replica):
        raise Untrusted("charge", f"replica {_shown(replica)} is not a replica's id")
    return Charge(
        replica,
        name("charge", "tenant", values.get("tenant")),
        name("charge", "worker", values.get("worker")),
        # a replica tells only positive charges: a negative one would be credit
        number("charge", "service", values.get("service"), math.ulp(0.0), most),
    )


def _float(value: object) -> float | None:
    if isinstance(value, bytes):
        value = _text(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except (ValueError, OverflowError):
        return None


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _shown(value: object) -> str:
    """`value` for a log line: short, whatever it was."""
    return repr(value)[:80]
