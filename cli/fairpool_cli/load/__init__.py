"""`fairpool load`: multi-tenant load against an OpenAI-compatible endpoint.

Tenants send with their keys (through the gateway) or tagged in `vllm_xargs` (to a bare
engine), open-loop at a Poisson rate or closed-loop at a concurrency, with prompt shapes
that share prefixes, or replay a trace in the simulator's format. Per tenant it measures
requests, errors, tokens, service and its share next to the entitled share, TTFT and
latency. `docs/load.md` describes the command.

    from fairpool_cli.load import LoadSpec, TenantSpec, run_load

    spec = LoadSpec(
        url="http://127.0.0.1:8080/v1",
        tenants=(TenantSpec("a", key="sk-a", concurrency=8), TenantSpec("b", key="sk-b",
                 weight=2, concurrency=8)),
        duration=30,
    )
    result = asyncio.run(run_load(spec))
    result.share("b"), result.entitled_share("b")

The same parts drive other workloads too (the gateway benchmark, `bench/bench_gateway.py`,
sends its own requests with them): a `Sender` sends an `OutgoingRequest` and measures a
`RequestResult`; `open_loop` (at `poisson` times) and `closed_loop` decide when.

    async with Sender("http://127.0.0.1:8080/v1", parse_events=False) as sender:
        results = []

        async def one(number: int, due: float) -> None:
            results.append(await sender.send(make(number), due))

        await open_loop(one, poisson(200.0, seed=1, start=now(), end=now() + 10))

Modules: `spec` (what to send), `tenants` (tenants from flags, files, manifests),
`prompts` (shapes and bodies), `request` (a request and its result), `send` (the HTTP
client), `connection` (one HTTP/1.1 connection), `answers` (reading each API's answers),
`loops` (open and closed loops), `run` (a run: arrivals, bounds), `stats`
(measurements), `report` (tables, JSON, plot), `live` (the live view), `options` (the
command).
"""

from fairpool_cli.load.loops import closed_loop, open_loop, poisson
from fairpool_cli.load.request import API_PATHS, OutgoingRequest, RequestResult, now
from fairpool_cli.load.run import Progress, run_load
from fairpool_cli.load.send import Sender
from fairpool_cli.load.spec import LoadSpec, PromptShape, TenantSpec
from fairpool_cli.load.stats import LoadResult, TenantStats

__all__ = [
    "API_PATHS",
    "LoadResult",
    "LoadSpec",
    "OutgoingRequest",
    "Progress",
    "PromptShape",
    "RequestResult",
    "Sender",
    "TenantSpec",
    "TenantStats",
    "closed_loop",
    "now",
    "open_loop",
    "poisson",
    "run_load",
]
