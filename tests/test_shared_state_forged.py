"""The shared state is not trusted: forged entries written into a real Valkey server next to
the replicas that share it — a report of a replica that is not live, charges of 1e300 or
NaN, buckets and leases no replica writes, keys of another type, records that are not
numbers — are ignored (and removed where the replicas' scripts can tell), counted, and
logged without flooding the log; no tenant is refused or slowed by them. Also: a request
that can never fit its tenant's tokens-per-minute limit is refused alone."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest
import redis
from front_helpers import replicas as fronts_over_two_workers
from gateway_helpers import (
    client,
    completion,
    engines,
    gateway,
    gateway_config,
    gateway_metric,
    tenant_entry,
)
from hypothesis import given
from hypothesis import strategies as st
from polling import wait_until
from shared_state_helpers import HeardCharges, admit, close, replicas, request

from fairpool.api.gateway_config import GatewayConfig
from fairpool.api.tenant_quota import TenantLimits
from fairpool.front import FrontRequest, Rejection, TenantLimiter
from fairpool.front.peers import ReplicaState
from fairpool.sched.cost import CostModel
from fairpool_cli.local.store import LocalStore
from fairpool_gateway import heard, shared_fronts
from fairpool_gateway.heard import Ignored, Untrusted
from fairpool_gateway.shared_fronts import SharedFronts
from fairpool_gateway.shared_limits import SharedLimiter

pytestmark = pytest.mark.subprocess

FORGED_ID = "f0f0f0f0f0f0"  # a replica id no replica has (theirs are random)


@pytest.fixture(scope="module")
def store() -> Iterator[LocalStore]:
    with LocalStore() as server:
        yield server


@pytest.fixture(autouse=True)
def empty(store: LocalStore) -> None:
    redis.Redis(port=store.port).flushdb()


def server_now(server: redis.Redis) -> float:
    seconds, micros = server.time()
    return seconds + micros / 1e6


# --------------------------------------------------------------------- replica reports


def test_a_report_of_no_live_replica_is_removed_and_never_heard(store, monkeypatch):
    """Reports that no live replica renews — in the holdings hash without an entry in the
    replicas set, or with an expiry further ahead than a report lives — are deleted by the
    first exchange after them; one over the byte bound too; a live one that is not a
    replica's report (a NaN counter) is ignored. The replicas hear each other only."""
    monkeypatch.setattr(shared_fronts, "REPORT_BYTES", 2000)

    async def scenario() -> None:
        a, b = replicas(store)
        front_a, front_b = fronts_over_two_workers(2, cap=4, share=False)
        shared = {
            name: SharedFronts(limiter, lambda f=front: {"chat": f})  # type: ignore[misc]
            for name, limiter, front in (("a", a, front_a), ("b", b, front_b))
        }
        await shared["b"].exchange()
        server = redis.Redis(port=store.port)
        replicas_key, holdings = shared["a"]._state_keys("chat")
        full = ReplicaState({"w0": 1000, "w1": 1000}).to_json()
        now = server_now(server)
        server.hset(holdings, "deadbeef0001", full)  # no entry in the live set: for ever
        server.zadd(replicas_key, {"deadbeef0002": now + 1e9})  # "live" for 30 years
        server.hset(holdings, "deadbeef0002", full)
        server.zadd(replicas_key, {"deadbeef0003": now + 0.5})  # live, but too long a report
        server.hset(holdings, "deadbeef0003", " " * 2001)
        server.zadd(replicas_key, {"deadbeef0004": now + 0.5})  # live, but no report
        server.hset(holdings, "deadbeef0004", '{"inFlight": {}, "queued": {"t": [1, NaN]}}')
        await shared["a"].exchange()
        peers = front_a.peers
        assert peers is not None and len(peers) == 1  # b alone
        assert peers.in_flight("w0") == 0
        assert server.hkeys(holdings) and not {
            b"deadbeef0001",
            b"deadbeef0002",
            b"deadbeef0003",
        } & set(server.hkeys(holdings))
        assert server.zscore(replicas_key, "deadbeef0002") is None
        # 1; 2's entry in the set, then its report; 3 (those by the script); 4 when parsed
        assert a.ignored.totals["report"] == 5
        await close(a, b)

    asyncio.run(scenario())


