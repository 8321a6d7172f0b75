"""Several gateway replicas sharing tenant state in a real Valkey server started by the
test, on loopback, with `fairpool engine-sim` workers: a tenant's limits hold across the
replicas, losing the server fails no request, and the weights hold whichever replica
each tenant comes through: kept by fair engines, or by the replicas' shared queues in
front of a stock engine."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis
from gateway_helpers import (
    async_client,
    client,
    completion,
    engines,
    gateway,
    gateway_config,
    gateway_metric,
    tenant_entry,
)
from polling import eventually, wait_until
from sim_http import Finishes, held

from fairpool.api.gateway_config import GatewayConfig
from fairpool_cli.local.store import LocalStore

pytestmark = pytest.mark.subprocess


def shared(config: GatewayConfig, store: LocalStore, replicas: int = 2) -> GatewayConfig:
    return config.model_copy(
        update={
            "shared_state": GatewayConfig.model_validate(
                # a generous timeout: a loaded test machine must not look like an outage
                {"sharedState": {"url": store.url, "replicas": replicas, "timeoutSeconds": 10}}
            ).shared_state
        }
    )


def test_a_requests_per_minute_limit_holds_across_two_replicas():
    limits = {"requestsPerMinute": 6}
    with LocalStore() as store, engines(1) as workers:
        config = shared(
            gateway_config([w.url for w in workers], [tenant_entry("light", limits=limits)]),
            store,
        )
        with gateway(config) as a, gateway(config) as b:
            statuses = []
            for index in range(12):
                with client((a, b)[index % 2], "light") as api:
                    response = api.post("/v1/completions", json=completion(f"q{index}", 2))
                statuses.append((response.status_code, response.json().get("error", {})))
            answered = [status for status, _ in statuses if status == 200]
            refused = [error for status, error in statuses if status == 429]
            assert len(answered) == 6 and len(refused) == 6
            assert {error["code"] for error in refused} == {"requests_per_minute"}
            # each replica refused some: neither could have held the limit alone
            assert {index % 2 for index, (status, _) in enumerate(statuses) if status == 429} == {
                0,
                1,
            }
            for running in (a, b):
                assert gateway_metric(running, "fairpool_gateway_shared_state_up") == 1
                # each replica's admin API shows the tenant's usage as all of them count it
                shown = httpx.get(f"{running.admin_url}/admin/tenants/light").json()
                assert shown["sharedState"] == "up" and shown["usage"]["requests"] == 6


def test_losing_the_shared_state_fails_no_request_and_it_comes_back():
    limits = {"concurrent": 8}
    with LocalStore() as store, engines(1) as workers:
        config = shared(
            gateway_config([w.url for w in workers], [tenant_entry("light", limits=limits)]),
            store,
        )
        with gateway(config) as running, client(running, "light") as api:
            assert api.post("/v1/completions", json=completion("before", 2)).status_code == 200
            store.stop()
            for index in range(5):  # the local fallback admits them
                response = api.post("/v1/completions", json=completion(f"during {index}", 2))
                assert response.status_code == 200, response.text
            ready = httpx.get(f"{running.admin_url}/readyz").json()
            assert ready["status"] == "ready" and ready["sharedState"] == "down"
            assert "divided by 2" in ready["fallback"]
            assert gateway_metric(running, "fairpool_gateway_shared_state_up") == 0
            store.start()
            wait_until(
                lambda: httpx.get(f"{running.admin_url}/readyz").json()["sharedState"],
                lambda state: state == "up",
                what="the replica reached the shared state again",
            )
            assert api.post("/v1/completions", json=completion("after", 2)).status_code == 200
            # the request after the return was counted in the server again
            assert redis.Redis(port=store.port).exists("fairpool:{light}:requests")


REQUESTS = 40  # per tenant
JUDGED = 25  # completions: both tenants still have requests left at any ratio up to 4 : 1


@pytest.mark.parametrize(
    ("engine_policy", "fair_engines", "share"),
    [("vtc", True, True), ("fcfs", False, True), ("fcfs", False, False)],
    ids=["fair-engines", "stock-engine-shared-queue", "stock-engine-replicas-alone"],
)
def test_weights_hold_with_each_tenant_through_its_own_replica(
    tmp_path, engine_policy, fair_engines, share
):
    """The shape the field gets wrong: weights 4 : 1, two gateway replicas capping a
    worker at one request, one tenant entering through each.

    - Fair engines (VTC in the engine, `fairEngines`): each tenant keeps up to
      `tenantWaiting` requests waiting in the engine (the default 8: more than the 4 it
      admits at once), refilled as they start, and the engine's weights decide: as many
      as 4.57 : 1, what the engine gives the same 80 requests sent to it directly.
    - A stock engine (first come, first served) behind replicas that share their queues:
      the cap counts both replicas' requests, and a freed slot goes to the tenant that is
      furthest below its share whichever replica holds it (`fairpool.front.peers`).
    - The same without shared state: each replica keeps one request of its own tenant
      in the engine, and the engine, never choosing, serves them 1 : 1.

    Every request is at a gateway before the engine runs (held), and the judgement is in
    the engine's own order of events, at its 25th completion (the most the flood could
    have had done by then is 25 of its 40, so both tenants were backlogged throughout)."""
    scheduler = tmp_path / "scheduler.yaml"
    scheduler.write_text(f"policy: {engine_policy}\ntenants: {{flood: 4, light: 1}}\n")
    # 500 KV tokens hold about four of these requests (50 + 64 tokens) at a time.
    options = {"profile": "llama2-7b-a10g", "memory_tokens": 500, "max_model_len": 256}
    with LocalStore() as store, engines(1, speedup=5.0, scheduler_config=str(scheduler),
                                        **options) as workers:  # fmt: skip
        config = gateway_config(
            [workers[0].url],
            [tenant_entry("flood", 4.0), tenant_entry("light", 1.0)],
            routing={"saturation": {"maxOutstanding": 1}, "queueTimeoutSeconds": 300},
            fairEngines=fair_engines,
        )
        if share:
            config = shared(config, store)
        runner = workers[0].sim.runner
        finishes = Finishes(runner, ("flood", "light"))
        with gateway(config) as a, gateway(config) as b:
            runner.engine.listener = finishes
            try:
                asyncio.run(flood_through({"flood": a, "light": b}, workers[0]))
            finally:
                runner.engine.listener = runner
            if share:
                check_fleet_state_is_shared(a, b, workers[0].url)
    served, _ = finishes.events[JUDGED - 1]
    ratio = served["flood"] / served["light"]
    print(f"{engine_policy} engine, shared {share}: flood : light = {ratio:.2f} at {JUDGED}")
    if share:
        assert ratio > 3.0
    else:
        assert ratio < 1.6


def check_fleet_state_is_shared(a, b, worker: str) -> None:
    """One dashboard for the fleet, and one routing table: replica a reports what b
    served light, and b, which never routed flood, spent flood's D2LPM credit."""
    served_by_b = gateway_metric(b, "fairpool_gateway_service_total", tenant="light")
    assert served_by_b > 0
    wait_until(
        lambda: gateway_metric(a, "fairpool_gateway_fleet_service_total", tenant="light"),
        lambda fleet: fleet == served_by_b,
        what="replica a reads light's service through b from the shared state",
    )
    shown = httpx.get(f"{a.admin_url}/admin/pools").json()["main"]
    assert shown["otherReplicas"] == 1  # each replica hears the other's holdings
    router = b.gateway.pools["main"].front.router
    wait_until(
        lambda: router.tenant_state().get("flood", {}).get(worker, 0.0),
        lambda deficit: deficit < 0,
        what="replica b charged flood's service through a",
    )


async def flood_through(replicas: dict[str, object], worker) -> None:
    """`REQUESTS` streamed requests of each tenant through its replica, all of them at
    the gateway or in the engine before the engine takes its first step."""
    policy = worker.sim.runner.engine.policy

    async def one(api: httpx.AsyncClient, tenant: str, index: int) -> None:
        body = completion(f"{tenant} {index} " + "word " * 48, 64, stream=True)
        async with api.stream("POST", "/v1/completions", json=body) as response:
            await response.aread()
            assert response.status_code == 200, response.text

    def arrived(tenant: str) -> int:
        front = replicas[tenant].gateway.pools["main"].front  # type: ignore[attr-defined]
        return front.queue.queued(tenant) + policy.tenant_waiting(tenant)

    clients = {tenant: async_client(running, tenant) for tenant, running in replicas.items()}
    try:
        with held(worker):
            tasks = [
                asyncio.create_task(one(clients[tenant], tenant, index))
                for tenant in replicas
                for index in range(REQUESTS)
            ]
            for tenant in replicas:
                await eventually(lambda t=tenant: arrived(t), lambda n: n == REQUESTS)
        await asyncio.gather(*tasks)
    finally:
        for api in clients.values():
            await api.aclose()
