"""`fairpool load`: tenants from flags, files and manifests; prompt shapes; and runs over
real HTTP on loopback against `fairpool engine-sim` servers and the gateway."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
from typing import Any

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
from polling import wait_until
from rich.console import Console
from sim_http import metric

from fairpool.sched.errors import ConfigError
from fairpool.sim.trace import TraceRequest, write_trace
from fairpool_cli.load import (
    LoadResult,
    LoadSpec,
    OutgoingRequest,
    PromptShape,
    RequestResult,
    Sender,
    TenantSpec,
    run_load,
)
from fairpool_cli.load.live import LiveView
from fairpool_cli.load.prompts import TraceText, prompt_source, request_body
from fairpool_cli.load.spec import check_url
from fairpool_cli.load.stats import TenantStats
from fairpool_cli.load.tenants import (
    parse_tenant_flag,
    read_tenants_file,
    resolve_tenants,
    tenants_from_manifests,
)
from fairpool_cli.main import main
from fairpool_engine.sim.text import render_chat, tokenize

pytestmark = pytest.mark.subprocess

URL = "http://127.0.0.1:9/v1"  # never contacted: for specs that are only built


def run(url: str, *tenants: TenantSpec, **fields: Any) -> LoadResult:
    spec = LoadSpec(url=url, tenants=tenants, **fields)
    return asyncio.run(run_load(spec))


# --- tenants and flags ---------------------------------------------------------------


def test_a_tenant_flag_names_every_part():
    name, fields = parse_tenant_flag(
        "flood:key=sk-flood,weight=1.5,rate=20,prompt-tokens=100,output-tokens=8"
    )
    assert name == "flood"
    assert fields == {
        "key": "sk-flood",
        "weight": 1.5,
        "rate": 20.0,
        "prompt_tokens": 100,
        "output_tokens": 8,
    }
    tenants = resolve_tenants([parse_tenant_flag("light:concurrency=4"), (name, fields)], {})
    assert tenants[0] == TenantSpec("light", concurrency=4)
    assert tenants[1].open_loop and tenants[1].rate == 20.0


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--tenant", "flood:rate=fast"], ["--tenant flood", "rate"]),
        (["--tenant", "flood:rate=-2"], ["--tenant flood", "rate"]),
        (["--tenant", "flood:speed=2"], ["--tenant flood", "speed"]),
        (["--tenant", "flood:rate"], ["--tenant flood", "rate"]),
        (["--tenant", "flood:rate=2,concurrency=3"], ["--tenant flood", "not both"]),
        (["--tenant", "flood:concurrency=2.5"], ["--tenant flood", "concurrency"]),
        (["--tenant", "flood:weight=0,rate=1"], ["--tenant flood", "weight"]),
        (["--tenant", "a:rate=1", "--tenant", "a:rate=2"], ["--tenant a", "twice"]),
        (["--tenant", ":rate=1"], ["--tenant"]),
        ([], ["--tenant", "no tenants"]),
        (["--tenant", "a:rate=1", "--url", "ftp://host/v1"], ["--url", "http"]),
        (["--tenant", "a:rate=1", "--duration", "-1"], ["--duration"]),
        (["--tenant", "a:rate=1", "--requests", "0"], ["--requests"]),
        (["--tenant", "a:rate=1", "--duration", "5", "--warmup", "5"], ["--warmup"]),
        (["--tenant", "a:rate=1", "--output-tokens", "0"], ["--output-tokens"]),
        (["--tenant", "a:rate=1", "--output-weight", "-1"], ["--output-weight"]),
        (["--tenant", "a:rate=1", "--tenants-file", "/nonexistent"], ["--tenants-file"]),
        (["--tenant", "a:rate=1", "--keys-from", "/nonexistent"], ["--keys-from"]),
        (["--tenant", "a:rate=1", "--trace", "/nonexistent"], ["--trace"]),
        (["--tenant", "a:rate=1"], ["--model", "could not list the models"]),  # none there
        (["--tenant", "a:rate=1", "--json", "/nonexistent/out.json"], ["--json", "folder"]),
    ],
)
def test_bad_flags_are_errors_naming_the_flag(capsys, flags, named):
    arguments = ["load", "--url", URL, *flags] if "--url" not in flags else ["load", *flags]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    for text in named:
        assert text in error


def test_flags_argparse_checks_name_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["load", "--url", URL, "--tenant", "a:rate=1", "--shape", "spiral"])
    assert "--shape" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["load", "--tenant", "a:rate=1"])
    assert "--url" in capsys.readouterr().err


def test_urls_are_http_with_v1_by_default():
    assert check_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080/v1"
    assert check_url("https://my.host/v1/") == "https://my.host/v1"
    assert check_url("http://127.0.0.1:8000/api/v1") == "http://127.0.0.1:8000/api/v1"
    for bad in ("file:///etc/passwd", "127.0.0.1:8080", "http://", "http://h/v1?x=1"):
        with pytest.raises(ConfigError, match="--url"):
            check_url(bad)


def test_a_run_needs_a_bound_and_arrivals():
    with pytest.raises(ConfigError, match="--duration"):
        LoadSpec(URL, (TenantSpec("a", rate=1),), duration=None)
    with pytest.raises(ConfigError, match="--tenant a"):
        LoadSpec(URL, (TenantSpec("a"),))
    assert LoadSpec(URL, (TenantSpec("a", rate=1),), duration=None, requests=5).requests == 5


def test_tenants_file_and_keys_from_manifests(tmp_path):
    manifests = tmp_path / "tenants.yaml"
    manifests.write_text(
        "apiVersion: fairpool.io/v1alpha1\nkind: TenantQuota\nmetadata: {name: acme}\n"
        "spec: {weight: 2, apiKeySecretRef: {name: acme-keys}}\n---\n"
        "apiVersion: v1\nkind: Secret\nmetadata: {name: acme-keys}\n"
        "stringData: {key: sk-acme}\n---\n"
        "apiVersion: fairpool.io/v1alpha1\nkind: TenantQuota\nmetadata: {name: globex}\n"
        "spec: {weight: 1}\n"
    )
    known = tenants_from_manifests([str(manifests)])
    assert known == {"acme": {"weight": 2.0, "key": "sk-acme"}, "globex": {"weight": 1.0}}
    everyone = resolve_tenants([], known, default_concurrency=3)
    assert everyone == (
        TenantSpec("acme", key="sk-acme", weight=2.0, concurrency=3),
        TenantSpec("globex", weight=1.0, concurrency=3),
    )
    listed = tmp_path / "load.yaml"
    listed.write_text("- {name: acme, rate: 5}\n- {name: other, key: sk-o, concurrency: 2}\n")
    tenants = resolve_tenants(read_tenants_file(listed), known)
    assert tenants == (
        TenantSpec("acme", key="sk-acme", weight=2.0, rate=5.0),
        TenantSpec("other", key="sk-o", concurrency=2),
    )
    listed.write_text("tenants:\n- {name: acme, rate: none}\n")
    with pytest.raises(ConfigError, match=r"load.yaml: tenants\[0\] \(acme\): rate"):
        read_tenants_file(listed)


def test_trace_tenants_take_keys_but_not_arrivals():
    known = {"a": {"key": "sk-a", "weight": 2.0}}
    assert resolve_tenants([], known, ["a", "b"]) == (
        TenantSpec("a", key="sk-a", weight=2.0),
        TenantSpec("b"),
    )
    with pytest.raises(ConfigError, match="--tenant a: rate"):
        resolve_tenants([parse_tenant_flag("a:rate=2")], known, ["a"])
    with pytest.raises(ConfigError, match="--tenant c: not a tenant of the trace"):
        resolve_tenants([parse_tenant_flag("c:key=x")], known, ["a"])


# --- prompts -------------------------------------------------------------------------


def prompts_of(shape: str, count: int, seed: int = 0, **sizes: int) -> list[str]:
    spec = LoadSpec(URL, (TenantSpec("a", rate=1),), shape=PromptShape(shape, **sizes), seed=seed)
    source = prompt_source(spec, spec.tenants[0])
    texts = []
    for _ in range(count):
        prompt = source.next()
        texts.append(render_chat(prompt.messages))
        source.finished(prompt, "an answer")
    return texts


def common_prefix_tokens(first: str, second: str) -> int:
    shared = 0
    for a, b in zip(tokenize(first), tokenize(second), strict=False):
        if a != b:
            break
        shared += 1
    return shared


def test_shapes_share_what_they_should_and_are_deterministic():
    sizes = {"prompt_tokens": 200, "question_tokens": 10}
    shared = prompts_of("shared-prefix", 3, **sizes)
    assert common_prefix_tokens(shared[0], shared[1]) >= 200
    assert shared[0] != shared[1]
    assert prompts_of("shared-prefix", 3, **sizes) == shared  # same seed, same text
    assert prompts_of("shared-prefix", 3, seed=1, **sizes) != shared
    documents = prompts_of("documents", 20, documents=2, **sizes)
    assert len({text.split("Question")[0] for text in documents}) == 2
    random_texts = prompts_of("random", 3, **sizes)
    assert common_prefix_tokens(random_texts[0], random_texts[1]) < 16
    assert 200 <= len(tokenize(random_texts[0])) <= 205  # words are tokens (+ the template)


def test_multi_turn_conversations_grow_by_their_answers_and_end():
    chats = prompts_of("multi-turn", 4, turns=3, prompt_tokens=50, question_tokens=5)
    for earlier, later in itertools.pairwise(chats[:3]):
        assert later.startswith(earlier.removesuffix("<|assistant|>\n"))
        assert "an answer" in later
    assert common_prefix_tokens(chats[2], chats[3]) < 16  # turn 4 opens a new conversation


def test_trace_segments_with_equal_names_are_equal_text():
    text = TraceText(seed=0)
    long = text.text([("sys", 50), ("doc", 30), (None, 5)])
    short = text.text([("sys", 20)])
    assert long.startswith(short) and len(tokenize(long)) == 85
    assert text.text([(None, 5)]) != text.text([(None, 5)])


def test_bodies_are_plain_openai_unless_asked():
    spec = LoadSpec(URL, (TenantSpec("a", rate=1),), shape=PromptShape("random", 10))
    prompt = prompt_source(spec, spec.tenants[0]).next()
    body = request_body(spec, "m", "a", prompt)
    assert set(body) == {"model", "messages", "max_tokens", "stream", "stream_options"}
    tagged = LoadSpec(
        URL, spec.tenants, api="completions", tag_tenants=True, ignore_eos=True, shape=spec.shape
    )
    body = request_body(tagged, "m", "a", prompt)
    assert body["vllm_xargs"] == {"fairpool_tenant": "a"} and body["ignore_eos"] is True
    assert isinstance(body["prompt"], str) and "messages" not in body
    for api, keys in (
        ("responses", {"model", "input", "max_output_tokens", "stream"}),
        ("embeddings", {"model", "input"}),
    ):
        body = request_body(LoadSpec(URL, spec.tenants, api=api), "m", "a", prompt)
        assert set(body) == keys


# --- runs over HTTP ------------------------------------------------------------------


def test_requests_bound_ends_the_run_and_shared_prefixes_are_cached():
    """Each tenant is one closed-loop client, so each request after a tenant's first is sent
    after the one before it was answered, when the tenant's system prompt is in the cache:
    every request but the first is served that prompt's full KV blocks from cache, however
    the budget of 30 happens to split between the tenants."""
    with engines(1, speedup=100.0) as (engine,):
        block = engine.sim.runner.engine.block_size
        result = run(
            engine.url,
            TenantSpec("a", concurrency=1),
            TenantSpec("b", concurrency=1),
            tag_tenants=True,
            requests=30,
            duration=None,
            shape=PromptShape("shared-prefix", prompt_tokens=200, output_tokens=8),
        )
    assert result.stopped_by == "requests"
    tenants = result.tenants.values()
    assert sum(stats.sent for stats in tenants) == 30
    assert sum(stats.done for stats in tenants) == 30
    system = 1 + 200  # the `<|system|>` marker and the prompt's words
    for stats in tenants:
        assert stats.done >= 1  # each client takes its first request before any answer
        assert stats.cached_tokens >= (system - system % block) * (stats.done - 1)
        assert stats.completion_tokens == 8 * stats.done
        assert stats.service == stats.prompt_tokens - stats.cached_tokens + 2 * 8 * stats.done


@pytest.mark.parametrize(("shape", "api"), [("documents", "chat"), ("multi-turn", "completions")])
def test_documents_and_multi_turn_are_served_from_cache(shape, api):
    """One client: each request is sent after the one before it was answered, so which
    prefixes are in the cache when it arrives does not depend on the machine's speed."""
    with engines(1, speedup=100.0) as (engine,):
        result = run(
            engine.url,
            TenantSpec("a", concurrency=1),
            tag_tenants=True,
            requests=16,
            api=api,
            shape=PromptShape(shape, prompt_tokens=100, question_tokens=8, output_tokens=8),
        )
    stats = result.tenants["a"]
    assert stats.done == 16 and stats.cached_tokens > 0.3 * stats.prompt_tokens


