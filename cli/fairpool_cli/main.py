"""The `fairpool` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from fairpool import __version__
from fairpool.sched.errors import ConfigError
from fairpool.sched.registry import POLICIES, policy_names
from fairpool.sim import demo
from fairpool.sim.fleet import ClosedLoop
from fairpool.sim.plots import plot_priority, plot_service_over_time
from fairpool_cli.parent import die_with_parent
from fairpool_engine.sim import options as sim_options


def main(argv: Sequence[str] | None = None) -> int:
    die_with_parent()  # a child of `fairpool up` never outlives it
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "passes_unknown_options", False):
        args.vllm_args = unknown  # `fairpool engine` hands what it does not know to vLLM
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        result: int = args.handler(args)
        return result
    except ConfigError as error:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {escape(str(error))}")
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairpool", description="Fair, locality-aware, multi-tenant LLM serving."
    )
    parser.add_argument("--version", action="version", version=f"fairpool {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    live_demo = commands.add_parser(
        "demo",
        help="fairpool up + fairpool load: two tenants' shares, fairness on and off",
        description="Runs examples/local.yaml with `fairpool up`, drives a flooding and a "
        "light tenant through the gateway with `fairpool load`, twice (fairness on, then "
        "off), and prints the shares of service each got. About two minutes.",
    )
    live_demo.add_argument("--duration", type=float, default=25.0, help="seconds per run (25)")
    live_demo.set_defaults(handler=_live_demo)

    run_demo = commands.add_parser(
        "sim-demo",
        help="two tenants through the core policies on one simulated engine (virtual time)",
        description=demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run_demo.add_argument(
        "--scenario",
        choices=sorted(demo.SCENARIO_NAMES),
        action="append",
        help="scenario to run (repeatable; default: all)",
    )
    run_demo.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help=f"policy to compare (repeatable; default: {', '.join(demo.DEMO_POLICIES)}, "
        f"and {demo.PRIORITY_POLICY} for {demo.PRIORITY}; known: {', '.join(policy_names())})",
    )
    run_demo.add_argument(
        "--duration", type=_positive_float, default=60.0, help="virtual seconds (default 60)"
    )
    run_demo.add_argument("--seed", type=int, default=0)
    run_demo.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    run_demo.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also plot cumulative service per tenant over time (and, for priority, the "
        "interactive tenant's TTFT: FILE-priority.png beside other scenarios)",
    )
    run_demo.set_defaults(handler=_demo)

    sim = commands.add_parser(
        "sim",
        help="simulate a fleet in virtual time on a trace or a named workload",
        description="Run N simulated engines behind the gateway's front (hard limits, fair "
        "queue, router) on a trace (JSON lines) or a generated workload, and report "
        "per-tenant service, latency and fairness. With --pool, the pool's scheduler, routing "
        "and gateway settings are simulated as deployed; flags given explicitly win.",
    )
    source = sim.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="FILE", help="trace file (JSON lines)")
    source.add_argument("--workload", metavar="NAME", help="a generated workload")
    source.add_argument(
        "--client",
        action="append",
        metavar="TENANT[@BAND]:STREAMS[:P:Q:O]",
        help="closed-loop clients of a tenant: STREAMS requests always in flight, each a "
        "shared prefix of P tokens, a question of Q and an answer of O (default 512:32:64), "
        "in BAND (interactive, standard or batch; default the tenant's, only a lower one "
        "may be asked); repeatable, needs --duration",
    )
    sim.add_argument(
        "--workload-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a workload parameter, e.g. rate=10 or rpm=[90,180] (repeatable)",
    )
    sim.add_argument(
        "--pool",
        metavar="FILE",
        help="InferencePool YAML: its replicas, scheduler and routing (saturation, queue "
        "policy and timeout included)",
    )
    sim.add_argument("--workers", type=_positive_int, help="engines (default 1)")
    sim.add_argument("--policy", help="local policy (default dlpm)")
    sim.add_argument(
        "--policy-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the local policy, e.g. cycle_requests=256 for rad or "
        "token_budget=512 for sarathi (repeatable; docs/scheduling.md lists them)",
    )
    sim.add_argument("--router", help="router (default d2lpm)")
    sim.add_argument("--profile", default="llama2-7b-a10g", help="engine profile")
    sim.add_argument("--memory-tokens", type=_positive_int, help="KV memory per engine")
    sim.add_argument(
        "--block-size",
        type=_positive_int,
        help="KV block size in tokens (default: the profile's; vLLM uses 16)",
    )
    sim.add_argument("--quantum", type=_positive_float, help="DLPM quantum Q")
    sim.add_argument("--worker-quantum", type=_positive_float, help="D2LPM quantum Q^w")
    sim.add_argument(
        "--gateway-replicas",
        type=_positive_int,
        help="gateway replicas in front of the engines, each with its own queue, routing and "
        "saturation counts, sharing the hard limits (default 1)",
    )
    sim.add_argument(
        "--replica-traffic",
        choices=["spread", "tenant"],
        help="requests reach the replicas round robin (spread, the default) or each tenant "
        "through one replica (tenant)",
    )
    sim.add_argument(
        "--tenants", metavar="FILE", help="TenantQuota YAML: tenant weights and hard limits"
    )
    sim.add_argument("--duration", type=_positive_float, help="virtual seconds to simulate")
    sim.add_argument(
        "--rpm-limit", type=_positive_int, help="refuse a tenant's requests beyond N per minute"
    )
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--json", metavar="FILE", help="write the summary as JSON")
    sim.add_argument("--plot", metavar="FILE.png", help="plot service over time and latency")
    sim.add_argument("--write-trace", metavar="FILE", help="also save the requests as a trace")
    sim.set_defaults(handler=_sim)

    engine = commands.add_parser(
        "engine",
        help="vLLM's OpenAI server with the fair scheduler (needs vLLM 0.32)",
        description="Runs vLLM's `serve` with fairpool's scheduler, tenant checks and "
        "per-tenant metrics wired in. Options after the model that fairpool does not know "
        "go to vLLM (e.g. --port 8000 --max-model-len 4096).",
    )
    engine.add_argument("--model", required=True, help="model path or name, as vLLM takes it")
    engine.add_argument("--scheduler-config", metavar="FILE", help="scheduler configuration (YAML)")
    engine.add_argument("--policy", help="policy, overriding the configuration's")
    engine.set_defaults(handler=_engine, passes_unknown_options=True)

    fetch_model = commands.add_parser(
        "fetch-model",
        help="download a model (hf://, s3://, gs://) into a cache directory",
        description="Brings the weights of a model source into CACHE, downloading only what "
        "the cache does not hold yet, and prints the directory to load (the engine pods' "
        "init step; docs/kubernetes.md). Credentials: the files of --credentials (a mounted "
        "Secret: HF_TOKEN, AWS_ACCESS_KEY_ID, ...), else the environment's.",
    )
    fetch_model.add_argument("source", help="hf://org/model[@revision], s3://..., gs://...")
    fetch_model.add_argument("--cache", required=True, metavar="DIR", help="the cache directory")
    fetch_model.add_argument("--credentials", metavar="DIR", help="a mounted Secret's directory")
    fetch_model.add_argument(
        "--termination-log",
        metavar="FILE",
        help="also write a failure's cause there (Kubernetes: /dev/termination-log)",
    )
    fetch_model.set_defaults(handler=_fetch_model)

    drain = commands.add_parser(
        "drain",
        help="wait until the engine here serves nothing (the engine pods' preStop hook)",
        description="Waits --settle seconds, then until the engine at --url reports no "
        "request running or waiting, at most --timeout seconds in all. Exits 0 either way.",
    )
    drain.add_argument("--url", default="http://127.0.0.1:8000", help="the engine")
    drain.add_argument("--timeout", type=float, default=120.0, help="seconds at most (120)")
    drain.add_argument("--settle", type=float, default=5.0, help="seconds first (5)")
    drain.set_defaults(handler=_drain)

    engine_sim = commands.add_parser(
        "engine-sim",
        help="a simulated vLLM server: OpenAI API, metrics and the fair scheduler, no GPU",
        description="Serves vLLM's OpenAI API and metrics from a simulated engine (the "
        "simulator's cost model in wall-clock time) under the fair scheduler. "
        "See docs/engine.md.",
    )
    sim_options.add_arguments(engine_sim)
    engine_sim.set_defaults(handler=_engine_sim)

    gateway = commands.add_parser(
        "gateway",
        help="the tenant-facing OpenAI API: keys, limits, fair queue, D2LPM routing",
        description="Serves the OpenAI API to tenants in front of the pools' model servers. "
        "See docs/gateway.md for the configuration file.",
    )
    gateway.add_argument("--config", required=True, metavar="FILE", help="gateway configuration")
    gateway.add_argument("--host", help="tenant API interface (default: the configuration's)")
    gateway.add_argument("--port", type=int, help="tenant API port (default: the configuration's)")
    gateway.add_argument("--admin-port", type=int, help="admin API port (metrics, tenant state)")
    gateway.add_argument(
        "--drain-seconds",
        type=float,
        metavar="S",
        help="on SIGTERM, how long requests in flight may finish (default: the configuration's "
        "drainSeconds, 45)",
    )
    gateway.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes behind the one tenant port, one event loop (core) each; worker i's "
        "admin API is on the admin port + i (default 1; see docs/gateway.md)",
    )
    gateway.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    gateway.set_defaults(handler=_gateway)

    render = commands.add_parser(
        "render",
        help="print what the operator would create for manifests (a dry run, no cluster)",
        description="Prints every Deployment, Service and ConfigMap the operator creates for "
        "the InferencePools in the files, and the gateway's configuration Secret for the "
        "TenantQuotas (API keys as SHA-256 digests, never the keys). Problems the operator "
        "would report in a status condition go to stderr (exit status 1). "
        "See docs/operator.md.",
    )
    _manifest_files(render)
    render.add_argument(
        "-n", "--namespace", help="namespace of the objects (default $FAIRPOOL_NAMESPACE, default)"
    )
    render.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    render.add_argument(
        "--lws",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="placement chains as LeaderWorkerSets (default: StatefulSets per stage)",
    )
    _nodes_file(render)
    render.set_defaults(handler=_render)

    plan = commands.add_parser(
        "plan",
        help="the chains a placement pool gets: nodes, layer partitions, capacities, why",
        description="Plans every InferencePool with spec.placement in the files (seed 003: "
        "GBP-CR chains tuned by Theorem 3.7, one pipeline-parallel vLLM engine per chain) "
        "and prints the chains, the predicted response time, the idle nodes and the "
        "planner's reasons. See docs/placement.md.",
    )
    _manifest_files(plan)
    _nodes_file(plan)
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.set_defaults(handler=_plan)

    operator = commands.add_parser(
        "operator",
        help="the Kubernetes operator (kopf): pools and tenants of one namespace",
        description="Reconciles the InferencePools and TenantQuotas of one namespace into "
        "engine Deployments, Services, scheduler ConfigMaps and the gateway's configuration "
        "Secret, with status. Needs the operator extra. See docs/operator.md.",
    )
    operator.add_argument(
        "-n", "--namespace", help="namespace to watch (default $FAIRPOOL_NAMESPACE, the pod's)"
    )
    operator.add_argument(
        "--peering",
        default="fairpool",
        metavar="NAME",
        help="kopf peering object (KopfPeering) for leader election (default fairpool)",
    )
    operator.add_argument(
        "--standalone", action="store_true", help="no peering: the only operator replica"
    )
    operator.add_argument(
        "--priority", type=int, help="peering priority (default: from $POD_IP, else random)"
    )
    operator.add_argument(
        "--liveness", metavar="URL", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    operator.add_argument("--verbose", action="store_true", help="debug logging")
    operator.add_argument(
        "--log-format", choices=("plain", "json"), default="plain", help="log lines (plain)"
    )
    operator.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on PORT"
    )
    operator.set_defaults(handler=_operator)

    local = commands.add_parser(
        "up",
        help="run the manifests' pools and gateway on this machine (no cluster)",
        description="Reads InferencePool, TenantQuota and Secret manifests (the files you "
        "would `kubectl apply`) and runs the gateway and every pool replica as local "
        "processes until Ctrl-C. See docs/local.md.",
    )
    _manifest_files(local)
    local.add_argument("--port", type=int, default=8080, help="gateway port (8080)")
    local.add_argument("--admin-port", type=int, help="admin/metrics port (default: a free one)")
    local.add_argument(
        "--gateway-replicas",
        type=int,
        default=1,
        metavar="N",
        help="gateways to run (1); with several, each on its own ports (the first on --port), "
        "sharing tenants' limits through a local Valkey server started with them",
    )
    local.add_argument(
        "--fairness",
        choices=["on", "off"],
        default="on",
        help="off: FCFS scheduling and queueing, least-load routing (to compare)",
    )
    local.set_defaults(handler=_up)

    from fairpool_cli.load import options as load_options  # no HTTP library

    load = commands.add_parser(
        "load",
        help="multi-tenant load against an OpenAI-compatible endpoint, with a live table",
        description=load_options.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    load_options.add_arguments(load)
    load.set_defaults(handler=_load)

    policies = commands.add_parser("policies", help="list the local policies")
    policies.set_defaults(handler=_list_policies)
    return parser


def _manifest_files(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="manifests (YAML, several documents); repeatable",
    )


def _nodes_file(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--nodes",
        metavar="FILE",
        help="the cluster's Nodes (kubectl get nodes -o yaml), for placement discovery",
    )


def _key_values(option: str, items: list[str]) -> dict[str, object]:
    """KEY=VALUE pairs; VALUE is read as JSON when it parses (numbers, lists), else text."""
    parsed: dict[str, object] = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise ConfigError(option, f"expected KEY=VALUE, got {item!r}")
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value
        if isinstance(parsed[key], list):
            parsed[key] = tuple(parsed[key])  # type: ignore[arg-type]
    return parsed


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _live_demo(args: argparse.Namespace) -> int:
    from fairpool_cli.local.demo import run_demo

    return run_demo(_wide_console(), duration=args.duration)


def _demo(args: argparse.Namespace) -> int:
    scenarios = args.scenario or list(demo.SCENARIO_NAMES)
    compared = [scenario for scenario in scenarios if scenario != demo.PRIORITY]
    policies = args.policy or list(demo.DEMO_POLICIES)
    priority_policies = (
        (args.policy or [demo.PRIORITY_POLICY]) if demo.PRIORITY in scenarios else []
    )
    console = _wide_console()
    results: list[demo.RunResult] = []
    priority: list[demo.PriorityResult] = []
    with Progress(console=Console(stderr=True), transient=True) as progress:
        runs = len(compared) * len(policies) + 3 * len(priority_policies)
        task = progress.add_task("simulating", total=runs)
        for scenario in compared:
            for policy in policies:
                progress.update(task, description=f"{scenario} · {policy}")
                results.append(demo.run(scenario, policy, duration=args.duration, seed=args.seed))
                progress.advance(task)
        for policy in priority_policies:

            def started(label: str, policy: str = policy) -> None:
                if label != "on":  # the previous run is done
                    progress.advance(task)
                progress.update(task, description=f"{demo.PRIORITY} · {policy} · {label}")

            priority.append(demo.run_priority(policy, args.duration, args.seed, progress=started))
            progress.advance(task)
    for scenario in compared:
        console.print(_table(scenario, [r for r in results if r.scenario == scenario]))
    for result in priority:
        console.print(_priority_table(result))
        for finding in result.findings:
            console.print(f"{result.policy}: {finding}")
    if args.json:
        with open(args.json, "w") as out:
            records = [asdict(r) for r in results] + [asdict(r) for r in priority]
            json.dump(records, out, indent=2)
    if args.plot:
        plot = Path(args.plot)
        if results:
            console.print(f"plot: {plot_service_over_time(results, plot)}")
            plot = plot.with_name(f"{plot.stem}-priority{plot.suffix}")
        if priority:
            console.print(f"plot: {plot_priority(priority, plot)}")
    return 0


def _sim(args: argparse.Namespace) -> int:
    from fairpool.sim.run import SimulationOptions, run_command

    options = SimulationOptions(
        trace=args.trace,
        workload=args.workload,
        workers=args.workers,
        policy=args.policy,
        router=args.router,
        profile=args.profile,
        memory_tokens=args.memory_tokens,
        block_size=args.block_size,
        quantum=args.quantum,
        worker_quantum=args.worker_quantum,
        tenants=args.tenants,
        duration=args.duration,
        seed=args.seed,
        rpm_limit=args.rpm_limit,
        pool=args.pool,
        workload_params=_key_values("--workload-param", args.workload_param),
        policy_params=_key_values("--policy-param", args.policy_param),
        clients=tuple(_closed_loop(text) for text in args.client or ()),
        gateway_replicas=args.gateway_replicas,
        replica_traffic=args.replica_traffic,
    )
    run_command(options, args.json, args.plot, args.write_trace, _wide_console())
    return 0


def _closed_loop(text: str) -> ClosedLoop:
    """A `--client TENANT[@BAND]:STREAMS[:P:Q:O]` value (the band written as the flow's
    name is, `tenant@band`)."""
    parts = text.split(":")
    shapes = (2, 5)
    if len(parts) not in shapes or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise ConfigError(
            "--client",
            f"{text!r}: expected TENANT[@BAND]:STREAMS or TENANT[@BAND]:STREAMS:P:Q:O "
            "(prefix, question and output tokens)",
        )
    tenant, _, band = parts[0].partition("@")
    defaults = [512, 32, 64][len(parts) - 2 :]
    streams, prefix, question, output = [int(part) for part in parts[1:]] + defaults
    try:
        return ClosedLoop(tenant, streams, prefix, question, output, band=band or None)
    except ConfigError as error:
        raise ConfigError("--client", f"{text!r}: {error.parameter} {error.problem}") from None


def _engine(args: argparse.Namespace) -> int:
    from fairpool_engine.vllm.launch import run

    return run(args.model, args.vllm_args, args.scheduler_config, args.policy)


def _fetch_model(args: argparse.Namespace) -> int:
    from fairpool.api.model_source import parse_model_uri
    from fairpool_engine.fetch import FetchError, fetch, read_credentials

    try:
        uri = parse_model_uri(args.source)
    except ValueError as error:
        raise ConfigError("source", str(error)) from None
    if not uri.fetched:
        raise ConfigError("source", f"{uri} is loaded where it is: nothing to fetch")
    try:
        credentials = read_credentials(Path(args.credentials)) if args.credentials else None
        directory = fetch(uri, Path(args.cache), credentials)
    except FetchError as error:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {escape(str(error))}")
        if args.termination_log:
            Path(args.termination_log).write_text(str(error))
        return 1
    print(directory)
    return 0


def _drain(args: argparse.Namespace) -> int:
    from fairpool_engine.drain import drain

    for name in ("timeout", "settle"):
        value = getattr(args, name)
        if not 0 <= value <= 86_400:
            raise ConfigError(f"--{name}", f"must be within 0 and 86400 seconds, got {value}")
    drain(args.url.rstrip("/"), args.timeout, args.settle)
    return 0


def _engine_sim(args: argparse.Namespace) -> int:
    from fairpool_engine.sim.server import serve

    return serve(sim_options.from_args(args))


def _gateway(args: argparse.Namespace) -> int:
    from fairpool_gateway.server import configure_logging, serve

    configure_logging(args.log_level)
    if args.drain_seconds is not None and not 0 <= args.drain_seconds <= 3600:
        raise ConfigError("--drain-seconds", f"must be within 0 and 3600, got {args.drain_seconds}")
    if not 1 <= args.workers <= 64:
        raise ConfigError("--workers", f"must be within 1 and 64, got {args.workers}")
    return serve(
        args.config, args.host, args.port, args.admin_port, args.drain_seconds, args.workers
    )


def _render(args: argparse.Namespace) -> int:
    from fairpool.api.pool_plan import read_nodes
    from fairpool_operator.dry_run import format_objects, render_files

    nodes = read_nodes(args.nodes) if args.nodes else None
    rendering = render_files(args.files, args.namespace, None, args.lws, nodes)
    sys.stdout.write(format_objects(rendering.objects, args.output))
    for problem in rendering.problems:
        Console(stderr=True).print(f"[yellow]warning:[/yellow] {problem}", soft_wrap=True)
    return 1 if rendering.problems else 0


def _plan(args: argparse.Namespace) -> int:
    from fairpool_cli.plan_report import plan_command

    return plan_command(args.files, args.nodes, args.json, _wide_console())


def _operator(args: argparse.Namespace) -> int:
    from fairpool_operator.main import run

    if args.metrics_port is not None and not 1 <= args.metrics_port <= 65535:
        raise ConfigError("--metrics-port", f"must be a port number, got {args.metrics_port}")
    return run(
        args.namespace,
        args.peering,
        args.standalone,
        args.liveness,
        args.priority,
        args.verbose,
        log_format=args.log_format,
        metrics_port=args.metrics_port,
    )


def _up(args: argparse.Namespace) -> int:
    from fairpool_cli.local.up import up

    console = Console(soft_wrap=True)  # URLs must stay whole to be copied
    return up(
        args.files,
        args.port,
        args.admin_port,
        args.fairness == "on",
        console,
        gateway_replicas=args.gateway_replicas,
    )


def _load(args: argparse.Namespace) -> int:
    from fairpool_cli.load.options import run_command

    return run_command(args)


def _wide_console() -> Console:
    """Tables need ~110 columns; rich assumes 80 when stdout is not a terminal."""
    width = Console().width
    return Console(width=max(width, 110))


def _table(scenario: str, results: list[demo.RunResult]) -> Table:
    table = Table(title=f"{scenario}: {demo.SCENARIO_TITLES[scenario]}", title_justify="left")
    for column in ("policy", "tenant", "sent", "done", "service", "share", "TTFT p50"):
        table.add_column(column, justify="left" if column in ("policy", "tenant") else "right")
    for column in ("Jain", "hit rate", "tok/s"):
        table.add_column(column, justify="right")
    for result in results:
        for index, tenant in enumerate(result.tenants):
            first = index == 0
            table.add_row(
                result.policy if first else "",
                tenant.tenant,
                str(tenant.sent),
                str(tenant.finished),
                f"{tenant.service:,.0f}",
                f"{tenant.share:.0%}",
                "—" if tenant.ttft_p50 is None else f"{tenant.ttft_p50:.1f}s",
                f"{result.jain_index:.3f}" if first else "",
                f"{result.cache_hit_rate:.0%}" if first else "",
                f"{result.throughput:,.0f}" if first else "",
                end_section=index == len(result.tenants) - 1,
            )
    return table


def _priority_table(result: demo.PriorityResult) -> Table:
    title = f"{demo.PRIORITY} · {result.policy}: {demo.SCENARIO_TITLES[demo.PRIORITY]}"
    table = Table(title=title, title_justify="left")
    for column in ("priority", "tenant", "band", "sent", "done", "share"):
        table.add_column(
            column, justify="left" if column in ("priority", "tenant", "band") else "right"
        )
    for column in ("TTFT p50", "TTFT p99", "tok/s"):
        table.add_column(column, justify="right")
    for run in result.runs:
        for index, tenant in enumerate(run.tenants):
            table.add_row(
                run.label if index == 0 else "",
                tenant.tenant,
                tenant.band,
                str(tenant.sent),
                str(tenant.finished),
                f"{tenant.share:.0%}",
                demo.milliseconds(tenant.ttft_p50),
                demo.milliseconds(tenant.ttft_p99),
                f"{tenant.throughput:,.0f}",
                end_section=index == len(run.tenants) - 1,
            )
    return table


def _list_policies(args: argparse.Namespace) -> int:
    console = Console()
    for name, cls in POLICIES.items():
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        console.print(f"[bold]{name}[/bold]: {summary}")
    console.print("Append +memsafe to any name for memory-safe admission (seed 002).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
