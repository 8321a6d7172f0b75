"""Priority bands on `fairpool engine-sim` over loopback HTTP: a request runs in the flow
its `vllm_xargs` name (its tenant in the tenant's band, or a lower band it asks; never a
higher one), is charged there and shows there in the metrics' `band` label; and an
interactive tenant's request is admitted before batch requests queued ahead of it.
Counted events only: arrivals are held until every request waits, and the engine is
stopped at a counted admission, never at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from polling import eventually, wait_until
from sim_http import drained, held, metric

from fairpool_engine.sim.options import SimOptions
from fairpool_engine.sim.server import ServerThread
from fairpool_engine.sim.text import tokenize

pytestmark = pytest.mark.loopback

FAST = 1000.0  # model seconds per wall second
BANDS = "tenantBands: {fast: interactive, bulk: batch}\n"


def xargs(tenant: str, band: str | None = None) -> dict[str, Any]:
    asked = {"fairpool_tenant": tenant}
    if band is not None:
        asked["fairpool_band"] = band
    return {"vllm_xargs": asked}


def completion(prompt: str, max_tokens: int, tenant: str, band: str | None = None) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, **xargs(tenant, band)}


def server_for(tmp_path, config: str, **options: Any) -> ServerThread:
    path = tmp_path / "scheduler.yaml"
    path.write_text(config)
    return ServerThread(SimOptions(speedup=FAST, scheduler_config=str(path), **options))


async def post_all(
    http: httpx.AsyncClient, bodies: list[dict], queued: Callable[[], bool]
) -> list[asyncio.Task[httpx.Response]]:
    """Send `bodies` at once; returns when `queued()` says the engine holds them."""
    tasks = [asyncio.create_task(http.post("/v1/completions", json=body)) for body in bodies]
    await eventually(queued)
    return tasks


def test_a_request_runs_in_the_flow_its_band_asks_and_is_charged_there(tmp_path):
    asks = [
        ("fast", None, "fast"),
        ("fast", "batch", "fast@batch"),  # an interactive tenant's batch job
        ("fast", "interactive", "fast"),  # its own band: the tenant's flow
        ("bulk", "interactive", "bulk"),  # above the tenant's band: ignored
        ("bulk", None, "bulk"),
    ]
    prompt, output = "band check", 4
    with server_for(tmp_path, "policy: vtc\n" + BANDS) as server:
        policy = server.sim.runner.engine.policy

        async def run() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
                with held(server):
                    bodies = [completion(prompt, output, tenant, band) for tenant, band, _ in asks]
                    tasks = await post_all(http, bodies, lambda: policy.waiting_count == len(asks))
                    waiting = {flow: policy.tenant_waiting(flow) for _, _, flow in asks}
                    assert waiting == {"fast": 2, "fast@batch": 1, "bulk": 2}
                return await asyncio.gather(*tasks)

        assert all(response.status_code == 200 for response in asyncio.run(run()))
        wait_until(lambda: drained(server))
        each = len(tokenize(prompt)) + 2 * output  # uncached prompt + 2 × output
        service = "fairpool_engine_tenant_service_total"

        def charged(tenant: str, band: str) -> float:
            return metric(server.url, service, tenant=tenant, band=band)

        assert charged("fast", "interactive") + charged("fast", "batch") == 3 * each
        assert charged("fast", "batch") <= each  # its one request, less any cached prefix
        assert charged("bulk", "batch") == metric(server.url, service, tenant="bulk")
        assert metric(server.url, service, band="interactive", tenant="bulk") == 0
        assert metric(server.url, "fairpool_engine_tenant_weight", tenant="fast") == 1


def test_an_embedding_runs_in_the_band_it_asks(tmp_path):
    with server_for(tmp_path, "policy: vtc\n" + BANDS) as server:
        body = {"input": "embed me in the batch band", **xargs("fast", "batch")}
        response = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=60)
        assert response.status_code == 200
        prompt = response.json()["usage"]["prompt_tokens"]
        wait_until(lambda: drained(server))
        service = "fairpool_engine_tenant_service_total"
        assert metric(server.url, service, tenant="fast", band="batch") == prompt
        assert metric(server.url, service, tenant="fast", band="interactive") == 0


class Admissions:
    """The runner's listener, passed through: the flow of each admission, in the engine's
    order; once `stop_after` requests have been admitted the engine takes no further step
    (as `held` stops it) until the test lets it go on (`go_on`)."""

    def __init__(self, runner: Any, stop_after: int) -> None:
        self.runner, self.stop_after = runner, stop_after
        self.flows: list[str] = []

    def admitted(self, engine: Any, request: Any) -> None:
        self.runner.admitted(engine, request)
        self.flows.append(request.tenant)
        if len(self.flows) == self.stop_after:
            engine.idle = lambda: True

    def go_on(self, engine: Any) -> None:
        del engine.idle

    def preempted(self, engine: Any, request: Any) -> None:
        self.runner.preempted(engine, request)

    def finished(self, engine: Any, completion: Any) -> None:
        self.runner.finished(engine, completion)

    def evicted(self, engine: Any, tokens: Any, keep: int) -> None:
        self.runner.evicted(engine, tokens, keep)


@pytest.mark.parametrize("policy", ["vtc", "dlpm"])
def test_an_interactive_request_is_admitted_before_queued_batch_ones(tmp_path, policy):
    """Six batch requests queue; two are admitted (the engine's memory holds two: reserve
    admission of 10 + 100 tokens each in 250) and served a step; then three interactive
    ones arrive behind the four still queued. Each of them is admitted before any of the
    four: the batch band's minimum share is owed nothing, having just been served alone."""
    reserve = {"profile": "llama2-7b-a10g", "memory_tokens": 250, "max_model_len": 200}
    with server_for(tmp_path, f"policy: {policy}\n" + BANDS, **reserve) as server:
        runner = server.sim.runner
        engine = runner.engine
        admissions = Admissions(runner, stop_after=2)
        engine.listener = admissions

        def body(tenant: str, index: int) -> dict:
            return completion(f"{tenant} {index} " + "word " * 8, 100, tenant)

        async def run() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
                with held(server):
                    bulk = [body("bulk", i) for i in range(6)]
                    tasks = await post_all(http, bulk, lambda: engine.policy.waiting_count == 6)
                await eventually(lambda: len(admissions.flows) == 2)
                fast = [body("fast", i) for i in range(3)]
                tasks += await post_all(http, fast, lambda: engine.policy.waiting_count == 7)
                admissions.go_on(engine)
                return await asyncio.gather(*tasks)

        try:
            responses = asyncio.run(run())
        finally:
            engine.listener = runner
        assert all(response.status_code == 200 for response in responses)
        assert admissions.flows == ["bulk"] * 2 + ["fast"] * 3 + ["bulk"] * 4
        wait_until(lambda: drained(server))