def test_random_prompts_share_nothing():
    with engines(1, speedup=100.0) as (engine,):
        result = run(
            engine.url,
            TenantSpec("a", concurrency=2),
            requests=10,
            shape=PromptShape("random", prompt_tokens=100, output_tokens=4),
        )
    assert result.tenants["a"].done == 10 and result.tenants["a"].cached_tokens == 0


def arrivals_within(seed: int, tenant: str, rate: float, seconds: float) -> int:
    """Arrivals the run's Poisson stream places before `seconds`."""
    gaps = random.Random(f"{seed}:{tenant}:arrivals")
    moment, count = gaps.expovariate(rate), 0
    while moment < seconds:
        count, moment = count + 1, moment + gaps.expovariate(rate)
    return count


def test_open_loop_follows_its_arrival_stream_and_duration_bounds_the_run():
    """How many arrivals a loaded machine manages to send in 2 s is its speed, not the
    generator's: what holds on any machine is that the generator never sends a request
    before its time in the seeded stream, and that the duration ends the run."""
    expected = arrivals_within(0, "a", 25, 2.0)
    assert abs(expected - 50) <= 4 * math.sqrt(50)  # the seeded stream is Poisson-like
    with engines(1, speedup=100.0) as (engine,):
        result = run(
            engine.url,
            TenantSpec("a", rate=25),
            duration=2.0,
            shape=PromptShape("random", prompt_tokens=20, output_tokens=4),
        )
    sent = result.tenants["a"].sent
    assert result.stopped_by == "duration"
    assert result.series and result.series[-1].t >= 2.0
    assert 0 < sent <= arrivals_within(0, "a", 25, result.elapsed)  # never ahead of time
    stats = result.tenants["a"]
    assert stats.done + stats.cancelled + sum(stats.errors.values()) == sent


