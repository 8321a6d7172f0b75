"""The ASGI middleware `fairpool engine` puts in front of vLLM's OpenAI server: bad
fairpool xargs refused on every generation and embeddings path, and on embeddings the
tenant (and the band it asks) moved into `cache_salt`, where vLLM's scheduler can read it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from fairpool_engine import pooling_tenant
from fairpool_engine.vllm.middleware import TenantXargsMiddleware

pytestmark = pytest.mark.unit


class Recorder:
    """vLLM's app: records the request it is handed and answers 200."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] | None = None
        self.body = b""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scope = scope
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def call(path: str, document: Any, chunks: int = 1) -> tuple[Recorder, int, Any]:
    app = Recorder()
    body = json.dumps(document).encode()
    size = -(-len(body) // chunks)
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    messages = [
        {"type": "http.request", "body": part, "more_body": index < len(parts) - 1}
        for index, part in enumerate(parts)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    asyncio.run(TenantXargsMiddleware(app)(scope, receive, send))
    status = sent[0]["status"]
    return app, status, json.loads(sent[1]["body"])


@pytest.mark.parametrize(
    "path", ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings"]
)
def test_bad_fairpool_xargs_get_vllms_400_on_every_path(path):
    app, status, body = call(path, {"input": "x", "vllm_xargs": {"fairpool_tenant": ""}})
    assert status == 400 and app.scope is None
    assert body["error"]["param"] == "vllm_xargs.fairpool_tenant"
    assert body["error"]["type"] == "BadRequestError" and body["error"]["code"] == 400


def test_a_generation_request_passes_through_unchanged():
    document = {"input": "x", "vllm_xargs": {"fairpool_tenant": "acme"}, "cache_salt": "s"}
    app, status, _ = call("/v1/responses", document, chunks=3)
    assert status == 200 and json.loads(app.body) == document


def test_an_embeddings_tenant_travels_in_the_cache_salt():
    document = {"input": "x", "vllm_xargs": {"fairpool_tenant": "acme"}}
    app, status, _ = call("/v1/embeddings", document, chunks=2)
    assert status == 200 and app.scope is not None
    forwarded = json.loads(app.body)
    assert pooling_tenant.tenant_in(forwarded["cache_salt"]) == "acme"
    assert {**forwarded, "cache_salt": None} == {**document, "cache_salt": None}
    length = dict(app.scope["headers"])[b"content-length"]
    assert int(length) == len(app.body)


def test_a_clients_own_salt_is_kept_digested_and_within_vllms_limits():
    tenant = "t" * 63  # the longest tenant name fairpool gives out
    document = {"input": "x", "vllm_xargs": {"fairpool_tenant": tenant}, "cache_salt": "c" * 128}
    app, _, _ = call("/v1/embeddings", document)
    salt = json.loads(app.body)["cache_salt"]
    assert pooling_tenant.tenant_in(salt) == tenant
    assert len(salt) <= 128 and not set("@/\\\0") & set(salt)
    other = {**document, "cache_salt": "d"}
    assert json.loads(call("/v1/embeddings", other)[0].body)["cache_salt"] != salt


def test_an_embeddings_band_travels_in_the_cache_salt_with_its_tenant():
    """The longest tenant name, the longest band and a client's salt still fit; the salt
    gives back exactly the xargs it carries."""
    tenant = "t" * 63
    asked = {"fairpool_tenant": tenant, "fairpool_band": "interactive"}
    document = {"input": "x", "vllm_xargs": asked, "cache_salt": "c" * 128}
    app, status, _ = call("/v1/embeddings", document)
    salt = json.loads(app.body)["cache_salt"]
    assert status == 200 and pooling_tenant.xargs_in(salt) == asked
    assert len(salt) <= 128 and not set("@/\\\0") & set(salt)
    band_only = {"input": "x", "vllm_xargs": {"fairpool_band": "batch"}}
    salt = json.loads(call("/v1/embeddings", band_only)[0].body)["cache_salt"]
    assert pooling_tenant.xargs_in(salt) == {"fairpool_tenant": "default", "fairpool_band": "batch"}
    bad_band = {"input": "x", "vllm_xargs": {"fairpool_tenant": "a", "fairpool_band": "gold"}}
    _, status, body = call("/v1/embeddings", bad_band)
    assert status == 400 and body["error"]["param"] == "vllm_xargs.fairpool_band"


def test_tenants_with_characters_vllm_refuses_in_salts_are_quoted():
    app, _, _ = call("/v1/embeddings", {"input": "x", "vllm_xargs": {"fairpool_tenant": "a/b@c"}})
    salt = json.loads(app.body)["cache_salt"]
    assert pooling_tenant.tenant_in(salt) == "a/b@c" and not set("@/") & set(salt)


def test_embeddings_without_a_tenant_pass_and_fairpools_salts_cannot_be_forged():
    app, status, _ = call("/v1/embeddings", {"input": "x", "cache_salt": "mine"})
    assert status == 200 and json.loads(app.body) == {"input": "x", "cache_salt": "mine"}
    forged = {"input": "x", "cache_salt": pooling_tenant.salt_for("victim")}
    app, status, body = call("/v1/embeddings", forged)
    assert status == 400 and body["error"]["param"] == "cache_salt" and app.scope is None


def test_a_tenant_too_long_for_a_salt_is_refused_naming_the_field():
    long = {"input": "x", "vllm_xargs": {"fairpool_tenant": "t" * 200}}
    _, status, body = call("/v1/embeddings", long)
    assert status == 400 and body["error"]["param"] == "vllm_xargs.fairpool_tenant"


def test_malformed_json_is_left_to_vllm():
    app = Recorder()

    async def run() -> None:
        messages = [{"type": "http.request", "body": b"{nope", "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        async def send(message: dict[str, Any]) -> None:
            pass

        scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": []}
        await TenantXargsMiddleware(app)(scope, receive, send)

    asyncio.run(run())
    assert app.body == b"{nope"