def test_keys_of_another_type_are_replaced_not_failed_on(store):
    """A key that no replica writes as it is (a string where a hash, a set or a stream
    belongs) is deleted by the script that finds it: no call fails, no replica falls back
    to deciding alone or to its local limits."""

    async def scenario() -> None:
        a, b = replicas(store)
        front_a, front_b = fronts_over_two_workers(2, cap=4, share=False)
        shared = {
            name: SharedFronts(limiter, lambda f=front: {"chat": f})  # type: ignore[misc]
            for name, limiter, front in (("a", a, front_a), ("b", b, front_b))
        }
        server = redis.Redis(port=store.port)
        state_keys = shared["a"]._state_keys("chat")
        for key in (shared["a"].key("chat"), *state_keys, *a._keys("gold")):
            server.set(key, "forged")
        assert await shared["b"].poll() == 0
        await shared["a"].exchange()
        await shared["b"].exchange()
        assert len(front_b.peers) == 1  # type: ignore[arg-type]
        limits = TenantLimits(requestsPerMinute=5, tokensPerMinute=1000, concurrent=2)
        await admit(a, request("gold", limits))
        shared["a"].settled(settlement("gold", 30.0))
        await a.sent()
        assert await shared["b"].poll() == 1
        assert a.up and b.up
        assert a.ignored.totals["refused"] == 0
        assert a.ignored.totals["limits"] == 3 and a.ignored.totals["report"] == 2
        await close(a, b)

    asyncio.run(scenario())


# --------------------------------------------------------------------- charges


def settlement(tenant: str, service: float) -> SimpleNamespace:
    return SimpleNamespace(pool="chat", worker="http://w0", service=service, flow=tenant)


def test_charges_no_replica_writes_are_ignored_and_the_next_applied(store):
    """Charges of 1e300, NaN, infinity, below zero or not a number, from no replica's id,
    of a tenant the gateway does not have, or too large to be one are read past: none is
    applied, each is counted, and the genuine charge after them is applied. A stream
    whose last entry's id lies ahead of the server's clock (the largest id: no replica
    could add after it) is deleted, and the replicas' charges go on."""

    async def scenario() -> None:
        a, b = replicas(store)
        fronts = {"a": HeardCharges(), "b": HeardCharges()}
        shared = {
            name: SharedFronts(
                limiter,
                lambda n=name: {"chat": fronts[n]},  # type: ignore[misc]
                lambda: {"acme", "globex"},
            )
            for name, limiter in (("a", a), ("b", b))
        }
        assert await shared["b"].poll() == 0
        server = redis.Redis(port=store.port)
        genuine = {"replica": FORGED_ID, "tenant": "acme", "worker": "http://w0"}
        forged = [
            {**genuine, "service": "1e300"},
            {**genuine, "service": "nan"},
            {**genuine, "service": "inf"},
            {**genuine, "service": "-500"},
            {**genuine, "service": "0"},
            {**genuine, "service": "lots"},
            {**genuine, "service": "10", "replica": "not-a-replica"},
            {**genuine, "service": "10", "tenant": "stranger"},
            {**genuine, "service": "10", "worker": "w" * 5000},
            {"replica": FORGED_ID, "service": "10"},
            {**genuine, "service": "10", **{f"extra{index}": "x" for index in range(10)}},
        ]
        for fields in forged:
            server.xadd(shared["a"].key("chat"), fields)  # type: ignore[arg-type]
        shared["a"].settled(settlement("globex", 250.0))
        await a.sent()
        assert await shared["b"].poll() == 1
        assert fronts["b"].heard == [("globex", "http://w0", 250.0)]
        assert b.ignored.totals["charge"] == len(forged)
        # An entry at the largest id: no replica could add one after it. The stream goes.
        largest = f"{2**64 - 1}-{2**64 - 1}"
        server.xadd(shared["a"].key("chat"), {**genuine, "service": "10"}, id=largest)
        shared["a"].settled(settlement("acme", 20.0))
        await a.sent()
        assert a.ignored.totals["refused"] == 0
        assert await shared["b"].poll() == 1
        assert fronts["b"].heard[-1] == ("acme", "http://w0", 20.0)
        await close(a, b)

    asyncio.run(scenario())