def test_an_open_loop_with_a_requests_bound_sends_exactly_its_stream():
    """The first 20 arrivals of the stream are sent, and the run cannot end before the
    20th arrival's time (arrivals are never early, however fast the machine)."""
    gaps = random.Random("0:a:arrivals")
    twentieth = sum(gaps.expovariate(25) for _ in range(20))
    with engines(1, speedup=100.0) as (engine,):
        result = run(
            engine.url,
            TenantSpec("a", rate=25),
            requests=20,
            duration=None,
            shape=PromptShape("random", prompt_tokens=20, output_tokens=4),
        )
    stats = result.tenants["a"]
    assert result.stopped_by == "requests"
    assert stats.sent == stats.done == 20
    assert result.elapsed >= twentieth


def test_duration_cancels_requests_in_flight():
    with engines(1, speedup=1.0) as (engine,):
        result = run(
            engine.url,
            TenantSpec("a", concurrency=3),
            tag_tenants=True,
            duration=0.5,
            shape=PromptShape("random", prompt_tokens=20, output_tokens=2000),
        )
        stats = result.tenants["a"]
        assert result.stopped_by == "duration"
        # 2000 tokens take the engine 2000 steps of model time at wall-clock pace: none of
        # the three first requests can be answered before the duration ends.
        assert stats.sent == stats.cancelled == 3 and stats.done == 0
        wait_until(lambda: engine.sim.runner.in_flight == 0)  # the engine heard them


