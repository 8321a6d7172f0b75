"""The Responses API and embeddings through real vLLM with fairpool's plugin: the tenant
reaches the scheduler on both (`vllm_xargs` on responses; on embeddings, where vLLM has
no `vllm_xargs`, through the middleware's `cache_salt`), each is charged as engine-sim
charges it, and the streamed events come in the order engine-sim sends them."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from .conftest import MODEL_NAME, Server
from .test_vllm_plugin import metric, write_config

pytestmark = pytest.mark.vllm

SERVICE = "fairpool_engine_tenant_service_total"


@pytest.fixture(scope="module")
def generating(server_factory, scratch: Path) -> Server:
    return server_factory("responses", config=write_config(scratch / "vtc.json", policy="vtc"))


@pytest.fixture(scope="module")
def pooling(server_factory, scratch: Path) -> Server:
    config = write_config(scratch / "vtc-pool.json", policy="vtc")
    return server_factory(
        "embed", config=config, extra=("--runner", "pooling", "--convert", "embed")
    )


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_a_response_is_charged_to_the_tenant_in_its_xargs(generating: Server):
    extra = {"vllm_xargs": {"fairpool_tenant": "resp"}, "ignore_eos": True}
    response = client(generating).responses.create(
        model=MODEL_NAME, input="def handler(event):", max_output_tokens=6, extra_body=extra
    )
    usage = response.usage
    assert response.status == "incomplete" and usage.output_tokens == 6
    uncached = usage.input_tokens - usage.input_tokens_details.cached_tokens
    assert metric(generating.metrics(), SERVICE, tenant="resp") == uncached + 2 * 6


def test_a_streamed_response_has_the_event_order_engine_sim_sends(generating: Server):
    extra = {"vllm_xargs": {"fairpool_tenant": "resp-stream"}, "ignore_eos": True}
    events = list(
        client(generating).responses.create(
            model=MODEL_NAME,
            input="import os",
            max_output_tokens=4,
            stream=True,
            extra_body=extra,
        )
    )
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    usage = events[-1].response.usage
    uncached = usage.input_tokens - usage.input_tokens_details.cached_tokens
    assert metric(generating.metrics(), SERVICE, tenant="resp-stream") == uncached + 2 * 4


def test_bad_fairpool_xargs_on_responses_get_a_400(generating: Server):
    body = {"model": MODEL_NAME, "input": "x", "vllm_xargs": {"fairpool_tenant": ""}}
    response = httpx.post(f"{generating.url}/v1/responses", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "vllm_xargs.fairpool_tenant"


def test_an_embedding_is_charged_to_its_tenant_for_its_prompt_only(pooling: Server):
    text = "the quick brown fox jumps over the lazy dog " * 4
    embed = client(pooling).embeddings

    def charged(who: str) -> tuple[float, int]:
        before = metric(pooling.metrics(), SERVICE, tenant=who)
        result = embed.create(
            model=MODEL_NAME, input=text, extra_body={"vllm_xargs": {"fairpool_tenant": who}}
        )
        return metric(pooling.metrics(), SERVICE, tenant=who) - before, result.usage.prompt_tokens

    service, prompt = charged("emb-a")
    assert prompt > 0 and service == prompt  # no output token, nothing cached yet
    service, prompt = charged("emb-b")  # the same text: another tenant's salt, no hit
    assert service == prompt
    assert metric(pooling.metrics(), SERVICE, tenant="default") == 0


def test_bad_fairpool_xargs_on_embeddings_get_a_400(pooling: Server):
    body = {"model": MODEL_NAME, "input": "x", "vllm_xargs": {"fairpool_tenant": 5}}
    response = httpx.post(f"{pooling.url}/v1/embeddings", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "vllm_xargs.fairpool_tenant"
