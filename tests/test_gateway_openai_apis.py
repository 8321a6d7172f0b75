"""The Responses API and embeddings through the gateway, with the official `openai` client:
the same keys, limits, routing, charging and metrics as chat and completions."""

from __future__ import annotations

import openai
import pytest
from gateway_helpers import (
    KEYS,
    MODEL,
    engines,
    gateway,
    gateway_config,
    gateway_metric,
    tenant_entry,
)

from fairpool_gateway.app import REQUEST_ID

pytestmark = pytest.mark.loopback

SYSTEM = "You answer questions about the harbour of Genoa in two sentences. " * 8


@pytest.fixture(scope="module")
def pool():
    with engines(2, speedup=200.0) as workers:
        config = gateway_config(
            [w.url for w in workers],
            [
                tenant_entry("light"),
                tenant_entry("flood", limits={"requestsPerMinute": 1}),
                tenant_entry("other"),
            ],
        )
        with gateway(config) as running:
            yield running


def api(running, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{running.url}/v1", api_key=KEYS[tenant], max_retries=0)


def charged(running, tenant: str) -> tuple[float, float, float, float]:
    tokens = "fairpool_gateway_tokens_total"
    return (
        gateway_metric(running, tokens, tenant=tenant, kind="prompt"),
        gateway_metric(running, tokens, tenant=tenant, kind="cached"),
        gateway_metric(running, tokens, tenant=tenant, kind="completion"),
        gateway_metric(running, "fairpool_gateway_service_total", tenant=tenant),
    )


def delta(after: tuple[float, ...], before: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(a - b for a, b in zip(after, before, strict=True))


def test_a_response_is_served_and_charged_its_usage(pool):
    before = charged(pool, "light")
    response = api(pool, "light").responses.create(
        model=MODEL, instructions=SYSTEM, input="Where is the lighthouse?", max_output_tokens=8
    )
    usage = response.usage
    assert response.output_text and usage is not None and usage.output_tokens == 8
    cached = usage.input_tokens_details.cached_tokens
    expected = (usage.input_tokens, cached, 8, (usage.input_tokens - cached) + 2 * 8)
    assert delta(charged(pool, "light"), before) == pytest.approx(expected)


def test_a_streamed_response_relays_every_event_and_charges_its_usage(pool):
    before = charged(pool, "light")
    stream = api(pool, "light").responses.create(
        model=MODEL, input="Tell me about the port.", max_output_tokens=12, stream=True
    )
    events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 12
    usage = events[-1].response.usage
    assert usage is not None and usage.output_tokens == 12
    cached = usage.input_tokens_details.cached_tokens
    expected = (usage.input_tokens, cached, 12, (usage.input_tokens - cached) + 2 * 12)
    assert delta(charged(pool, "light"), before) == pytest.approx(expected)


def test_embeddings_are_served_and_charged_their_prompt_only(pool):
    before = charged(pool, "light")
    result = api(pool, "light").embeddings.create(
        model=MODEL, input=["the harbour at dawn", "ships and cranes"]
    )
    assert [item.index for item in result.data] == [0, 1]
    assert len(result.data[0].embedding) > 0
    prompt = result.usage.prompt_tokens
    assert delta(charged(pool, "light"), before) == pytest.approx((prompt, 0, 0, prompt))


def test_a_conversation_shares_its_prefix_between_chat_and_responses(pool):
    """The gateway keys both APIs' prompts in the chat template's order: a conversation
    asked through chat goes, through the Responses API, to the worker that cached it."""
    client = api(pool, "other")
    question = "Which quay do the ferries use?"
    chat = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=4,
    )
    assert chat.headers[REQUEST_ID]
    response = client.responses.create(
        model=MODEL, instructions=SYSTEM, input=question, max_output_tokens=4
    )
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens > 0


def test_limits_apply_to_every_api(pool):
    client = api(pool, "flood")
    client.embeddings.create(model=MODEL, input="one")
    with pytest.raises(openai.RateLimitError) as refused:
        client.responses.create(model=MODEL, input="two", max_output_tokens=2)
    assert refused.value.response.headers["retry-after"]
    assert refused.value.body["code"] == "requests_per_minute"


def test_a_bad_field_is_refused_naming_it(pool):
    with pytest.raises(openai.BadRequestError) as refused:
        api(pool, "light").responses.create(model=MODEL, input="x", max_output_tokens=-1)
    assert refused.value.body["param"] == "max_output_tokens"
    with pytest.raises(openai.BadRequestError) as refused:
        api(pool, "light").embeddings.create(
            model=MODEL,
            input="x",
            extra_body={"encoding_format": "hex"},
        )
    assert refused.value.body["param"] == "encoding_format"