def test_a_stop_event_ends_the_run_with_what_was_measured():
    async def stopped_early() -> LoadResult:
        stop = asyncio.Event()

        def progress(result: LoadResult) -> None:
            if result.tenants["a"].done >= 3:  # stopped once something was measured
                stop.set()

        spec = LoadSpec(
            engine.url,
            (TenantSpec("a", concurrency=2),),
            duration=60,
            shape=PromptShape("random", prompt_tokens=20, output_tokens=4),
            sample_interval=0.05,
        )
        return await run_load(spec, progress, stop)

    with engines(1, speedup=100.0) as (engine,):
        result = asyncio.run(stopped_early())
    assert result.stopped_by == "stopped" and result.tenants["a"].done >= 3


def test_a_trace_replays_with_its_tenants_times_and_lengths(tmp_path):
    """A trace's named segments are the same text in every request, so the engine's cache
    serves them. A one-request trace per tenant puts them in the cache first: whether a
    request of the real replay overlaps the one before it (its time in the trace against
    the machine's speed) then makes no difference, every request finds its 64 tokens."""

    def replay(trace: list[TraceRequest], name: str) -> dict[str, Any]:
        path, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.json"
        write_trace(trace, path)
        code = main(["load", "--url", engine.url, "--trace", str(path), "--tag-tenants",
                     "--api", "completions", "--json", str(out)])  # fmt: skip
        assert code == 0
        return json.loads(out.read_text())

    def served() -> dict[str, float]:
        return {
            tenant: metric(engine.url, "fairpool_engine_tenant_service_total", tenant=tenant)
            for tenant in "ab"
        }

    def request(t: float, tenant: str) -> TraceRequest:
        return TraceRequest(t, tenant, (("sys-" + tenant, 64), (None, 8)), 6, 6)

    with engines(1, speedup=100.0) as (engine,):
        warm = replay([request(0.0, tenant) for tenant in "ab"], "warm")
        assert all(warm["tenants"][tenant]["done"] == 1 for tenant in "ab")
        before = served()
        trace = [request(0.05 * index, tenant) for index in range(10) for tenant in "ab"]
        report = replay(trace, "trace")
        after = served()
    assert report["stopped_by"] == "trace"
    for tenant in ("a", "b"):
        numbers = report["tenants"][tenant]
        assert numbers["sent"] == numbers["done"] == 10
        assert numbers["completion_tokens"] == 60
        assert numbers["prompt_tokens"] == 10 * 72
        assert numbers["cached_tokens"] >= 10 * 64  # the named segment, every time
        assert after[tenant] - before[tenant] == pytest.approx(numbers["service"])


