"""API keys from files (`apiKeyFiles`, a mounted Secret): comments are not keys, the files
are followed while the gateway runs (a removed key stops working), and a key two tenants
list is refused — by the configuration for digests, by the table for files."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import httpx
import pytest
from gateway_helpers import KEYS, engines, gateway, gateway_config, tenant_entry
from polling import wait_until

from fairpool.api.gateway_config import GatewayConfig, key_digest
from fairpool.api.validation import validate
from fairpool.sched.errors import ConfigError

pytestmark = pytest.mark.loopback


def write_keys(path: Path, *lines: str) -> None:
    """Replace the file whole, as the kubelet swaps a mounted Secret."""
    fresh = path.with_suffix(".new")
    fresh.write_text("".join(f"{line}\n" for line in lines))
    os.replace(fresh, path)


def status(url: str, key: str) -> int:
    return httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code


@pytest.fixture(scope="module")
def worker():
    with engines(1) as workers:
        yield workers[0].url


def test_comment_and_blank_lines_are_not_keys(worker, tmp_path):
    keys = tmp_path / "light"
    write_keys(keys, "# rotated 2026-01-01", "", "   ", "sk-file-light", "  # indented comment")
    config = gateway_config([worker], [tenant_entry("light", apiKeyFiles=[str(keys)])])
    with gateway(config) as running:
        assert status(running.url, "sk-file-light") == 200
        for comment in ("# rotated 2026-01-01", "# indented comment", "#"):
            assert status(running.url, comment) == 401, comment


def test_a_key_removed_from_its_file_stops_working_and_an_added_one_starts(worker, tmp_path):
    keys = tmp_path / "light"
    write_keys(keys, "sk-old-light", "sk-kept-light")
    config = gateway_config([worker], [tenant_entry("light", apiKeyFiles=[str(keys)])])
    with gateway(config) as running:
        assert status(running.url, "sk-old-light") == 200
        write_keys(keys, "sk-kept-light", "sk-new-light")
        wait_until(
            lambda: status(running.url, "sk-old-light"),
            lambda code: code == 401,
            what="the removed key refused",
        )
        assert status(running.url, "sk-new-light") == 200
        assert status(running.url, "sk-kept-light") == 200
        assert status(running.url, KEYS["light"]) == 200  # the digests listed stay
        keys.unlink()  # the Secret gone: its keys go with it
        wait_until(
            lambda: status(running.url, "sk-kept-light"),
            lambda code: code == 401,
            what="the keys of a vanished file refused",
        )
        assert status(running.url, KEYS["light"]) == 200


def test_a_key_in_two_tenants_files_authenticates_neither(worker, tmp_path, caplog):
    light, flood = tmp_path / "light", tmp_path / "flood"
    write_keys(light, "sk-shared", "sk-only-light")
    write_keys(flood, "sk-shared", "sk-only-flood")
    config = gateway_config(
        [worker],
        [
            tenant_entry("light", apiKeyFiles=[str(light)]),
            tenant_entry("flood", apiKeyFiles=[str(flood)]),
        ],
    )
    with caplog.at_level(logging.ERROR, logger="fairpool.gateway"), gateway(config) as running:
        assert status(running.url, "sk-shared") == 401
        assert status(running.url, "sk-only-light") == 200
        assert status(running.url, "sk-only-flood") == 200
        assert status(running.url, KEYS["flood"]) == 200
    (message,) = [r.getMessage() for r in caplog.records if "listed under tenants" in r.message]
    assert "'light' and 'flood'" in message and "sk-shared" not in message


def test_a_file_key_that_is_another_tenants_digest_is_refused_too(worker, tmp_path):
    light = tmp_path / "light"
    write_keys(light, KEYS["flood"], "sk-only-light")
    config = gateway_config(
        [worker], [tenant_entry("light", apiKeyFiles=[str(light)]), tenant_entry("flood")]
    )
    with gateway(config) as running:
        assert status(running.url, KEYS["flood"]) == 401
        assert status(running.url, "sk-only-light") == 200


def test_one_digest_under_two_tenants_is_refused_naming_both():
    digest = key_digest("sk-shared")
    document = {
        "tenants": [
            {"tenant": "acme", "apiKeySha256": [key_digest("sk-acme"), digest]},
            {"tenant": "globex", "apiKeySha256": [digest]},
        ]
    }
    with pytest.raises(ConfigError) as refused:
        validate(GatewayConfig, document, "gateway.yaml")
    assert str(refused.value).startswith("gateway.yaml: tenants.1.apiKeySha256: ")
    assert "'acme' and 'globex'" in str(refused.value)
    document["tenants"][1]["apiKeySha256"] = [key_digest("sk-globex")]
    validate(GatewayConfig, document, "gateway.yaml")
    same = {"tenants": [{"tenant": "acme", "apiKeySha256": [digest, digest]}]}
    validate(GatewayConfig, same, "gateway.yaml")  # one tenant twice: harmless
