"""The tenant API fuzzed from its own OpenAPI document (schemathesis): whatever a client
sends, the gateway answers without a 5xx and without hanging. Bodies that parse as JSON
objects are pointed at the served model, so they reach a real `fairpool engine-sim`."""

from __future__ import annotations

import pytest
import schemathesis
from gateway_helpers import KEYS, MODEL, engines, gateway, gateway_config, tenant_entry
from hypothesis import HealthCheck, settings

from fairpool_gateway.openapi import openapi_document

pytestmark = pytest.mark.loopback

SCHEMA = schemathesis.openapi.from_dict(openapi_document())


@pytest.fixture(scope="module")
def running():
    with engines(1, speedup=1000.0, max_model_len=4096) as workers:
        config = gateway_config([workers[0].url], [tenant_entry("light")])
        with gateway(config) as gateway_thread:
            yield gateway_thread


@SCHEMA.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_5xx_and_no_hang(case, running):
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL
    response = case.call(
        base_url=running.url,
        headers={"Authorization": f"Bearer {KEYS['light']}"},
        timeout=30,
    )
    assert response.status_code < 500, (case.body, response.text)
