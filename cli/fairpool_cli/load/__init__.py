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

Modules: `spec` (what to send), `tenants` (tenants from flags, files, manifests),
`prompts` (shapes and bodies), `send` (one streamed request; the only one that imports
httpx, when a run starts), `run` (arrivals, bounds), `stats` (measurements), `report`
(tables, JSON, plot), `live` (the live view), `options` (the command).
"""

from fairpool_cli.load.run import Progress, run_load
from fairpool_cli.load.spec import LoadSpec, PromptShape, TenantSpec
from fairpool_cli.load.stats import LoadResult, TenantStats

__all__ = [
    "LoadResult",
    "LoadSpec",
    "Progress",
    "PromptShape",
    "TenantSpec",
    "TenantStats",
    "run_load",
]