def test_a_charge_beyond_what_a_request_can_cost_is_told_as_the_most_there_is(store):
    """A replica's own charge past what one request can cost (its output limit charged
    for want of usage) would be ignored by the others: it tells the bound instead."""

    async def scenario() -> None:
        a, b = replicas(store)
        fronts = {"a": HeardCharges(), "b": HeardCharges()}
        shared = {
            name: SharedFronts(limiter, lambda n=name: {"chat": fronts[n]})  # type: ignore[misc]
            for name, limiter in (("a", a), ("b", b))
        }
        assert await shared["b"].poll() == 0
        shared["a"].settled(settlement("acme", 2e12))
        await a.sent()
        assert await shared["b"].poll() == 1
        assert fronts["b"].heard == [("acme", "http://w0", CostModel().most_service())]
        assert b.ignored.totals["charge"] == 0
        await close(a, b)

    asyncio.run(scenario())


@given(
    st.dictionaries(
        st.sampled_from(["replica", "tenant", "worker", "service", "other"]),
        st.one_of(st.text(max_size=30), st.binary(max_size=30), st.floats(), st.integers()),
    )
)
def test_any_entry_is_a_charge_within_bounds_or_untrusted(fields):
    try:
        charge = heard.charge(fields, 1e6)
    except Untrusted as error:
        assert error.kind == "charge"
        return
    assert 0 < charge.service <= 1e6 and math.isfinite(charge.service)
    assert heard.REPLICA_ID.fullmatch(charge.replica) and charge.tenant and charge.worker


# --------------------------------------------------------------------- limits


def test_forged_buckets_and_leases_are_removed_before_they_count(store):
    """A tokens bucket of a second still to come (it would never leave the window), a
    bucket that is not a count as replicas write them (the script's increments would fail
    on it), leases that expire later than a lease lasts (they would hold slots for ever):
    the limits script removes them and says so; the tenant is admitted as if they had
    never been written, and its usage shows its own alone."""

    async def scenario() -> None:
        (limiter,) = replicas(store, count=1)
        limits = TenantLimits(requestsPerMinute=5, tokensPerMinute=1000, concurrent=2)
        requests, tokens, leases = limiter._keys("acme")
        server = redis.Redis(port=store.port)
        second = int(server_now(server))
        server.hset(tokens, str(second + 3600), 10**12)
        server.hset(tokens, "soon", 5)
        server.hset(tokens, str(second), "1e3")  # Lua reads 1000; HINCRBY refuses it
        server.hset(requests, str(second), "1.5")
        server.hset(requests, str(second - 1), "nan")
        server.hset(requests, f" {second - 2}", "0x10")
        server.zadd(leases, {"forged-1": math.inf, "forged-2": second + 10**6})
        await admit(limiter, request("acme", limits, tokens=900))
        assert limiter.up
        assert limiter.ignored.totals["limits"] == 8
        usage = await limiter.shared_state("acme")
        assert usage == {"requests": 1.0, "tokens": 900.0, "concurrent": 1.0}
        await limiter.close()

    asyncio.run(scenario())


