"""Hard limits shared by gateway replicas in a real Valkey server started by the tests:
two `SharedLimiter`s stand for two replicas. Their decisions are checked against the
in-memory limiter's on random sequences, and through the failures a deployment sees: a
replica that dies holding slots, and the server going away and coming back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import redis
from front_helpers import replicas as fronts_over_two_workers
from hypothesis import given, settings
from hypothesis import strategies as st
from polling import eventually
from shared_state_helpers import HeardCharges, admit, close, replicas, request

from fairpool.api.tenant_quota import TenantLimits
from fairpool.front import FrontRequest, Outcome, Rejection, TenantLimiter, Ticket, Usage
from fairpool_cli.local.store import LocalStore
from fairpool_gateway import shared_fronts
from fairpool_gateway.shared_fronts import SharedFronts

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def store() -> Iterator[LocalStore]:
    with LocalStore() as server:
        yield server


@pytest.fixture(autouse=True)
def empty(store: LocalStore) -> None:
    redis.Redis(port=store.port).flushdb()


def test_two_replicas_together_admit_no_more_than_the_limits(store):
    async def scenario() -> None:
        a, b = replicas(store)
        limits = TenantLimits(requestsPerMinute=5, concurrent=3)
        admitted, refused = [], []
        for index in range(8):
            try:
                admitted.append(await admit((a, b)[index % 2], request("acme", limits)))
            except Rejection as rejection:
                refused.append(rejection.reason)
        assert len(admitted) == 3 and refused == ["concurrent"] * 5
        for ticket in admitted:  # each settled by whichever replica: the slots are shared
            b.settle(ticket, 10)
        await b.sent()
        admitted = [await admit(a, request("acme", limits)) for _ in range(2)]
        with pytest.raises(Rejection) as error:
            await admit(b, request("acme", limits))
        assert error.value.reason == "requests_per_minute"
        assert 0 < error.value.retry_after <= 60
        assert "5 requests per minute" in error.value.message
        await admit(a, request("globex", limits))  # the other tenant's counts are its own
        await close(a, b)

    asyncio.run(scenario())


def test_tokens_are_corrected_to_what_the_engine_served(store):
    async def scenario() -> None:
        a, b = replicas(store)
        limits = TenantLimits(tokensPerMinute=1000)
        first = await admit(a, request("acme", limits, tokens=400))
        await admit(b, request("acme", limits, tokens=400))
        with pytest.raises(Rejection) as error:
            await admit(a, request("acme", limits, tokens=400))
        assert error.value.reason == "tokens_per_minute"
        a.settle(first, 100)  # served 100 of the 400 reserved
        await a.sent()
        await admit(b, request("acme", limits, tokens=400))  # 100 + 400 + 400 <= 1000
        with pytest.raises(Rejection) as error:
            await admit(a, request("acme", limits, tokens=1001))
        assert "on their own" in error.value.message
        await close(a, b)

    asyncio.run(scenario())


def test_requests_leave_the_window_when_its_length_has_passed(store):
    """The buckets expire: a tenant refused for its rate is admitted again once the
    Retry-After it was given has passed (a 2-second window here)."""

    async def scenario() -> None:
        a, b = replicas(store)
        a.window = b.window = 2
        limits = TenantLimits(requestsPerMinute=2)
        await admit(a, request("acme", limits))
        await admit(b, request("acme", limits))
        with pytest.raises(Rejection) as error:
            await admit(a, request("acme", limits))
        assert 0 < error.value.retry_after <= 2
        await eventually(
            lambda: admit(b, request("acme", limits)),
            ignoring=(Rejection,),
            what="the first requests left the 2-second window",
        )
        await close(a, b)

    asyncio.run(scenario())


def test_a_replica_that_dies_holding_slots_frees_them_when_its_leases_expire(store):
    async def scenario() -> None:
        dead, alive = replicas(store, lease_seconds=1)
        await alive.start()  # renews its own leases; the dead one never will
        limits = TenantLimits(concurrent=2)
        await admit(dead, request("acme", limits))
        held = await admit(alive, request("acme", limits))
        with pytest.raises(Rejection):
            await admit(alive, request("acme", limits))

        async def try_admit() -> Ticket | None:
            try:
                return await admit(alive, request("acme", limits))
            except Rejection:
                return None

        # the dead replica's slot comes back; the live one's, renewed, stays taken
        assert await eventually(try_admit, what="the dead replica's lease expired")
        with pytest.raises(Rejection):
            await admit(alive, request("acme", limits))
        alive.settle(held, 1)
        await close(dead, alive)

    asyncio.run(scenario())


def test_the_server_going_away_falls_back_to_divided_limits_and_comes_back():
    async def scenario(store: LocalStore) -> None:
        (replica,) = replicas(store, count=1)
        replica.spec = replica.spec.model_copy(update={"replicas": 2})
        await replica.start()
        limits = TenantLimits(concurrent=4)
        await admit(replica, request("acme", limits))
        store.stop()
        # no request fails: the local fallback admits, with the limit divided by 2
        fallback = [await admit(replica, request("acme", limits)) for _ in range(2)]
        assert not replica.up and replica.status()["sharedState"] == "down"
        with pytest.raises(Rejection):
            await admit(replica, request("acme", limits))
        for ticket in fallback:
            replica.settle(ticket, 1)
        store.start()
        await eventually(lambda: replica.up, what="the replica reached the server again")
        assert replica.status() == {"sharedState": "up"}
        await admit(replica, request("acme", limits))  # counted in the server again
        assert redis.Redis(port=store.port).zcard("fairpool:{acme}:leases") == 1
        await replica.close()

    with LocalStore() as own:  # this test stops its server
        asyncio.run(scenario(own))


arrive = st.tuples(
    st.just("arrive"),
    st.integers(0, 1),  # through which replica
    st.sampled_from(["acme", "globex"]),
    st.integers(1, 300),  # tokens reserved
)
settle = st.tuples(st.just("settle"), st.integers(0, 50), st.integers(0, 300))
operation = st.one_of(arrive, arrive, settle)  # arrivals twice as often: limits get reached


@settings(max_examples=60)
@given(
    st.lists(operation, min_size=8, max_size=60),
    st.sampled_from([None, 3, 8]),
    st.sampled_from([None, 400, 1500]),
    st.sampled_from([None, 2, 5]),
)
def test_replicas_decide_as_one_in_memory_limiter_would(store, operations, rpm, tpm, concurrent):
    """Within one minute (nothing leaves the window), two replicas sharing the server
    admit and refuse exactly the requests one in-memory limiter does, with the same
    reasons: the shared script is the same rule."""
    redis.Redis(port=store.port).flushdb()
    limits = TenantLimits(requestsPerMinute=rpm, tokensPerMinute=tpm, concurrent=concurrent)
    local = TenantLimiter(clock=lambda: 0.0)

    async def scenario() -> None:
        shared = replicas(store)
        held: list[tuple[Ticket, Ticket]] = []
        for step in operations:
            if step[0] == "arrive":
                _, replica, tenant, tokens = step
                front_request = request(tenant, limits, tokens)
                expected: str | Ticket
                try:
                    expected = local.admit(tenant, limits, tokens)
                except Rejection as rejection:
                    expected = rejection.reason
                try:
                    ticket = await admit(shared[replica], front_request)
                except Rejection as rejection:
                    assert rejection.reason == expected
                else:
                    assert isinstance(expected, Ticket), (expected, step)
                    held.append((expected, ticket))
            elif held:
                _, index, served = step
                local_ticket, shared_ticket = held.pop(index % len(held))
                local.settle(local_ticket, served)
                shared[index % 2].settle(shared_ticket, served)
                await shared[index % 2].sent()
        await close(*shared)

    asyncio.run(scenario())


def test_every_replica_reads_the_fleets_service_and_it_leaves_the_window(store):
    """Service recorded by either replica is in the record both read: in all, and in the
    window (2 seconds here) until it has passed."""

    async def scenario() -> None:
        a, b = replicas(store)
        a.window = b.window = 2
        a.record_service("chat", "acme", 100.0)
        b.record_service("chat", "acme", 50.0)
        b.record_service("chat", "zeta", 30.0)
        b.record_service("batch", "acme", 7.0)
        await a.sent()
        await b.sent()
        pools = {"chat": ["acme", "zeta", "idle"], "batch": ["acme"]}
        seen = [await replica.fleet_service(pools) for replica in (a, b)]
        assert seen[0] == seen[1]
        found = seen[0]
        assert found is not None
        assert found["chat", "acme"].total == found["chat", "acme"].recent == 150.0
        assert found["chat", "zeta"].total == 30.0 and found["batch", "acme"].total == 7.0
        assert found["chat", "idle"].total == found["chat", "idle"].recent == 0.0
        later = await eventually(
            lambda: a.fleet_service(pools),
            lambda now: now is not None and now["chat", "acme"].recent == 0.0,
            what="the service left the 2-second window",
        )
        assert later["chat", "acme"].total == 150.0  # the total stays
        await close(a, b)

    asyncio.run(scenario())


def test_replicas_apply_each_others_charges_and_not_their_own(store):
    """D2LPM's deficits and the queue's counters shared: what one replica's request was
    charged on a worker reaches the other replica's front (`SharedFronts`), and no
    replica applies its own twice."""

    async def scenario() -> None:
        a, b = replicas(store)
        fronts = {"a": HeardCharges(), "b": HeardCharges()}
        shared = {
            name: SharedFronts(limiter, lambda n=name: {"chat": fronts[n]})  # type: ignore[misc]
            for name, limiter in (("a", a), ("b", b))
        }
        for listener in shared.values():
            assert await listener.poll() == 0  # each starts from now
        settled = SimpleNamespace(pool="chat", worker="http://w0", service=300.0, flow="acme")
        shared["a"].settled(settled)  # type: ignore[arg-type]
        await a.sent()
        assert await shared["b"].poll() == 1 and await shared["a"].poll() == 0
        assert fronts["a"].heard == [] and fronts["b"].heard == [("acme", "http://w0", 300.0)]
        assert await shared["b"].poll() == 0  # read once
        await close(a, b)

    asyncio.run(scenario())


def test_replicas_hear_each_others_holdings_and_forget_a_replica_that_stops(store):
    """Each replica's report of its pool (requests in flight per worker, tenants queued)
    reaches the other through the server; the cap then counts both, a freed slot goes to
    the tenant the other replica holds, and a replica that stops stops counting: at once
    when it closes, within `STATE_SECONDS` when it dies."""

    async def scenario() -> None:
        a, b = replicas(store)
        front_a, front_b = fronts_over_two_workers(2, cap=1, share=False)
        shared = {
            name: SharedFronts(limiter, lambda f=front: {"chat": f})  # type: ignore[misc]
            for name, limiter, front in (("a", a, front_a), ("b", b, front_b))
        }
        for index in range(3):  # bronze fills both workers through a, one waits there
            front_a.arrive(FrontRequest(f"bronze{index}", "bronze", "", 30, 40))
        await shared["a"].exchange()
        await shared["b"].exchange()
        gold = front_b.arrive(FrontRequest("gold", "gold", "", 30, 40))
        assert gold.queued  # b counts a's requests in the cap
        await shared["b"].exchange()  # b tells of gold, waiting there
        await shared["a"].exchange()  # ... and a hears of it
        first = next(flight for flight in front_a._flights.values() if not flight.queued)
        first.settle(Outcome(usage=Usage(30, 0, 40)))
        assert front_a.queue.queued("bronze") == 1  # a holds bronze back for gold
        await shared["a"].exchange()  # a tells of the open slot
        await shared["b"].exchange()  # ... and b, hearing of it, sends gold
        assert not gold.queued
        await shared["a"].close()  # withdraws its report
        await shared["b"].exchange()
        assert front_b.peers is not None and len(front_b.peers) == 0  # type: ignore[arg-type]
        await shared["a"].exchange()  # back, and then silent: forgotten within the lease
        await shared["b"].exchange()
        assert len(front_b.peers) == 1  # type: ignore[arg-type]

        async def heard() -> int:
            await shared["b"].exchange()
            return len(front_b.peers)  # type: ignore[arg-type]

        await eventually(heard, lambda count: count == 0, what="b forgot a, silent")
        await close(a, b)

    asyncio.run(scenario())


def test_a_settlement_another_replica_waits_for_wakes_it_without_a_poll(store, monkeypatch):
    """A slot that frees while another replica holds requests may be that replica's: the
    settling replica publishes its holdings and wakes the others at once (with polling
    made hourly here, only the wake-up can bring the freed slot to replica b in time)."""
    monkeypatch.setattr(shared_fronts, "POLL_SECONDS", 3600.0)

    async def scenario() -> None:
        a, b = replicas(store)
        front_a, front_b = fronts_over_two_workers(2, cap=1, share=False)
        shared = {
            name: SharedFronts(limiter, lambda f=front: {f.name: f})  # type: ignore[misc]
            for name, limiter, front in (("a", a, front_a), ("b", b, front_b))
        }
        for front, listener in ((front_a, shared["a"]), (front_b, shared["b"])):
            front.listeners.append(listener)  # as in the gateway: it hears settlements
        first = [
            front_a.arrive(FrontRequest(f"bronze{index}", "bronze", "", 30, 40))
            for index in range(2)
        ]
        await shared["a"].exchange()
        await shared["b"].exchange()
        gold = front_b.arrive(FrontRequest("gold", "gold", "", 30, 40))
        await shared["b"].exchange()
        await shared["a"].exchange()  # a knows gold waits at b
        await shared["b"].start()  # b now exchanges only when woken
        try:
            assert gold.queued
            await shared["a"].start()
            server = redis.Redis(port=store.port)
            await eventually(  # a wake-up sent before b listens would be lost (polls remain)
                lambda: server.pubsub_numsub(shared["b"].channel)[0][1] >= 2,
                what="both replicas listen",
            )
            first[0].settle(Outcome(usage=Usage(30, 0, 40)))  # a's slot frees: b is told
            await eventually(lambda: not gold.queued, what="b sent gold to the freed slot")
        finally:
            await shared["a"].close()
            await shared["b"].close()
            await close(a, b)

    asyncio.run(scenario())