def test_tag_tenants_attributes_service_per_tenant_in_the_engine(tmp_path, capsys):
    """Against a bare engine the tenants are tagged in vllm_xargs: the engine's per-tenant
    service counter agrees with what the load generator measured. Also the CLI's outputs:
    status lines when not on a terminal, the summary, JSON and PNG."""
    out, plot = tmp_path / "load.json", tmp_path / "load.png"
    with engines(1, speedup=100.0) as (engine,):
        code = main(["load", "--url", engine.url, "--tag-tenants", "--requests", "24",
                     "--tenant", "a:concurrency=2", "--tenant", "b:weight=2,concurrency=2",
                     "--prompt-tokens", "64", "--output-tokens", "8",
                     "--json", str(out), "--plot", str(plot)])  # fmt: skip
        served = {t: metric(engine.url, "fairpool_engine_tenant_service_total", tenant=t)
                  for t in "ab"}  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "share / entitled" in printed and "TTFT p50 / p99" in printed
    report = json.loads(out.read_text())
    assert set(report) >= {"config", "tenants", "series", "elapsed_s", "stopped_by"}
    assert report["config"]["model"] == MODEL and report["config"]["tag_tenants"] is True
    for tenant in ("a", "b"):
        assert served[tenant] > 0
        assert served[tenant] == pytest.approx(report["tenants"][tenant]["service"])
        assert len(report["series"]["service"][tenant]) == len(report["series"]["t"])
    assert report["tenants"]["b"]["weight"] == 2.0
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("api", ["chat", "completions", "responses", "embeddings"])
def test_every_api_is_read_with_its_usage(api):
    """Each API's answers end as that API ends them and carry its usage: the service the
    load generator counts is the engine's, request for request (embeddings: their usage
    has no cached tokens, so the client counts the whole prompt; nor output, nor a first
    token). A sender that reads only the end and the usage finds the same tokens."""
    shape = PromptShape("shared-prefix", prompt_tokens=64, output_tokens=8)
    with engines(1, speedup=100.0) as (engine,):
        result = run(engine.url, TenantSpec("a", concurrency=2), tag_tenants=True,
                     requests=6, duration=None, api=api, shape=shape)  # fmt: skip
        served = metric(engine.url, "fairpool_engine_tenant_service_total", tenant="a")
        spec = LoadSpec(engine.url, (TenantSpec("a", rate=1),), api=api, shape=shape)
        body = request_body(spec, MODEL, "a", prompt_source(spec, spec.tenants[0]).next())
        request = OutgoingRequest("a", api, json.dumps(body).encode())

        async def both() -> list[RequestResult]:
            results = []
            for parse_events in (True, False):
                async with Sender(f"{engine.url}/v1", parse_events=parse_events) as sender:
                    results.append(await sender.send(request))
            return results

        full, quick = asyncio.run(both())
    stats = result.tenants["a"]
    assert stats.done == 6 and not stats.errors and stats.usage_missing == 0
    assert stats.completion_tokens == (0 if api == "embeddings" else 6 * 8)
    if api == "embeddings":
        assert stats.cached_tokens == 0 and stats.service == stats.prompt_tokens > 0
        assert not stats.ttfts and len(stats.latencies) == 6
    else:
        assert stats.service == pytest.approx(served)
        assert len(stats.ttfts) == len(stats.latencies) == 6
    assert full.ok and quick.ok and full.usage_reported and quick.usage_reported
    assert (full.prompt_tokens, full.completion_tokens) == (
        quick.prompt_tokens,
        quick.completion_tokens,
    )
    assert quick.first_token is None and quick.text == ""
    assert (full.first_token is None) == (api == "embeddings") == (full.text == "")


