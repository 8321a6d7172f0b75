"""A placement pool at the gateway: JFFC over chains of different speed and capacity
(seed 003, Alg. 3), behind the fair queue, with engine-sim workers on loopback."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from gateway_helpers import (
    MODEL,
    client,
    completion,
    engines,
    gateway,
    gateway_config,
    gateway_metric,
    tenant_entry,
)
from polling import wait_until
from sim_http import held

from fairpool.api.gateway_config import GatewayPool
from fairpool.api.validation import validate
from fairpool.sched.errors import ConfigError

pytestmark = pytest.mark.loopback

SLOW = {"capacity": 2, "serviceRate": 0.5}
FAST = {"capacity": 3, "serviceRate": 2.0}


def chain_config(slow: str, fast: str, **pool_fields: object):
    chains = [
        {"name": "chain-0", "url": slow, **SLOW},
        {"name": "chain-1", "url": fast, **FAST},
    ]
    return gateway_config(
        [slow, fast],
        [tenant_entry("flood"), tenant_entry("light")],
        routing={"policy": "jffc"},
        chains=chains,
        **pool_fields,
    )


def test_an_idle_pool_sends_every_request_to_the_fastest_chain() -> None:
    with engines(2) as (slow, fast), gateway(chain_config(slow.url, fast.url)) as running:
        with client(running, "light") as http:
            for number in range(4):
                assert (
                    http.post("/v1/completions", json=completion(f"q{number}")).status_code == 200
                )
        decisions = {
            url: gateway_metric(running, "fairpool_gateway_routing_decisions_total", worker=url)
            for url in (slow.url, fast.url)
        }
    assert decisions == {slow.url: 0, fast.url: 4}


def test_a_burst_fills_chains_fastest_first_never_past_capacity_and_queues_the_rest() -> None:
    """The engines are held (they take no step) while the burst arrives, so no request
    finishes and no chain's count of requests can go down: the state once all 12 are in
    is the peak of the burst, whatever order and pace they arrived in (a thread that
    sampled the counts every few milliseconds could miss a peak, or see one it should)."""
    with (
        engines(2, speedup=20.0) as (slow, fast),
        gateway(chain_config(slow.url, fast.url)) as running,
    ):
        pool = running.gateway.pools["main"]

        def placed() -> dict[str, int]:
            workers = pool.front.router.workers
            return {
                slow.url: workers[slow.url].outstanding,
                fast.url: workers[fast.url].outstanding,
                "queued": pool.front.queue.queued(),
            }

        full = {slow.url: SLOW["capacity"], fast.url: FAST["capacity"], "queued": 12 - 5}
        with client(running, "flood") as http, ThreadPoolExecutor(12) as senders:
            with held(slow, fast):
                answers = [
                    senders.submit(
                        http.post, "/v1/completions", json=completion(f"burst {n}", max_tokens=48)
                    )
                    for n in range(12)
                ]
                # Both chains full and the rest in the fair queue. Past capacity, a chain
                # would stay past it (nothing finishes): the wait would fail, showing it.
                wait_until(placed, lambda seen: seen == full, what=f"the burst placed as {full}")
            statuses = [answer.result().status_code for answer in answers]
    assert statuses == [200] * 12


def test_chains_are_validated_against_the_workers_and_the_router() -> None:
    base = {"name": "p", "model": MODEL, "workers": {"urls": ["http://a:1"]}}
    chain = {"name": "chain-0", "url": "http://a:1", "capacity": 1, "serviceRate": 1.0}
    with pytest.raises(ConfigError, match="jffc"):
        validate(GatewayPool, {**base, "chains": [chain]}, "pool")
    with pytest.raises(ConfigError, match=r"not among workers\.urls"):
        validate(
            GatewayPool,
            {**base, "routing": {"policy": "jffc"}, "chains": [{**chain, "url": "http://b:1"}]},
            "pool",
        )
    with pytest.raises(ConfigError, match="capacity"):
        validate(
            GatewayPool,
            {**base, "routing": {"policy": "jffc"}, "chains": [{**chain, "capacity": 0}]},
            "pool",
        )
