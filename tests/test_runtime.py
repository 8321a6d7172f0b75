"""`fairpool.runtime`'s waiting helpers: a cancellation always reaches its task or, when a
library lost it, the wait ends anyway."""

from __future__ import annotations

import asyncio

import pytest

from fairpool.runtime import cancel_and_wait, wait_at_most

pytestmark = pytest.mark.unit


def test_cancelled_tasks_end_and_one_that_loses_its_cancellations_is_let_go():
    async def scenario() -> tuple[bool, bool, int]:
        async def obedient() -> None:
            await asyncio.sleep(3600)

        swallowed = 0

        async def loses_one() -> None:  # as a read whose timeout met the cancellation
            nonlocal swallowed
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    swallowed += 1
                    if swallowed > 1:
                        raise

        heard = asyncio.Event()

        async def deaf() -> None:  # loses every cancellation until `heard`
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    if heard.is_set():
                        raise

        tasks = [asyncio.create_task(job()) for job in (obedient, loses_one)]
        stubborn = asyncio.create_task(deaf())
        await asyncio.sleep(0)
        await cancel_and_wait(tasks)
        await cancel_and_wait([stubborn], seconds=0.3)  # returns: the task is let go
        ended = all(task.done() for task in tasks)
        still = not stubborn.done()
        heard.set()
        await cancel_and_wait([stubborn])
        return ended, still and stubborn.done(), swallowed

    ended, still, swallowed = asyncio.run(scenario())
    assert ended and still and swallowed == 2


def test_waiting_at_most_returns_when_set_or_when_the_time_is_up():
    async def scenario() -> bool:
        event = asyncio.Event()
        await wait_at_most(event, 0.01)  # nobody sets it
        asyncio.get_running_loop().call_soon(event.set)
        await wait_at_most(event, 3600)  # set meanwhile: returns at once
        return event.is_set()

    assert asyncio.run(scenario())