def test_failures_are_counted_by_kind_and_never_end_the_run():
    with engines(1, speedup=100.0, error_rate=1.0) as (broken,):
        result = run(broken.url, TenantSpec("a", concurrency=2), requests=6, model=MODEL)
    assert result.tenants["a"].errors == {"500": 6}
    result = run(URL, TenantSpec("a", concurrency=1), requests=3, model=MODEL)
    assert result.tenants["a"].errors == {"connection": 3}
    # One tenant a run: in a shared budget, how many requests each sends is a race.
    with engines(1, speedup=100.0) as workers:
        limited = tenant_entry("flood", limits={"requestsPerMinute": 2})
        config = gateway_config([w.url for w in workers], [limited])
        with gateway(config) as running:
            shape = PromptShape("random", prompt_tokens=10, output_tokens=2)
            stranger = TenantSpec("stranger", key="sk-wrong", concurrency=1)
            refused = run(running.url, stranger, requests=3, shape=shape, model=MODEL)
            flood = TenantSpec("flood", key=KEYS["flood"], concurrency=1)
            result = run(running.url, flood, requests=6, shape=shape)
    assert refused.tenants["stranger"].errors == {"401": 3}
    stats = result.tenants["flood"]
    assert stats.sent == 6 and stats.done == 2 and stats.errors == {"limited": 4}


