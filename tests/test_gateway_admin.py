"""The admin API's protection: a bearer token from `admin.tokenFile` (followed when the file
changes), loopback only without one, never on the tenant API's port; and the operator
reading the gateway's /metrics with the token."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import yaml
from gateway_helpers import engines, gateway, gateway_config, logging_kept, tenant_entry

from fairpool.api.gateway_config import GatewayConfig
from fairpool.api.validation import validate
from fairpool.sched.errors import ConfigError
from fairpool_gateway.server import check_startup
from fairpool_operator.served import fetch_served

pytestmark = pytest.mark.loopback


def write_token(path: Path, token: str) -> None:
    """Replace the file whole, as the kubelet swaps a mounted Secret."""
    fresh = path.with_suffix(".new")
    fresh.write_text(token + "\n")
    os.replace(fresh, path)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def protected(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("admin") / "token"
    write_token(token_file, "first-token")
    with engines(1) as workers:
        config = gateway_config([workers[0].url], [tenant_entry("light")])
        config = config.model_copy(
            update={"admin": config.admin.model_copy(update={"token_file": str(token_file)})}
        )
        with gateway(config) as running:
            yield running, token_file


def test_every_admin_route_wants_the_token(protected):
    running, token_file = protected
    write_token(token_file, "first-token")
    routes = ("/metrics", "/admin/tenants", "/admin/tenants/light", "/admin/pools", "/admin/status")
    for path in routes:
        refused = httpx.get(f"{running.admin_url}{path}")
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"] == "Bearer"
        assert "first-token" not in refused.text
        wrong = httpx.get(f"{running.admin_url}{path}", headers=bearer("first-token-not"))
        assert wrong.status_code == 401, path
        assert httpx.get(f"{running.admin_url}{path}", headers=bearer("first-token")).is_success
    basic = httpx.get(f"{running.admin_url}/metrics", headers={"Authorization": "Basic eDp5"})
    assert basic.status_code == 401


def test_the_probes_stay_open_for_the_kubelet_and_name_nothing(protected):
    running, token_file = protected
    write_token(token_file, "first-token")
    for url in (running.url, running.admin_url):  # the chart probes the admin port
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
        assert httpx.get(f"{url}/readyz").json() == {"status": "ready"}  # no pool, no server
    assert httpx.get(f"{running.url}/metrics").status_code == 404  # never on the tenant port
    detailed = httpx.get(f"{running.admin_url}/readyz", headers=bearer("first-token")).json()
    assert detailed["pools"] == {"main": {"workersInRotation": 1}}
    status = httpx.get(f"{running.admin_url}/admin/status", headers=bearer("first-token")).json()
    assert status["pools"] == detailed["pools"] and status["clients"]["connections"]["admin"] >= 1


def test_a_rotated_token_takes_effect_and_an_unreadable_one_lets_nobody_in(protected):
    running, token_file = protected
    write_token(token_file, "first-token")
    assert httpx.get(f"{running.admin_url}/metrics", headers=bearer("first-token")).is_success
    write_token(token_file, "second-token")
    assert (
        httpx.get(f"{running.admin_url}/metrics", headers=bearer("first-token")).status_code == 401
    )
    assert httpx.get(f"{running.admin_url}/metrics", headers=bearer("second-token")).is_success
    token_file.unlink()
    gone = httpx.get(f"{running.admin_url}/metrics", headers=bearer("second-token"))
    assert gone.status_code == 503
    write_token(token_file, "")
    empty = httpx.get(f"{running.admin_url}/metrics", headers={"Authorization": "Bearer"})
    assert empty.status_code == 503
    write_token(token_file, "first-token")
    assert httpx.get(f"{running.admin_url}/metrics", headers=bearer("first-token")).is_success


def test_the_operator_reads_the_served_numbers_with_the_token(protected, tmp_path):
    running, token_file = protected
    write_token(token_file, "first-token")
    assert fetch_served(running.admin_url) is None  # refused without it: the last numbers stay
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    assert fetch_served(running.admin_url, str(wrong)) is None
    assert fetch_served(running.admin_url, str(tmp_path / "missing")) is None
    assert fetch_served(running.admin_url, str(token_file)) is not None


# ------------------------------------------------------------------ configuration refusals


def load(document: dict) -> GatewayConfig:
    return validate(GatewayConfig, document, "gateway.yaml")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.example.com"])
def test_a_reachable_admin_address_needs_a_token_file(host):
    with pytest.raises(ConfigError, match=r"^gateway\.yaml: admin\.tokenFile: required when"):
        load({"admin": {"host": host}})
    assert load({"admin": {"host": host, "tokenFile": "/run/token"}}).admin.host == host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_a_loopback_admin_address_needs_none(host):
    assert load({"admin": {"host": host}}).admin.token_file is None


def test_the_default_admin_address_is_loopback():
    config = load({})
    assert (config.admin.host, config.admin.port, config.admin.token_file) == (
        "127.0.0.1",
        8081,
        None,
    )


@pytest.mark.parametrize("hosts", [("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "127.0.0.1")])
def test_the_admin_api_never_shares_the_tenant_apis_port(hosts):
    listen, admin = hosts
    with pytest.raises(ConfigError, match=r"^gateway\.yaml: admin\.port: .*listen\.port 9000"):
        load({"listen": {"host": listen, "port": 9000}, "admin": {"host": admin, "port": 9000}})
    assert load({"listen": {"port": 0}, "admin": {"port": 0}}).admin.port == 0  # any free ones


def test_the_command_line_ports_and_the_token_file_are_checked_at_start(tmp_path):
    config = load({"listen": {"port": 9000}, "admin": {"port": 9001}})
    with pytest.raises(ConfigError, match=r"^--port: .*share port 9001"):
        check_startup(config, 9001, 9001, port_given=True)
    with pytest.raises(ConfigError, match=r"^--admin-port: .*share port 9000"):
        check_startup(config, 9000, 9000, port_given=False)
    check_startup(config, 0, 0, port_given=True)
    missing = load({"admin": {"host": "0.0.0.0", "tokenFile": str(tmp_path / "none")}})
    with pytest.raises(ConfigError, match=r"^admin\.tokenFile: cannot read"):
        check_startup(missing, 8080, 8081, port_given=False)
    (tmp_path / "empty").write_text("\n")
    empty = load({"admin": {"host": "0.0.0.0", "tokenFile": str(tmp_path / "empty")}})
    with pytest.raises(ConfigError, match=r"^admin\.tokenFile: .* is empty"):
        check_startup(empty, 8080, 8081, port_given=False)


def test_fairpool_gateway_refuses_shared_ports_naming_the_option(tmp_path, capsys):
    from fairpool_cli.main import main

    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"listen": {"port": 9100}, "admin": {"port": 9101}}))
    with logging_kept():
        assert main(["gateway", "--config", str(path), "--port", "9101"]) == 2
    assert "--port: the tenant and admin APIs would share port 9101" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({"listen": {"port": 9100}, "admin": {"port": 9100}}))
    with logging_kept():
        assert main(["gateway", "--config", str(path)]) == 2
    assert "admin.port: the admin API must not share" in capsys.readouterr().err
