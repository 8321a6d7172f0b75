"""Several gateway replicas sharing tenant state in a real Valkey server started by the
test, on loopback, with `fairpool engine-sim` workers: a tenant's limits hold across the
replicas, and losing the server fails no request."""

from __future__ import annotations

import httpx
import pytest
import redis
from gateway_helpers import (
    client,
    completion,
    engines,
    gateway,
    gateway_config,
    gateway_metric,
    tenant_entry,
)
from polling import wait_until

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
