"""`fairpool load`: its flags, the run they describe, and the command itself.

This module imports only the core library and the load package, which sends with its own
HTTP client: building `fairpool`'s parser loads no HTTP library.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from rich.console import Console

from fairpool.sched.cost import CostModel
from fairpool.sched.errors import ConfigError
from fairpool.sim.trace import TraceRequest, read_trace
from fairpool_cli.load.run import Progress, run_load
from fairpool_cli.load.spec import APIS, DEFAULT_DURATION, SHAPES, LoadSpec, PromptShape
from fairpool_cli.load.stats import LoadResult
from fairpool_cli.load.tenants import (
    Fields,
    parse_tenant_flag,
    read_tenants_file,
    resolve_tenants,
    tenants_from_manifests,
)

DESCRIPTION = """\
Multi-tenant load against an OpenAI-compatible endpoint: the gateway (tenants by API
key) or a single engine (tenants tagged in vllm_xargs with --tag-tenants). Shows a live
per-tenant table (requests, tokens/s, service share vs entitled share, TTFT and latency
percentiles) and ends with a summary. See docs/load.md.

  fairpool load --url http://127.0.0.1:8080/v1 \\
      --tenant flood:key=sk-flood,weight=1,rate=20 \\
      --tenant light:key=sk-light,weight=2,concurrency=4 --duration 60
"""

TENANT_HELP = (
    "NAME:PART=VALUE,... with parts key, weight, rate (requests/s, Poisson) or "
    "concurrency (requests kept in flight), prompt-tokens, output-tokens (repeatable)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--url", required=True, help="the endpoint's OpenAI base URL, e.g. http://127.0.0.1:8080/v1"
    )
    add(
        "--model",
        metavar="NAME",
        help="model to request (default: the first that GET /models lists)",
    )
    add("--tenant", action="append", default=[], metavar="SPEC", help=TENANT_HELP)
    add("--tenants-file", metavar="FILE", help="YAML list of tenants with the parts of --tenant")
    add(
        "--keys-from",
        action="append",
        default=[],
        metavar="MANIFESTS",
        help="TenantQuota + Secret YAML: each tenant's key and weight (repeatable)",
    )
    add("--tag-tenants", action="store_true", help='send "vllm_xargs": {"fairpool_tenant": NAME}')
    add(
        "--rate",
        metavar="R",
        type=float,
        help="requests/s of tenants that give neither rate nor concurrency",
    )
    add(
        "--concurrency",
        metavar="N",
        type=int,
        default=4,
        help="the same in flight, if no --rate (4)",
    )
    add("--trace", metavar="FILE", help="replay a trace in the simulator's format")
    add("--shape", default="shared-prefix", choices=SHAPES, help="prompt shape (shared-prefix)")
    add("--api", default="chat", choices=APIS, help="the API to send to (chat)")
    defaults = PromptShape()
    add(
        "--prompt-tokens",
        metavar="N",
        type=int,
        default=defaults.prompt_tokens,
        help="long part (512)",
    )
    add(
        "--question-tokens",
        metavar="N",
        type=int,
        default=defaults.question_tokens,
        help="short part (32)",
    )
    add(
        "--output-tokens",
        metavar="N",
        type=int,
        default=defaults.output_tokens,
        help="max_tokens (64)",
    )
    add("--documents", metavar="N", type=int, default=defaults.documents, help="per tenant (4)")
    add("--turns", metavar="N", type=int, default=defaults.turns, help="per conversation (6)")
    add("--ignore-eos", action="store_true", help='send vLLM\'s "ignore_eos": true')
    add(
        "--duration",
        metavar="S",
        type=float,
        help=f"seconds (default {DEFAULT_DURATION:g} without --requests)",
    )
    add("--requests", metavar="N", type=int, help="requests to send in all")
    add(
        "--warmup",
        metavar="S",
        type=float,
        default=0.0,
        help="count shares and entitled shares from S seconds on (0)",
    )
    add("--timeout", metavar="S", type=float, default=300.0, help="seconds without a byte (300)")
    add(
        "--extend-weight",
        metavar="W",
        type=float,
        default=1.0,
        help="service per uncached prompt token (1)",
    )
    add(
        "--output-weight", metavar="W", type=float, default=2.0, help="service per output token (2)"
    )
    add("--seed", metavar="N", type=int, default=0)
    add("--json", metavar="FILE", help="write every number, the configuration and the series")
    add("--plot", metavar="FILE.png", help="plot cumulative service per tenant over time")


def spec_from_args(args: argparse.Namespace) -> LoadSpec:
    """The run the flags describe; ConfigError naming the flag for a bad one."""
    trace = _read_trace(args.trace)
    explicit: list[tuple[str, Fields]] = []
    if args.tenants_file:
        explicit += read_tenants_file(args.tenants_file)
    explicit += [parse_tenant_flag(text) for text in args.tenant]
    known = tenants_from_manifests(args.keys_from) if args.keys_from else {}
    trace_tenants = list(dict.fromkeys(request.tenant for request in trace))
    tenants = resolve_tenants(explicit, known, trace_tenants, args.rate, args.concurrency)
    duration = args.duration
    if duration is None and args.requests is None and not trace:
        duration = DEFAULT_DURATION
    return LoadSpec(
        url=args.url,
        tenants=tenants,
        model=args.model,
        api=args.api,
        shape=PromptShape(
            args.shape,
            args.prompt_tokens,
            args.question_tokens,
            args.output_tokens,
            args.documents,
            args.turns,
        ),
        trace=tuple(trace),
        duration=duration,
        requests=args.requests,
        seed=args.seed,
        tag_tenants=args.tag_tenants,
        ignore_eos=args.ignore_eos,
        cost=_cost(args.extend_weight, args.output_weight),
        timeout=args.timeout,
        warmup=args.warmup,
    )


def _read_trace(path: str | None) -> list[TraceRequest]:
    return read_trace(path) if path else []


def _cost(extend_weight: float, output_weight: float) -> CostModel:
    try:
        return CostModel(extend_weight, output_weight)
    except ConfigError as error:
        raise ConfigError(f"--{error.parameter.replace('_', '-')}", error.problem) from None


def run_command(args: argparse.Namespace) -> int:
    """Run, showing the live table; print the summary and write the outputs (also after
    Ctrl-C, which ends the run early)."""
    from fairpool_cli.load.live import LiveView
    from fairpool_cli.load.report import plot_service, tenant_table, title, write_json

    spec = spec_from_args(args)
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        _check_writable(flag, path)
    with LiveView(_live_console()) as view:
        result = asyncio.run(_run_until_interrupted(spec, view.update))
    output = Console(width=max(Console().width, 150))
    output.print(tenant_table(result, title(result)))
    if args.json:
        output.print(f"json: {write_json(result, args.json)}")
    if args.plot:
        output.print(f"plot: {plot_service(result, args.plot)}")
    return 0


def _check_writable(flag: str, path: str | None) -> None:
    """Refuse an output file in a folder that does not exist before the run, not after."""
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise ConfigError(flag, f"no such folder: {Path(path).parent}")


async def _run_until_interrupted(spec: LoadSpec, progress: Progress) -> LoadResult:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows
        loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        return await run_load(spec, progress, stop)
    finally:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGINT)


def _live_console() -> Console:
    """The live table goes to stderr, or stdout, whichever is a terminal; status lines
    go to stderr otherwise."""
    if not sys.stderr.isatty() and sys.stdout.isatty():
        return Console()
    return Console(stderr=True)
