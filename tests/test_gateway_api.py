"""The gateway's tenant API on loopback, in front of real `fairpool engine-sim` workers:
the OpenAI surface (with the official client), authentication, permissions, errors,
the tenant tag the engines see, usage-corrected charges, and prefix-following routing."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import openai
import pytest
from gateway_helpers import (
    KEYS,
    MODEL,
    client,
    completion,
    engines,
    gateway,
    gateway_config,
    gateway_metric,
    tenant_entry,
)
from sim_http import metric

from fairpool.sched.routers.d2lpm import AUTO_WORKER_QUANTUM_FLOOR
from fairpool_gateway.openapi import openapi_document

pytestmark = pytest.mark.loopback


@pytest.fixture(scope="module")
def pool():
    with engines(2) as workers:
        config = gateway_config(
            [worker.url for worker in workers],
            [
                tenant_entry("flood"),
                tenant_entry("light", weight=2.0, pools=["main"]),
                tenant_entry("other", pools=[]),
            ],
        )
        with gateway(config) as running:
            yield running, workers


def test_the_openai_client_works_unchanged_streamed_and_not(pool):
    running, _ = pool
    api = openai.OpenAI(base_url=f"{running.url}/v1", api_key=KEYS["light"])
    chat = api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=5
    )
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    stream = api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream to me"}],
        max_tokens=6,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert all(chunk.usage is None for chunk in chunks)  # not asked for: the gateway's own
    streamed_usage = api.completions.create(
        model=MODEL,
        prompt="Count",
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage for chunk in streamed_usage if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 4
    assert [model.id for model in api.models.list()] == [MODEL]


def test_errors_have_openai_bodies_and_the_right_statuses(pool):
    running, _ = pool
    anonymous = httpx.post(f"{running.url}/v1/completions", json=completion("x"))
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "invalid_api_key"
    wrong = httpx.post(
        f"{running.url}/v1/completions",
        json=completion("x"),
        headers={"Authorization": "Bearer sk-not-a-key"},
    )
    assert wrong.status_code == 401
    assert "sk-not-a-key" not in wrong.text
    with client(running, "flood") as api:
        unknown = api.post("/v1/completions", json={**completion("x"), "model": "nope"})
        assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
        malformed = api.post(
            "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert malformed.status_code == 400 and "JSON" in malformed.json()["error"]["message"]
        negative = api.post("/v1/completions", json=completion("x", max_tokens=-1))
        assert negative.status_code == 400 and negative.json()["error"]["param"] == "max_tokens"
        missing = api.post("/v1/chat/completions", json={"model": MODEL})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
        huge = api.post("/v1/completions", json=completion("x" * (5 << 20)))
        assert huge.status_code == 413
    with client(running, "other") as api:  # pools: [] means every pool
        assert api.post("/v1/completions", json=completion("hi")).status_code == 200


def test_a_model_the_tenant_may_not_use_is_answered_as_one_that_does_not_exist():
    with engines(1) as workers:
        urls = [worker.url for worker in workers]
        config = gateway_config(urls, [tenant_entry("flood")])
        document = config.model_dump(by_alias=True)
        document["pools"].append({**document["pools"][0], "name": "second", "model": "m2"})
        document["tenants"] = [tenant_entry("flood", pools=["second"])]
        config = type(config).model_validate(document)
        with gateway(config) as running, client(running, "flood") as api:
            refused = api.post("/v1/completions", json=completion("hi"))
            missing = api.post("/v1/completions", json={**completion("hi"), "model": "nope"})
            # 404 for both: the answer never tells a tenant what others may use.
            assert refused.status_code == missing.status_code == 404
            assert refused.json()["error"]["code"] == missing.json()["error"]["code"]
            assert refused.json()["error"]["code"] == "model_not_found"
            assert [m["id"] for m in api.get("/v1/models").json()["data"]] == ["m2"]


def test_the_engine_sees_the_tenant_of_the_key_never_one_the_client_claims(pool):
    running, workers = pool
    before = sum(
        metric(w.url, "fairpool_engine_tenant_service_total", tenant="light") for w in workers
    )
    with client(running, "flood") as api:
        spoof = completion("pretend", vllm_xargs={"fairpool_tenant": "light"})
        assert api.post("/v1/completions", json=spoof).status_code == 200
    after = sum(
        metric(w.url, "fairpool_engine_tenant_service_total", tenant="light") for w in workers
    )
    assert after == before
    assert sum(
        metric(w.url, "fairpool_engine_tenant_service_total", tenant="flood") for w in workers
    )


def test_charges_follow_the_engines_usage_including_cached_tokens(pool):
    running, _ = pool
    prompt = "You are a careful assistant. " * 40
    with client(running, "other") as api:
        before = gateway_metric(running, "fairpool_gateway_service_total", tenant="other")
        usages = [
            api.post("/v1/completions", json=completion(prompt, max_tokens=3)).json()["usage"]
            for _ in range(2)
        ]
    after = gateway_metric(running, "fairpool_gateway_service_total", tenant="other")
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    assert cached[0] == 0 and cached[1] > 0  # same worker, so the second hit its cache
    expected = sum(
        (u["prompt_tokens"] - c) + 2 * u["completion_tokens"]
        for u, c in zip(usages, cached, strict=True)
    )
    assert after - before == pytest.approx(expected)


def test_routing_follows_prefixes_and_the_hit_metric_counts_only_real_hits(pool):
    running, _ = pool
    documents = [f"Document {name}: " + f"{name} facts and figures. " * 60 for name in "ABCDEF"]

    def routed() -> tuple[float, float, float]:
        decisions = "fairpool_gateway_routing_decisions_total"
        return (
            gateway_metric(running, decisions, prefix="hit"),
            gateway_metric(running, decisions, prefix="miss"),
            gateway_metric(running, "fairpool_gateway_prefix_chars_total", kind="matched"),
        )

    start = routed()
    with client(running, "light") as api:
        for document in documents:  # first sight: nothing of them is cached anywhere
            api.post("/v1/completions", json=completion(document + "Question 0?", max_tokens=1))
        seen = routed()
        for round_ in range(1, 4):
            for document in documents:
                api.post(
                    "/v1/completions",
                    json=completion(document + f"Question {round_}?", max_tokens=1),
                    headers={"x-request-id": f"route-{document[9]}-{round_}"},
                )
    end = routed()
    # Never-seen prompts are misses (the shared "Document " is below minMatchChars), and
    # every repeat is a hit on at least its whole document.
    assert (seen[0] - start[0], seen[1] - start[1], seen[2] - start[2]) == (0, 6, 0)
    assert (end[0] - seen[0], end[1] - seen[1]) == (18, 0)
    assert end[2] - seen[2] >= 3 * sum(len(document) for document in documents)
    pools = httpx.get(f"{running.admin_url}/admin/pools").json()
    assert pools["main"]["prefixTreeChars"] > 0
    # D2LPM's `auto` Q^w in force, in the admin status and in the metrics alike
    quantum = pools["main"]["workerQuantum"]
    assert quantum >= AUTO_WORKER_QUANTUM_FLOOR
    assert metric(running.admin_url, "fairpool_gateway_worker_quantum", pool="main") == quantum


def test_each_document_stays_on_one_worker():
    with engines(3) as workers:
        config = gateway_config([w.url for w in workers], [tenant_entry("light")])
        with gateway(config) as running, client(running, "light") as api:
            for round_ in range(4):
                for name in "PQRSTU":
                    document = f"Manual {name}. " + f"Section on {name}. " * 50
                    api.post(
                        "/v1/completions", json=completion(document + f"Q{round_}", max_tokens=1)
                    )
            served = Counter()
            for worker in workers:
                served[worker.url] = metric(worker.url, "vllm:prompt_tokens_total")
            cached = sum(metric(w.url, "vllm:prefix_cache_hits_total") for w in workers)
            queries = sum(metric(w.url, "vllm:prefix_cache_queries_total") for w in workers)
    # Three of every four requests per document found their prefix on the worker.
    assert cached / queries > 0.6
    assert sum(1 for tokens in served.values() if tokens > 0) >= 2  # spread over workers


def test_the_openapi_document_is_served_and_checked_in(pool):
    running, _ = pool
    served = httpx.get(f"{running.url}/openapi.json").json()
    assert served == openapi_document()
    with open("docs/openapi.json") as checked_in:
        assert json.load(checked_in) == served, "run `make openapi` and commit docs/openapi.json"


def test_probes_and_the_admin_api_stay_on_their_ports(pool):
    running, _ = pool
    assert httpx.get(f"{running.url}/healthz").status_code == 200
    assert httpx.get(f"{running.url}/readyz").status_code == 200
    assert httpx.get(f"{running.url}/metrics").status_code == 404  # no tenant sees others
    assert httpx.get(f"{running.url}/admin/tenants").status_code == 404
    state = httpx.get(f"{running.admin_url}/admin/tenants/light").json()
    assert state["weight"] == 2.0
    assert "fairpool_gateway_requests_total" in httpx.get(f"{running.admin_url}/metrics").text
