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
from gateway_helpers import KEYS, MODEL, engines, gateway, gateway_config, tenant_entry
from polling import wait_until
from rich.console import Console
from sim_http import metric

from fairpool.cli import main
from fairpool.sched.errors import ConfigError
from fairpool.sim.trace import TraceRequest, write_trace
from fairpool_engine.sim_text import render_chat, tokenize
from fairpool_gateway.load import LoadResult, LoadSpec, PromptShape, TenantSpec, run_load
from fairpool_gateway.load.live import LiveView
from fairpool_gateway.load.prompts import TraceText, prompt_source, request_body
from fairpool_gateway.load.spec import check_url
from fairpool_gateway.load.stats import Outcome, percentile
from fairpool_gateway.load.tenants import (
    parse_tenant_flag,
    read_tenants_file,
    resolve_tenants,
    tenants_from_manifests,
)

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
    with engines(1, speedup=100.0) as (engine,):
        result = run(
            engine.url,
            TenantSpec("a", concurrency=2),
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


def test_open_loop_sends_at_its_rate_and_duration_bounds_the_run():
    with engines(1, speedup=100.0) as (engine,):
        result = run(
            engine.url,
            TenantSpec("a", rate=25),
            duration=2.0,
            shape=PromptShape("random", prompt_tokens=20, output_tokens=4),
        )
    expected = arrivals_within(0, "a", 25, 2.0)
    assert abs(expected - 50) <= 4 * math.sqrt(50)  # the seeded stream is Poisson-like
    assert expected - 2 <= result.tenants["a"].sent <= expected + 1  # and it was followed
    assert result.stopped_by == "duration"
    assert result.series and result.series[-1].t >= 2.0


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
        assert stats.sent == stats.cancelled == 3 and stats.done == 0
        assert result.elapsed < 10  # not the 2000 tokens' time
        wait_until(lambda: engine.sim.runner.in_flight == 0)  # the engine heard them


def test_a_stop_event_ends_the_run_with_what_was_measured():
    async def stopped_early() -> LoadResult:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, stop.set)
        spec = LoadSpec(
            engine.url,
            (TenantSpec("a", concurrency=2),),
            duration=60,
            shape=PromptShape("random", prompt_tokens=20, output_tokens=4),
        )
        return await run_load(spec, stop=stop)

    with engines(1, speedup=100.0) as (engine,):
        result = asyncio.run(stopped_early())
    assert result.stopped_by == "stopped" and result.tenants["a"].done > 0


def test_a_trace_replays_with_its_tenants_times_and_lengths(tmp_path):
    trace = [
        TraceRequest(0.05 * index, tenant, (("sys-" + tenant, 64), (None, 8)), 6, 6)
        for index in range(10)
        for tenant in ("a", "b")
    ]
    path = tmp_path / "trace.jsonl"
    write_trace(trace, path)
    out = tmp_path / "trace.json"
    with engines(1, speedup=100.0) as (engine,):
        code = main(["load", "--url", engine.url, "--trace", str(path), "--tag-tenants",
                     "--api", "completions", "--json", str(out)])  # fmt: skip
        served = {t: metric(engine.url, "fairpool_engine_tenant_service_total", tenant=t)
                  for t in "ab"}  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    assert report["stopped_by"] == "trace"
    for tenant in ("a", "b"):
        numbers = report["tenants"][tenant]
        assert numbers["sent"] == numbers["done"] == 10
        assert numbers["completion_tokens"] == 60
        assert numbers["prompt_tokens"] == 10 * 72
        assert numbers["cached_tokens"] >= 9 * 64 - 16  # the named segment, after the first
        assert served[tenant] == pytest.approx(numbers["service"])


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