def test_ctrl_c_ends_the_cli_run_and_still_prints_the_summary(capsys):
    """Ctrl-C once the engine has answered a request: the run's handler is in place by
    then (it is installed before the first request is sent)."""

    def interrupt_once_answered() -> None:
        wait_until(lambda: metric(engine.url, "vllm:request_success_total") >= 1)
        os.kill(os.getpid(), signal.SIGINT)

    with engines(1, speedup=100.0) as (engine,):
        interrupter = threading.Thread(target=interrupt_once_answered, daemon=True)
        interrupter.start()
        code = main(["load", "--url", engine.url, "--tenant", "a:concurrency=2",
                     "--duration", "60", "--shape", "random", "--prompt-tokens", "20",
                     "--output-tokens", "4"])  # fmt: skip
        interrupter.join()
    assert code == 0
    assert "ended: stopped" in capsys.readouterr().out


def test_percentiles_are_nearest_rank():
    stats = TenantStats("a", 1.0, ttfts=[float(v) for v in (5, 1, 3, 2, 4)])
    assert (stats.ttft(0.5), stats.ttft(0.99)) == (3.0, 5.0)
    assert (stats.ttft(0.4), stats.ttft(0.41)) == (2.0, 3.0)  # ranks ⌈2⌉ and ⌈2.05⌉
    assert stats.latency(0.5) is None


def finished_result() -> LoadResult:
    spec = LoadSpec(URL, (TenantSpec("a", rate=1), TenantSpec("b", weight=2, rate=1)))
    result = LoadResult.begin(spec, "m")
    a, b = result.tenants["a"], result.tenants["b"]
    a.sent, a.active, b.active = 2, True, True
    answered = RequestResult("a", started=0.0, first_token=0.1, ended=0.5, status=200)
    answered.prompt_tokens, answered.cached_tokens, answered.completion_tokens = 100, 40, 10
    a.record(answered, spec.cost)
    a.record(RequestResult("a", status=429, error="limited"), spec.cost)
    result.sample()
    return result


def test_the_live_view_is_a_table_on_a_terminal_and_lines_elsewhere():
    terminal = Console(file=io.StringIO(), force_terminal=True, width=160)
    with LiveView(terminal) as view:
        view.update(finished_result())
    assert "share / entitled" in terminal.file.getvalue()
    plain = Console(file=io.StringIO(), force_terminal=False)
    with LiveView(plain, line_interval=0) as view:
        view.update(finished_result())
    line = plain.file.getvalue()
    assert "sent 2 done 1 errors 1" in line and "a 100.0%/33.3%" in line