def test_readings_of_the_fleets_record_that_are_not_numbers_are_ignored(store):
    """The fleet's record and a tenant's usage as read for the metrics and the admin API:
    a total of NaN or infinity, a bucket that is not a second or not a number, a lease
    of a far future count for nothing; and the next service recorded replaces a total
    that is not a number rather than failing the script."""

    async def scenario() -> None:
        (limiter,) = replicas(store, count=1)
        served, recent = limiter._service_keys("acme", "chat")
        requests, _, leases = limiter._keys("acme")
        server = redis.Redis(port=store.port)
        second = int(server_now(server))
        server.hset(served, mapping={"chat": "nan", "batch": "inf"})
        server.hset(recent, mapping={"later": "5", str(second): "nan", str(second - 1): "7"})
        server.hset(requests, mapping={"x": "1", str(second): "y"})
        server.zadd(leases, {"forged": second + 10**6})
        pools = {"chat": ["acme"], "batch": ["acme"]}
        found = await limiter.fleet_service(pools)
        assert found is not None
        assert (found["chat", "acme"].total, found["chat", "acme"].recent) == (0.0, 7.0)
        assert (found["batch", "acme"].total, found["batch", "acme"].recent) == (0.0, 0.0)
        usage = await limiter.shared_state("acme")
        assert usage == {"requests": 0.0, "tokens": 0.0, "concurrent": 0.0}
        assert limiter.ignored.totals["service"] == 4
        assert limiter.ignored.totals["usage"] == 3
        limiter.record_service("chat", "acme", 40.0)
        await limiter.sent()
        assert limiter.up and float(server.hget(served, "chat") or 0) == 40.0
        await limiter.close()

    asyncio.run(scenario())


def test_a_request_that_can_never_fit_is_refused_alone(store):
    """A request whose tokens alone exceed the tenant's tokens per minute (`max_tokens:
    10**9`) is refused, and the tenant's next requests are not: one rule for the shared
    limiter and the in-memory one (`TENANT_WIDE`). Neither does a tokens-per-minute
    refusal of a large request refuse a small one that fits."""
    limits = TenantLimits(tokensPerMinute=1000)

    async def scenario() -> None:
        shared, other = replicas(store)
        local = TenantLimiter()
        for limiter in (shared, local):
            oversized = request("acme", limits, output_limit=10**9)
            with pytest.raises(Rejection, match="on their own"):
                await try_admit(limiter, oversized)
            limiter.check("acme", limits)  # the tenant is not refused
            await try_admit(limiter, request("acme", limits, tokens=600))
            with pytest.raises(Rejection) as refused:  # 600 + 600 > 1000: wait
                await try_admit(limiter, request("acme", limits, tokens=600))
            assert refused.value.reason == "tokens_per_minute"
            limiter.check("acme", limits)
            await try_admit(limiter, request("acme", limits, tokens=300))  # 900: fits
        await close(shared, other)

    asyncio.run(scenario())


async def try_admit(limiter: SharedLimiter | TenantLimiter, front_request: FrontRequest) -> None:
    if isinstance(limiter, SharedLimiter):
        await admit(limiter, front_request)
    else:
        limiter.admit(front_request.tenant, front_request.limits, front_request.reserved_tokens)


def test_a_reservation_beyond_any_count_keeps_the_shared_state_up(store):
    """An output limit of 10**20 tokens (nothing bounds a client's max_tokens) is counted
    as the most the server counts: the script's whole-number counts do not overflow, and
    the replica does not fall back to its local limits for every tenant."""

    async def scenario() -> None:
        (limiter,) = replicas(store, count=1)
        ticket = await admit(limiter, request("acme", TenantLimits(), output_limit=10**20))
        assert limiter.up
        limiter.settle(ticket, 10**20)
        await limiter.sent()
        assert limiter.up
        await limiter.close()

    asyncio.run(scenario())


# --------------------------------------------------------------------- the log


def test_a_flood_of_ignored_entries_is_one_warning_per_kind_and_interval(caplog):
    clock = SimpleNamespace(now=0.0)
    counted: list[tuple[str, int]] = []
    ignored = Ignored(lambda kind, times: counted.append((kind, times)), lambda: clock.now)
    with caplog.at_level(logging.WARNING, logger="fairpool.gateway"):
        for _ in range(1000):
            ignored("charge", "service 1e300")
        ignored("report", "a report")
        clock.now = heard.WARN_INTERVAL - 0.001
        ignored("charge", "service nan")
        clock.now = heard.WARN_INTERVAL
        ignored("charge", "service inf")
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 3
    assert "charge" in warnings[0] and "report" in warnings[1]
    assert "1000 more ignored since the last warning" in warnings[2]
    assert ignored.totals == {"charge": 1002, "report": 1}
    assert sum(times for kind, times in counted if kind == "charge") == 1002


