"""The gateway's wait for a queued request (`fairpool_gateway.pool.hold`): released,
timed out, or abandoned by its client at any moment, a flight ends exactly once."""

from __future__ import annotations

import asyncio

import pytest
from test_front_lifecycle import Pool

from fairpool.front import Flight, Rejection
from fairpool_gateway.pool import _wake, hold

pytestmark = pytest.mark.unit


def gateway_pool(slots: int = 0, timeout: float = 30.0) -> Pool:
    pool = Pool(slots=slots)
    pool.front.queue_timeout = timeout

    def release(flight: Flight) -> None:
        pool.released.append(flight.request_id)
        _wake(flight)  # as the gateway's pools do

    pool.front.on_release = release
    return pool


async def let_tasks_run(rounds: int = 4) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def waiting(pool: Pool, request_id: str, tenant: str) -> tuple[Flight, asyncio.Task[None]]:
    flight = pool.arrive(request_id, tenant)
    assert flight.queued
    return flight, asyncio.ensure_future(hold(flight))


def test_a_released_request_goes_on_routed():
    async def scenario() -> None:
        pool = gateway_pool()
        flight, task = waiting(pool, "a0", "a")
        await let_tasks_run()
        assert not task.done()
        pool.set_slots(1)
        await asyncio.wait_for(task, 10)
        assert flight.decision is not None and not flight.settled

    asyncio.run(scenario())


def test_the_queue_timeout_refuses_and_settles():
    async def scenario() -> None:
        pool = gateway_pool(timeout=0.01)
        flight, task = waiting(pool, "a0", "a")
        with pytest.raises(Rejection) as refused:
            await asyncio.wait_for(task, 10)  # only a broken timer hangs
        assert refused.value.reason == "queue_timeout" and flight.settled
        assert pool.queue.queued() == 0

    asyncio.run(scenario())


def test_a_release_at_the_moment_of_the_timeout_wins_once():
    async def scenario() -> None:
        pool = gateway_pool(timeout=0.0)
        flight, task = waiting(pool, "a0", "a")
        pool.set_slots(1)  # before the loop runs the due timer
        await asyncio.wait_for(task, 10)
        assert not flight.settled and pool.queue.in_flight() == 1 and pool.queue.queued() == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_queue_uncharged():
    async def scenario() -> None:
        pool = gateway_pool()
        gone_flight, gone = waiting(pool, "a0", "a")
        _, stays = waiting(pool, "b0", "b")
        await let_tasks_run()
        gone.cancel()
        await let_tasks_run()
        assert gone.cancelled() and gone_flight.settled and pool.queue.queued() == 1
        pool.set_slots(1)
        await asyncio.wait_for(stays, 10)
        assert pool.released == ["b0"] and pool.queue.in_flight() == 1

    asyncio.run(scenario())


@pytest.mark.parametrize("cancel_first", [True, False])
def test_a_waiter_released_as_its_client_leaves_is_undone_and_its_place_passed_on(cancel_first):
    """Whichever comes first — the cancellation, or the release of the cancelled waiter
    before its task resumes — the flight is settled with nothing served and the next
    waiter gets the slot."""

    async def scenario() -> None:
        pool = gateway_pool()
        gone_flight, gone = waiting(pool, "a0", "a")
        _, stays = waiting(pool, "b0", "b")
        await let_tasks_run()
        if cancel_first:
            gone.cancel()
            pool.set_slots(1)  # a0 is first in VTC order: released, then undone
        else:
            pool.set_slots(1)
            gone.cancel()
        await asyncio.wait_for(stays, 10)
        await let_tasks_run()
        assert gone.cancelled() and gone_flight.settled
        assert pool.released == ["a0", "b0"] and pool.queue.in_flight() == 1
        assert pool.queue.in_flight("a") == 0
        assert pool.queue.state()["a"]["served"] == 0.0
        assert pool.front.router.workers["w0"].outstanding == 1

    asyncio.run(scenario())
