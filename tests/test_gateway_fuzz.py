"""The tenant API fuzzed from its own OpenAPI document (schemathesis, which covers
`/v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/v1/embeddings`, `/v1/models`
and the probes): bodies that fit the request models and bodies that break them (every
generation mode), with fixed seeds (`derandomize=True`, no example database).

After every case: no 5xx (the engines are healthy `fairpool engine-sim` workers, so a 5xx
is the gateway's own), every ledger back to zero (nothing queued, no worker outstanding,
no tenant holding a concurrency slot, read from the admin API and awaited, since a stream
may still be settling), and no worker out of rotation. Bodies that parse as JSON objects
with a `model` are pointed at the served model, so that they reach the engines.

`EXAMPLES` cases per operation; the module runs in about half a minute.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fuzz_clients import SCALE, Admin, admin, with_settings
from gateway_helpers import (
    KEYS,
    MODEL,
    UNDAMPED,
    engines,
    gateway,
    gateway_config,
    tenant_entry,
)
from hypothesis import HealthCheck, settings

from fairpool_gateway.openapi import openapi_document
from fairpool_gateway.server import GatewayThread

pytestmark = pytest.mark.fuzz

SCHEMA = schemathesis.openapi.from_dict(openapi_document())
EXAMPLES = 100


@pytest.fixture(scope="module")
def running() -> Iterator[tuple[GatewayThread, Admin]]:
    with engines(1, speedup=1000.0, max_model_len=4096) as workers:
        config = gateway_config([workers[0].url], [tenant_entry("light", limits={"concurrent": 4})])
        config = with_settings(config, clients={"refusalBurst": UNDAMPED})
        with gateway(config) as gateway_thread, admin(gateway_thread) as api:
            yield gateway_thread, api


@SCHEMA.parametrize()
@settings(
    max_examples=EXAMPLES * SCALE,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)
def test_no_5xx_and_every_ledger_back_to_zero(
    case: Any, running: tuple[GatewayThread, Admin]
) -> None:
    gateway_thread, api = running
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL
    response = case.call(
        base_url=gateway_thread.url,
        headers={"Authorization": f"Bearer {KEYS['light']}"},
        timeout=30,
    )
    assert response.status_code < 500, (case.body, response.text)
    api.wait_for_zero_ledgers(case.body)
    assert not api.unhealthy_workers(), case.body