# --------------------------------------------------------------------- running replicas


def test_forged_entries_next_to_running_replicas_affect_no_tenant():
    """Two gateways sharing their queues in front of one engine capped at one request,
    with forged entries written into their server while they run: a report of a replica
    that is not live saying the worker is full (it stopped every tenant until deleted by
    hand), charges of 1e300 (they spun a replica's event loop for ever) and NaN (they
    turned a tenant's requests into 500s), a far-future lease and bucket. Every request
    of both tenants through both replicas is answered, and each replica counts what it
    ignored."""
    tenants = [
        tenant_entry("flood", 4.0, limits={"concurrent": 4, "tokensPerMinute": 10**6}),
        tenant_entry("light", 1.0, limits={"concurrent": 4}),
    ]
    with LocalStore() as store, engines(1) as workers:
        config = gateway_config(
            [workers[0].url],
            tenants,
            routing={"saturation": {"maxOutstanding": 1}, "queueTimeoutSeconds": 30},
        )
        config = config.model_copy(
            update={
                "shared_state": GatewayConfig.model_validate(
                    {"sharedState": {"url": store.url, "replicas": 2, "timeoutSeconds": 10}}
                ).shared_state
            }
        )
        with gateway(config) as a, gateway(config) as b:
            for running in (a, b):  # each has heard the other: both write their reports
                wait_until(
                    lambda r=running: httpx.get(f"{r.admin_url}/admin/pools").json(),
                    lambda pools: pools["main"]["otherReplicas"] == 1,
                )
            forge(redis.Redis(port=store.port), workers[0].url)
            wait_until(  # whichever replica exchanged first removed them
                lambda: ignored(a, "report") + ignored(b, "report"),
                lambda count: count == 3,
                what="the forged reports removed",
            )
            for running in (a, b):
                wait_until(
                    lambda r=running: ignored(r, "charge"),
                    lambda count: count == 4,
                    what="each replica ignored the forged charges",
                )
            statuses = []
            for index in range(8):
                for tenant in ("flood", "light"):
                    with client((a, b)[index % 2], tenant) as api:
                        response = api.post("/v1/completions", json=completion(f"q{index}", 2))
                    statuses.append(response.status_code)
            assert statuses == [200] * 16
            assert ignored(a, "limits") + ignored(b, "limits") >= 3
            for running in (a, b):
                shown = httpx.get(f"{running.admin_url}/admin/pools").json()["main"]
                assert shown["otherReplicas"] == 1
                assert gateway_metric(running, "fairpool_gateway_shared_state_up") == 1
                deficits = running.gateway.pools["main"].front.router.tenant_state()
                assert all(math.isfinite(value) for d in deficits.values() for value in d.values())


def forge(server: redis.Redis, worker: str) -> None:
    """What the live probes wrote: a report of a replica that is not live, saying the worker
    is full; charges of 1e300 and NaN for both tenants; a far-future lease and bucket."""
    prefix = "fairpool"
    pool = f"{prefix}:pool:{{main}}"
    full = ReplicaState({worker: 1000}, {"flood": (1000, -1e18)}).to_json()
    server.hset(f"{pool}:holdings", FORGED_ID, full)
    server.zadd(f"{pool}:replicas", {"deadbeef0002": time.time() + 1e9})
    server.hset(f"{pool}:holdings", "deadbeef0002", full)
    for tenant in ("flood", "light"):
        for service in ("1e300", "nan"):
            fields = {"replica": FORGED_ID, "tenant": tenant, "worker": worker, "service": service}
            server.xadd(f"{pool}:charges", fields)  # type: ignore[arg-type]
    server.zadd(f"{prefix}:{{flood}}:leases", {"forged": math.inf})
    server.hset(f"{prefix}:{{flood}}:tokens", str(int(time.time()) + 3600), 10**12)
    server.hset(f"{prefix}:{{light}}:requests", "soon", "x")


def ignored(running, kind: str) -> float:
    return gateway_metric(running, "fairpool_gateway_shared_state_ignored_total", kind=kind)