def test_failures_are_counted_by_kind_and_never_end_the_run():
    with engines(1, speedup=100.0, error_rate=1.0) as (broken,):
        result = run(broken.url, TenantSpec("a", concurrency=2), requests=6, model=MODEL)
    assert result.tenants["a"].errors == {"500": 6}
    result = run(URL, TenantSpec("a", concurrency=1), requests=3, model=MODEL)
    assert result.tenants["a"].errors == {"connection": 3}
    with engines(1, speedup=100.0) as workers:
        limited = tenant_entry("flood", limits={"requestsPerMinute": 2})
        config = gateway_config([w.url for w in workers], [limited])
        with gateway(config) as running:
            result = run(
                running.url,
                TenantSpec("flood", key=KEYS["flood"], concurrency=1),
                TenantSpec("stranger", key="sk-wrong", concurrency=1),
                requests=10,
                shape=PromptShape("random", prompt_tokens=10, output_tokens=2),
            )
    assert result.tenants["stranger"].errors["401"] >= 1
    flood = result.tenants["flood"]
    assert flood.done == 2 and flood.errors["limited"] == flood.sent - 2


def test_ctrl_c_ends_the_cli_run_and_still_prints_the_summary(capsys):
    with engines(1, speedup=100.0) as (engine,):
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            code = main(["load", "--url", engine.url, "--tenant", "a:concurrency=2",
                         "--duration", "60", "--shape", "random", "--prompt-tokens", "20",
                         "--output-tokens", "4"])  # fmt: skip
        finally:
            timer.cancel()
    assert code == 0
    assert "ended: stopped" in capsys.readouterr().out


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in (5, 1, 3, 2, 4)]
    assert (percentile(values, 0.5), percentile(values, 0.99)) == (3.0, 5.0)
    assert percentile([], 0.5) is None


def finished_result() -> LoadResult:
    spec = LoadSpec(URL, (TenantSpec("a", rate=1), TenantSpec("b", weight=2, rate=1)))
    result = LoadResult.begin(spec, "m")
    a, b = result.tenants["a"], result.tenants["b"]
    a.sent, a.active, b.active = 2, True, True
    a.record(Outcome("ok", 0.1, 0.5, 100, 40, 10), spec.cost)
    a.record(Outcome("limited"), spec.cost)
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
    code = "import sys; from fairpool.cli import _parser; _parser(); print('httpx' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


# --- fairness through the gateway ------------------------------------------------------


def test_gateway_weights_one_to_two_give_service_shares_one_third_and_two_thirds():
    """Both tenants closed-loop with far more requests in flight (16 each) than the
    saturated pool holds (2 workers × 2), so both stay backlogged in the gateway's fair
    queue (VTC) after the first second, in which connections open and the queue fills.

    Tolerance, from VTC's bound: over an interval in which both are backlogged, the
    service each received, divided by its weight, differs by at most 2U (U: the service of
    one request, all the same size here; VTC Thm 4.4). The client counts a request's
    service when it ends, so at each end of the interval each tenant's count may be off by
    the requests then in the pool (4): |ΔW_f − ΔW_l/2| ≤ (2 + 2·4)·U = G. With
    ΔS = ΔW_f + ΔW_l, the light tenant's share of ΔS differs from 2/3 by at most 2G/(3ΔS).
    """
    # Engines slow enough that the pool, not the load generator, is the bottleneck: the
    # generator must keep both tenants' queues at the gateway from ever emptying.
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
                duration=4.0,
                warmup=1.0,
                shape=PromptShape("random", prompt_tokens=48, output_tokens=16),
            )
    flood, light = result.tenants["flood"], result.tenants["light"]
    assert not flood.errors and not light.errors and flood.done and light.done
    assert flood.prompt_tokens / flood.done == light.prompt_tokens / light.done
    one_request = flood.service / flood.done
    served = sum(stats.service - stats.warmup_service for stats in result.tenants.values())
    share = result.share("light")
    assert share is not None
    bound = 2 * (2 + 2 * 4) * one_request / (3 * served)
    print(f"light share {share:.3f} after the first second (2/3 ± {bound:.3f})")
    assert abs(share - 2 / 3) <= bound
    assert result.entitled_share("light") == pytest.approx(2 / 3, abs=0.01)
