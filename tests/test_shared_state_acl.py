"""The bundled Valkey's ACL, for real: the chart's own command and rule, rendered by Helm,
run a Valkey server here, and two gateways log in with the user and key prefix the chart
has the operator give them. They admit and refuse, settle, renew leases, record service
and hear each other as without the ACL, while what the rule leaves out is refused: a key
or a channel outside the release's prefix, any other command, the default user."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from gateway_helpers import client, completion, engines, gateway, gateway_config, tenant_entry
from gateway_helpers import gateway_metric as metric
from polling import wait_until
from sim_http import held
from test_chart import container_env, env_of, needs_helm, one, render

from fairpool.api.gateway_config import GatewayConfig
from fairpool_cli.local.ports import HOST, free_port
from fairpool_cli.local.store import server_binary
from fairpool_operator.config import OperatorConfig

pytestmark = [pytest.mark.subprocess, needs_helm]

PASSWORD = "s3cret-for-the-test"


@contextlib.contextmanager
def chart_valkey(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The bundled Valkey started by the chart's own command (its port moved to a free one
    on loopback), and the `sharedState` the operator writes into gateway.yaml for it (its
    URL and password file those of this machine)."""
    docs = render(tmp_path, {"gateway": {"replicas": 2}})
    valkey = one(docs, "StatefulSet", "fp-shared-state")
    shell, flag, script = valkey["spec"]["template"]["spec"]["containers"][0]["command"]
    port = free_port()
    moved = script.replace("--port 6379", f"--bind {HOST} --port {port}")
    assert moved != script
    environment = {
        **os.environ,
        "PATH": f"{Path(server_binary()).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "VALKEY_PASSWORD": PASSWORD,
        "GATEWAY_ACL": env_of(valkey)["GATEWAY_ACL"],
    }
    operator = OperatorConfig.from_environment(
        container_env(one(docs, "Deployment", "fp-operator"))
    )
    shared = operator.shared_state()
    assert shared is not None
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    shared.update(url=f"redis://{HOST}:{port}/0", passwordFile=str(password_file))
    process = subprocess.Popen(
        [shell, flag, moved], env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        wait_until(
            lambda: as_gateway(shared).ping(),
            ignoring=(redis.ConnectionError,),
            what="the chart's Valkey serves",
            timeout=30,
        )
        yield shared
    finally:
        process.terminate()
        process.wait(timeout=10)


def as_gateway(shared: dict[str, Any]) -> redis.Redis:
    """A client logged in as the gateways are."""
    return redis.Redis.from_url(shared["url"], username=shared["username"], password=PASSWORD)


def test_gateways_share_state_as_the_charts_acl_user_and_nothing_else(tmp_path):
    with chart_valkey(tmp_path) as shared, engines(1) as workers:
        prefix, username = shared["keyPrefix"], shared["username"]
        assert (prefix, username) == ("serving.fp", "fairpool-gateway")
        config = gateway_config(
            [workers[0].url], [tenant_entry("light", limits={"requestsPerMinute": 6})]
        ).model_copy(
            update={
                "shared_state": GatewayConfig.model_validate(
                    {"sharedState": {**shared, "leaseSeconds": 3, "timeoutSeconds": 10}}
                ).shared_state
            }
        )
        with gateway(config) as a, gateway(config) as b:
            held_request(a, b, workers[0], shared)
            statuses = []
            for index in range(11):  # with the one held above: twelve, six over the limit
                with client((a, b)[index % 2], "light") as api:
                    response = api.post("/v1/completions", json=completion(f"q{index}", 2))
                statuses.append(response.status_code)
            assert sorted(statuses) == [200] * 5 + [429] * 6
            for running, other in ((a, b), (b, a)):
                served = metric(other, "fairpool_gateway_service_total", tenant="light")
                wait_until(
                    lambda r=running: metric(r, "fairpool_gateway_fleet_service_total"),
                    lambda fleet, s=served: fleet >= s > 0,
                    what="each replica reads the fleet's service",
                )
                wait_until(
                    lambda r=running: httpx.get(f"{r.admin_url}/admin/pools").json(),
                    lambda pools: pools["main"]["otherReplicas"] == 1,
                    what="each replica hears the other's holdings",
                )
                shown = httpx.get(f"{running.admin_url}/admin/tenants/light").json()
                assert shown["sharedState"] == "up" and shown["usage"]["requests"] == 6
                assert metric(running, "fairpool_gateway_shared_state_up") == 1
                assert metric(running, "fairpool_gateway_shared_state_ignored_total") == 0
            server = as_gateway(shared)
            assert server.hgetall(f"{prefix}:{{light}}:requests")  # counted under the prefix
        refused_outside_the_prefix(shared)


def held_request(a, b, worker, shared: dict[str, Any]) -> None:
    """A request in flight through `a` while its engine is held: `a` renews its lease
    (the lease's expiry moves on) and `b` counts it on the worker."""
    leases = f"{shared['keyPrefix']}:{{light}}:leases"
    server = as_gateway(shared)
    with ThreadPoolExecutor(1) as pool, client(a, "light") as api:
        with held(worker):
            answer = pool.submit(api.post, "/v1/completions", json=completion("held", 2))
            (_, first), *_ = wait_until(
                lambda: server.zrange(leases, 0, -1, withscores=True), what="a lease"
            )
            wait_until(
                lambda: server.zrange(leases, 0, -1, withscores=True)[0][1],
                lambda expiry: expiry > first,
                what="replica a renewed the lease",
            )
            wait_until(
                lambda: httpx.get(f"{b.admin_url}/admin/pools").json(),
                lambda pools: pools["main"]["workers"][worker.url]["outstandingElsewhere"],
                what="replica b counts a's request on the worker",
            )
        assert answer.result().status_code == 200


def refused_outside_the_prefix(shared: dict[str, Any]) -> None:
    server = as_gateway(shared)
    prefix = shared["keyPrefix"]
    server.hset(f"{prefix}:probe", "field", "1")  # the rule's own keys: allowed
    refusals = {
        "another key": lambda: server.hset("other:probe", "field", "1"),
        "another release's key": lambda: server.hset(f"{prefix}x:probe", "field", "1"),
        "another channel": lambda: server.publish("other:wake", "x"),
        "a command the gateway does not send": lambda: server.set(f"{prefix}:probe2", "1"),
        "listing keys": lambda: server.keys("*"),
        "flushing": lambda: server.flushall(),
        "configuring": lambda: server.config_get("*"),
        "scripts of its own": lambda: server.eval("return 1", 0),
    }
    for what, call in refusals.items():
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()
            pytest.fail(f"{what} was allowed")
    server.publish(f"{prefix}:replicas:wake", "x")  # its channel: allowed
    url = shared["url"]
    for password in (None, PASSWORD):  # the default user is off, whatever the password
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis.from_url(url, password=password).ping()


def test_the_rule_the_docs_give_for_a_server_of_your_own_is_the_charts(tmp_path):
    docs = render(tmp_path, {"gateway": {"replicas": 2, "sharedState": {"keyPrefix": "PREFIX"}}})
    rule = env_of(one(docs, "StatefulSet", "fp-shared-state"))["GATEWAY_ACL"]
    text = (Path(__file__).parent.parent / "docs" / "gateway.md").read_text()
    assert f"\nACL SETUSER {rule} >PASSWORD\n" in text
