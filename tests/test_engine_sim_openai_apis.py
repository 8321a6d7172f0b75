"""`fairpool engine-sim`'s Responses API and embeddings, through the official `openai`
client on loopback: vLLM 0.32's shapes, usage with cached tokens, tenants charged in the
per-tenant metrics as vLLM with fairpool's plugin charges them (embeddings: the uncached
prompt only, with the prefix cache shared within a tenant), and vLLM's errors."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import openai
import pytest
from polling import wait_until
from sim_http import drained, metric, tenant

from fairpool_engine import pooling_tenant
from fairpool_engine.sim.options import SimOptions
from fairpool_engine.sim.server import ServerThread
from fairpool_engine.sim.text import render_chat, tokenize

pytestmark = pytest.mark.loopback

FAST = 1000.0  # model seconds per wall second
BLOCK = 16  # the default profile's KV block
DIM = 32
MANUAL = "Read the manual before you ask. " * 12  # 84 tokens: 5 whole blocks


@pytest.fixture(scope="module")
def server():
    options = SimOptions(speedup=FAST, max_model_len=1024, embedding_dim=DIM)
    with ServerThread(options) as running:
        yield running


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def service(server: ServerThread, who: str) -> float:
    return metric(server.url, "fairpool_engine_tenant_service_total", tenant=who)


def prompt_tokens(*messages: tuple[str, str]) -> int:
    return len(tokenize(render_chat(messages)))


# ---------------------------------------------------------------------- responses


def test_a_response_reports_vllms_shape_and_usage_and_charges_its_tenant(server, client):
    response = client.responses.create(
        model="sim", input="Say hello.", max_output_tokens=5, extra_body=tenant("resp-a")
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete"  # it ran to max_output_tokens
    assert response.incomplete_details.reason == "max_output_tokens"
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert len(tokenize(response.output_text)) == 5
    usage = response.usage
    assert usage.input_tokens == prompt_tokens(("user", "Say hello."))
    assert (usage.output_tokens, usage.total_tokens) == (5, usage.input_tokens + 5)
    assert usage.input_tokens_details.cached_tokens == 0
    assert response.max_output_tokens == 5 and response.tool_choice == "none"
    assert service(server, "resp-a") == usage.input_tokens + 2 * 5


def test_a_repeated_prefix_is_cached_and_charged_only_for_the_rest(server, client):
    question = [{"role": "user", "content": "Why?"}]
    first = client.responses.create(
        model="sim", input=question, instructions=MANUAL, max_output_tokens=2,
        extra_body=tenant("resp-b"),
    )  # fmt: skip
    second = client.responses.create(
        model="sim", input=question, instructions=MANUAL, max_output_tokens=2,
        extra_body=tenant("resp-b"),
    )  # fmt: skip
    tokens = prompt_tokens(("system", MANUAL), ("user", "Why?"))
    assert first.usage.input_tokens == second.usage.input_tokens == tokens
    assert first.usage.input_tokens_details.cached_tokens == 0
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached == (tokens // BLOCK) * BLOCK and cached > 0
    assert second.instructions == MANUAL
    assert service(server, "resp-b") == 2 * tokens - cached + 2 * (2 + 2)


def test_message_items_become_the_conversation_vllm_renders(client):
    conversation = [
        {"role": "user", "content": "Hi"},
        {"type": "message", "role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "input_text", "text": "More"}]},
    ]
    response = client.responses.create(
        model="sim", input=conversation, instructions="Be brief.", max_output_tokens=1
    )
    expected = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello"), ("user", "More")]
    assert response.usage.input_tokens == prompt_tokens(*expected)


def test_a_streamed_response_sends_vllms_events_in_order(server, client):
    stream = client.responses.create(
        model="sim", input="Tell me more.", max_output_tokens=6, stream=True,
        extra_body=tenant("resp-c"),
    )  # fmt: skip
    events = list(stream)
    kinds = [event.type for event in events]
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.usage is None
    text = "".join(event.delta for event in deltas)
    assert len(tokenize(text)) == 6
    item_ids = {event.item_id for event in deltas}
    assert item_ids == {events[2].item.id}
    assert events[-4].text == text and events[-2].item.content[0].text == text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == 6
    assert final.id == events[0].response.id
    tokens = prompt_tokens(("user", "Tell me more."))
    assert final.usage.input_tokens == tokens
    assert service(server, "resp-c") == tokens + 2 * 6


def test_a_response_that_ends_before_its_limit_is_completed():
    with ServerThread(SimOptions(speedup=FAST, eos_after=(3, 3))) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        response = client.responses.create(model="sim", input="Short?", max_output_tokens=50)
    assert response.status == "completed" and response.incomplete_details is None
    assert response.usage.output_tokens == 3


def test_a_closed_response_stream_aborts_its_request():
    with ServerThread(SimOptions(speedup=10.0)) as server:
        request = {"input": "a long story", "max_output_tokens": 5000, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/responses", json=request) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if "output_text.delta" in line)
        wait_until(lambda: drained(server))


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        ({"input": "x", "max_output_tokens": "many"}, 400, "body.max_output_tokens", "integer"),
        ({"model": "sim"}, 400, "body.input", "Field required"),
        ({"input": "x", "max_output_tokens": 5000}, 400, "max_output_tokens", "max_model_len"),
        ({"input": "x", "max_output_tokens": 0}, 400, "max_tokens", "at least 1"),
        ({"input": "word " * 1100}, 400, "input_tokens", "at least 1025 input tokens"),
        ({"input": "x", "previous_response_id": "resp_1"}, 404, "response_id", "not found"),
        ({"input": "x", "background": True}, 400, "background", "store=True"),
        ({"input": []}, 400, None, "empty conversation"),
        ({"input": "x", "tools": [{"type": "function", "name": "f"}]}, 400, "tools", "tools"),
        ({"input": [{"type": "function_call_output"}]}, 400, "input", "function_call_output"),
        ({"input": "x", **tenant("")}, 400, "vllm_xargs.fairpool_tenant", "tenant name"),
        ({"model": "gpt", "input": "x"}, 404, "model", "does not exist"),
    ],
)
def test_responses_refused_as_vllm_refuses_them(server, body, status, param, words):
    response = httpx.post(f"{server.url}/v1/responses", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"] and error["code"] == status


# ---------------------------------------------------------------------- embeddings


def test_embeddings_are_deterministic_unit_vectors_and_charge_only_the_prompt(server, client):
    before = metric(server.url, "vllm:generation_tokens_total")
    result = client.embeddings.create(
        model="sim", input=["a cat sat", "a cat sat", "dogs"], encoding_format="float",
        extra_body=tenant("emb-a"),
    )  # fmt: skip
    first, again, other = (item.embedding for item in result.data)
    assert [item.index for item in result.data] == [0, 1, 2]
    assert len(first) == DIM and math.isclose(math.fsum(x * x for x in first), 1, rel_tol=1e-6)
    assert first == again and first != other
    assert result.usage.prompt_tokens == result.usage.total_tokens == 3 + 3 + 1
    assert service(server, "emb-a") == 7  # prompts only: no output token, no output charge
    assert metric(server.url, "vllm:generation_tokens_total") == before


def test_token_ids_and_base64_give_the_same_vectors(server, client):
    text = client.embeddings.create(model="sim", input="a cat sat", encoding_format="float")
    ids = client.embeddings.create(
        model="sim", input=tokenize("a cat sat"), encoding_format="float"
    )
    assert ids.data[0].embedding == text.data[0].embedding
    # The SDK's default asks for base64 (little-endian float32) and decodes it.
    assert client.embeddings.create(model="sim", input="a cat sat").data[0].embedding == (
        text.data[0].embedding
    )
    raw = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"input": "a cat sat", "encoding_format": "base64", "endianness": "big"},
    ).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f">{DIM}f", packed)) == text.data[0].embedding
    assert raw["id"].startswith("embd-") and raw["usage"]["prompt_tokens_details"] is None


def test_a_repeated_embedding_is_cached_within_its_tenant_only(server, client):
    def embed(who: str) -> float:
        before = service(server, who)
        client.embeddings.create(model="sim", input=MANUAL, extra_body=tenant(who))
        return service(server, who) - before

    tokens = len(tokenize(MANUAL))
    assert embed("emb-b") == tokens
    assert embed("emb-b") == tokens - (tokens // BLOCK) * BLOCK  # whole blocks cached
    assert embed("emb-c") == tokens  # another tenant's salt: nothing shared


def test_an_embedding_is_a_finished_request_in_vllms_metrics(server, client):
    labels = {"model_name": "sim", "engine": "0", "finished_reason": "stop"}
    before = metric(server.url, "vllm:request_success_total", **labels)
    client.embeddings.create(model="sim", input=["one", "two"])
    assert metric(server.url, "vllm:request_success_total", **labels) == before + 2
    wait_until(lambda: drained(server))


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        ({"input": ""}, 400, None, "decoder prompt cannot be empty"),
        ({"input": []}, 400, None, "at least one prompt"),
        ({"input": "x", "dimensions": 8}, 400, None, "Matryoshka"),
        ({"input": "x", "encoding_format": "hex"}, 400, "body.encoding_format", "'float'"),
        ({"input": 5}, 400, "body.input", "valid"),
        ({}, 400, "body.input", "Field required"),
        ({"input": "word " * 1100}, 400, "input_tokens", "at least 1025 input tokens"),
        ({"model": "gpt", "input": "x"}, 404, None, "The model `gpt` does not exist."),
        ({"input": "x", "encoding_format": "bytes"}, 400, "encoding_format", "bytes"),
        ({"input": "x", "cache_salt": "a/b"}, 400, "cache_salt", "at most 128"),
        ({"input": "x", **tenant("")}, 400, "vllm_xargs.fairpool_tenant", "tenant name"),
        ({"input": "x", **tenant("t" * 200)}, 400, "vllm_xargs.fairpool_tenant", "too long"),
        (
            {"input": "x", "cache_salt": pooling_tenant.salt_for("victim")},
            400,
            "cache_salt",
            "fairpool's",
        ),
    ],
)
def test_embeddings_refused_as_vllm_with_fairpool_refuses_them(server, body, status, param, words):
    response = httpx.post(f"{server.url}/v1/embeddings", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"] and error["code"] == status


def test_the_embedding_dimension_is_an_option(server):
    with ServerThread(SimOptions(speedup=FAST, embedding_dim=5)) as small:
        body = httpx.post(f"{small.url}/v1/embeddings", json={"input": "x"}).json()
    assert len(body["data"][0]["embedding"]) == 5
    assert SimOptions().embedding_dim == 768
