"""`SlidingWindow`: the one implementation of a trailing-window count — amounts (requests,
tokens) recorded at times, summed over the last `window` seconds. The hard per-tenant
limits (`fairpool.front.limits.TenantLimiter`) count on it.
"""

from __future__ import annotations

from collections import deque
from typing import NewType

from fairpool.sched.errors import require_count, require_positive

#: A recorded amount, as `SlidingWindow.add` returns it to amend it later.
WindowEntry = NewType("WindowEntry", int)


class SlidingWindow:
    """Amounts recorded at non-decreasing times, summed over the trailing `window` seconds.

    An amount recorded at `t` counts while `now < t + window`. Every call prunes what has
    left the window, so memory holds only what still counts.

    Entries are (time, id) tuples and an id → amount map of plain numbers, which Python's
    cyclic garbage collector stops tracking: a gateway holds a minute of entries for every
    tenant, and as objects they made each full collection long enough to show in its p99.
    """

    def __init__(self, window: float = 60.0) -> None:
        self.window = require_positive("window", window)
        self._entries: deque[tuple[float, WindowEntry]] = deque()
        self._amounts: dict[WindowEntry, int] = {}
        self._next_id = 0
        self._total = 0

    def total(self, now: float) -> int:
        """The sum of the amounts still in the window at `now`."""
        self._prune(now)
        return self._total

    def is_empty(self, now: float) -> bool:
        self._prune(now)
        return not self._entries

    def add(self, now: float, amount: int = 1) -> WindowEntry:
        """Record `amount` at `now`; the entry can be amended while it is in the window."""
        self._prune(now)
        entry = WindowEntry(self._next_id)
        self._next_id += 1
        self._amounts[entry] = require_count("amount", amount)
        self._entries.append((now, entry))
        self._total += amount
        return entry

    def amend(self, entry: WindowEntry, amount: int, now: float) -> None:
        """Make `entry` (recorded in this window) count `amount` instead, if it still counts."""
        require_count("amount", amount)
        self._prune(now)
        if entry in self._amounts:
            self._total += amount - self._amounts[entry]
            self._amounts[entry] = amount

    def time_until_fits(self, now: float, amount: int, limit: int) -> float | None:
        """Seconds from `now` until `amount` more fits under `limit` (0: it fits now);
        None if `amount` alone exceeds `limit`, so it never fits."""
        if amount > limit:
            return None
        self._prune(now)
        excess = self._total + amount - limit
        if excess <= 0:
            return 0.0
        for time, entry in self._entries:  # oldest first: the order they leave in
            excess -= self._amounts[entry]
            if excess <= 0:
                return time + self.window - now
        return 0.0  # not reached: once every entry has left, `amount <= limit` fits

    def _prune(self, now: float) -> None:
        cutoff = now - self.window
        while self._entries and self._entries[0][0] <= cutoff:
            _, entry = self._entries.popleft()
            self._total -= self._amounts.pop(entry)
