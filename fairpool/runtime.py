"""Process-wide settings the long-running servers (gateway, engine-sim) share."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

#: Young-generation collections between full ones (CPython's default is 10).
FULL_COLLECTION_INTERVAL = 100


def tune_collector_for_serving() -> None:
    """Call once a server has started. CPython's cyclic garbage collector otherwise pauses
    every request for tens of milliseconds several times a minute at a few hundred
    requests per second, in full collections that traverse every live container object.

    - What exists at start-up (modules, classes, clients, the configuration: most of the
      process's objects) is frozen out of all collections.
    - Full collections of what comes later (a prefix tree's nodes, mostly) run 10× less
      often. Their pauses are as long as before, but they stall few enough requests to
      drop out of the 99th percentile; cyclic garbage lives a little longer.
    """
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_INTERVAL)


class LoopLag:
    """How late the event loop runs: a task (`run`) sleeps `interval` seconds over and over
    and records how much later than asked it woke, for the last `horizon` seconds. A timer
    that fired late because the loop was busy elsewhere — parsing a large body, a burst of
    work — is the loop's delay, not the thing it timed: `late_since` tells a health check or
    a server's timeout which it was."""

    def __init__(self, interval: float = 0.05, horizon: float = 60.0) -> None:
        self.interval = interval
        self.horizon = horizon
        self.worst = 0.0  # the largest lag seen since the start
        self._samples: deque[tuple[float, float]] = deque()  # (woke at, lag)
        self._due: float | None = None  # when the sleep under way should end

    async def run(self) -> None:
        while True:
            self._due = time.monotonic() + self.interval
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            lag = max(0.0, now - self._due)
            self._due = None
            self.worst = max(self.worst, lag)
            self._samples.append((now, lag))
            while self._samples and self._samples[0][0] < now - self.horizon:
                self._samples.popleft()

    def now(self) -> float:
        """How late the loop is at this moment (the sleep under way, overdue)."""
        return 0.0 if self._due is None else max(0.0, time.monotonic() - self._due)

    def recent(self) -> float:
        """The largest lag of the last second (for a gauge)."""
        since = time.monotonic() - 1.0
        return max([self.now(), *(lag for at, lag in self._samples if at >= since)])

    def late_since(self, moment: float) -> float:
        """The longest the loop was late in one stretch since `moment` (monotonic): a wait
        that began then lost at least this much to the loop, not to what it waited for."""
        return max([self.now(), *(lag for at, lag in self._samples if at >= moment)])


async def wait_at_most(event: asyncio.Event, seconds: float) -> None:
    """Until `event` is set or `seconds` pass. Neither `asyncio.wait_for` nor
    `asyncio.timeout`: on Python 3.11 a cancellation that meets their timeout can be lost,
    leaving the cancelled task running for good (a replica's lease renewer hung so in a
    test with each of them, and with it the shutdown). `asyncio.wait` cancels nothing on
    its timeout, so a cancellation always reaches the caller."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], seconds: float = 5.0) -> None:
    """Cancels `tasks` and waits until they end, at most `seconds`. On Python 3.11 a
    cancellation that meets a timeout inside a library (redis-py's reads) can be lost, the
    task going on as if its read had timed out: one still running is cancelled again every
    0.1 s, and after `seconds` abandoned rather than awaited for ever (a replica's shutdown
    hung on one so)."""
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            return
        _, pending = await asyncio.wait(pending, timeout=min(0.1, left))


class ServerInThread:
    """A uvicorn server on sockets already bound, run in a thread of its own: serving once
    `start` returns, stopped (`should_exit`), joined and its sockets closed by `stop`. What
    engine-sim's, the gateway's and the tests' servers on loopback share."""

    def __init__(self, server: Any, sockets: list[socket.socket], name: str) -> None:
        self.server = server  # a uvicorn.Server (uvicorn is not a core dependency)
        self.sockets = sockets
        self._thread = threading.Thread(target=self._run, name=name)

    def _run(self) -> None:
        self.server.run(sockets=self.sockets)

    def start(self) -> None:
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"{self._thread.name} did not start")
            time.sleep(0.01)

    def begin_stop(self) -> None:
        """What SIGTERM does: the server's shutdown begins (`stop` waits for its end)."""
        self.server.should_exit = True

    def stop(self) -> None:
        self.begin_stop()
        self._thread.join()
        for sock in self.sockets:
            sock.close()