def test_building_the_parser_does_not_import_httpx():
    code = (
        "import sys; from fairpool_cli.main import _parser; _parser(); "
        "print('httpx' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


# --- through the gateway ----------------------------------------------------------------


def test_load_through_the_gateway_measures_what_the_gateway_charged():
    """Two weighted tenants, closed-loop, through a saturated pool: what `fairpool load`
    counts per tenant (answers, tokens, service, and so the shares it reports) is what the
    gateway charged them, request for request.

    The run ends at its requests bound, when every request has been answered: how many
    were in flight when it ended cannot differ between the client and the gateway. Whether
    the gateway's charging gives weighted shares is tests/test_gateway_fairness.py's to
    show, over an order of service fixed by the fair queue; a share measured here over a
    span of wall-clock time would also measure whether this client kept both tenants
    backlogged on a loaded machine."""
    with engines(2, speedup=2.0) as workers:
        config = gateway_config(
            [w.url for w in workers],
            [tenant_entry("flood", 1.0), tenant_entry("light", 2.0)],
            routing={"saturation": {"maxOutstanding": 2}, "queueTimeoutSeconds": 120},
        )
        with gateway(config) as running:
            result = run(
                running.url,
                TenantSpec("flood", key=KEYS["flood"], weight=1.0, concurrency=16),
                TenantSpec("light", key=KEYS["light"], weight=2.0, concurrency=16),
                requests=120,
                duration=None,
                shape=PromptShape("random", prompt_tokens=48, output_tokens=16),
            )
            charged = {
                tenant: gateway_metric(running, "fairpool_gateway_service_total", tenant=tenant)
                for tenant in ("flood", "light")
            }
            answered = {
                tenant: gateway_metric(
                    running, "fairpool_gateway_requests_total", tenant=tenant, status="200"
                )
                for tenant in ("flood", "light")
            }
            tokens = {
                (tenant, kind): gateway_metric(
                    running, "fairpool_gateway_tokens_total", tenant=tenant, kind=kind
                )
                for tenant in ("flood", "light")
                for kind in ("prompt", "completion")
            }
    assert result.stopped_by == "requests"
    for tenant in ("flood", "light"):
        stats = result.tenants[tenant]
        assert not stats.errors and not stats.cancelled
        assert stats.done == answered[tenant] > 0
        assert stats.prompt_tokens == tokens[tenant, "prompt"]
        assert stats.completion_tokens == tokens[tenant, "completion"] == 16 * stats.done
        assert stats.service == pytest.approx(charged[tenant])
    share = result.share("light")
    print(f"light's share {share:.3f} of the whole run, whose end is the flood's alone")
    assert share == pytest.approx(charged["light"] / sum(charged.values()))


def test_through_the_gateway_every_api_is_counted_as_the_gateway_charged_it():
    """The gateway's four APIs, one after the other, through one gateway: per API, the
    answers, tokens and service the load generator counts are what the gateway charged
    (the difference of its counters over that API's run)."""
    with engines(1, speedup=100.0) as workers:
        config = gateway_config([w.url for w in workers], [tenant_entry("flood")])
        with gateway(config) as running:

            def charged() -> tuple[float, ...]:
                return tuple(
                    gateway_metric(running, name, tenant="flood", **labels)
                    for name, labels in (
                        ("fairpool_gateway_requests_total", {"status": "200"}),
                        ("fairpool_gateway_tokens_total", {"kind": "prompt"}),
                        ("fairpool_gateway_tokens_total", {"kind": "completion"}),
                        ("fairpool_gateway_service_total", {}),
                    )
                )

            for api in ("chat", "completions", "responses", "embeddings"):
                before = charged()
                result = run(
                    running.url,
                    TenantSpec("flood", key=KEYS["flood"], concurrency=2),
                    requests=6,
                    duration=None,
                    api=api,
                    shape=PromptShape("shared-prefix", prompt_tokens=48, output_tokens=4),
                )
                after = charged()
                stats = result.tenants["flood"]
                assert not stats.errors and stats.usage_missing == 0, api
                counted = (stats.done, stats.prompt_tokens, stats.completion_tokens)
                assert counted == tuple(a - b for a, b in zip(after[:3], before[:3], strict=True))
                assert stats.service == pytest.approx(after[3] - before[3]), api
                assert stats.done == 6 and stats.completion_tokens == (api != "embeddings") * 24
