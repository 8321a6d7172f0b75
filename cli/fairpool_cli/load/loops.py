"""When a load's requests are sent: open loop or closed loop.

- `open_loop` starts each request at its time, in a task of its own, whatever the
  earlier ones are doing, so a slow server meets the same offered load as a fast one.
  `poisson` gives the times of Poisson arrivals at a rate, drawn from a seeded stream
  (the same seed, the same times); a trace gives its own.
- `closed_loop` runs N clients, each sending its next request when its last one has
  ended: the most a server serves at that concurrency.

Both return once every request they started has ended; cancelled, they cancel the
requests in flight and wait until those have ended. `more()` is asked before each
request (a budget, a deadline): once it says no, that arrival stream or client stops.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any

from fairpool_cli.load.request import now


def _always() -> bool:
    return True


def poisson(
    rate: float, seed: int | str, start: float, end: float | None = None
) -> Iterator[float]:
    """Arrival times from `start` on (before `end`, if given) at `rate` per second:
    exponential gaps drawn from `random.Random(seed)`."""
    draw = random.Random(seed)
    moment = start
    while True:
        moment += draw.expovariate(rate)
        if end is not None and moment >= end:
            return
        yield moment


async def sleep_until(moment: float) -> None:
    """Sleep until `now()` reaches `moment`; yield to the event loop at least once."""
    await asyncio.sleep(max(moment - now(), 0.0))


async def open_loop(
    launch: Callable[[int, float], Coroutine[Any, Any, Any]],
    times: Iterable[float],
    more: Callable[[], bool] = _always,
) -> None:
    """At each of `times` (request `number` = 0, 1, ...), start `launch(number, time)` in
    a task of its own; return when the times have run out (or `more()` said no) and
    every request started has ended."""
    async with asyncio.TaskGroup() as requests:
        for number, moment in enumerate(times):
            await sleep_until(moment)
            if not more():
                break
            requests.create_task(launch(number, moment))


async def closed_loop(
    request: Callable[[int], Awaitable[Any]],
    concurrency: int,
    more: Callable[[], bool] = _always,
    stagger: float = 0.0,
) -> None:
    """`concurrency` clients; client `index` (from 0) starts after
    `stagger × index / concurrency` seconds and awaits `request(index)` again and again
    while `more()`."""

    async def client(index: int) -> None:
        if stagger:
            await asyncio.sleep(stagger * index / concurrency)
        while more():
            await request(index)

    async with asyncio.TaskGroup() as clients:
        for index in range(concurrency):
            clients.create_task(client(index))
