"""`fairpool plan -f pool.yaml [--nodes nodes.yaml] [--json]`: the chains the operator would
deploy for each placement pool in the files, and why — without a cluster.

The table has one row per chain: its node slots in stage order, their groups, the layer
partition (`VLLM_PP_LAYER_PARTITION`), the capacity c_k (requests at once) and the
predicted service time T_k (so the chain serves up to c_k/T_k requests per second). Below
it: the chosen c, the predicted mean response time (Theorem 3.7's bounds under JFFC), the
idle nodes and the planner's reasons. `--json` prints a list with one object per pool, the
shape of `status.placement` plus the pool's name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import groupby

from rich.console import Console
from rich.table import Table

from fairpool.api.inference_pool import InferencePool
from fairpool.api.manifests import load_manifests
from fairpool.api.pool_plan import pool_plan, read_nodes, spec_field
from fairpool.placement.planner import PoolPlan
from fairpool.sched.errors import ConfigError


def plan_command(
    files: Sequence[str], nodes_file: str | None, as_json: bool, console: Console
) -> int:
    """Plans every placement pool of `files`; ConfigError (exit 2) names the field."""
    manifests = load_manifests(*files)
    pools = [pool for pool in manifests.pools if pool.spec.placement is not None]
    if not pools:
        raise ConfigError("-f", "no InferencePool with spec.placement in " + ", ".join(files))
    nodes = read_nodes(nodes_file) if nodes_file is not None else None
    plans = [(pool, plan_of(pool, nodes)) for pool in pools]
    if as_json:
        document = [{"pool": pool.name, **plan.to_dict()} for pool, plan in plans]
        console.print_json(json.dumps(document))
        return 0
    for pool, plan in plans:
        print_plan(pool, plan, console)
    return 0


def plan_of(pool: InferencePool, nodes: list[dict[str, object]] | None) -> PoolPlan:
    try:
        return pool_plan(pool, nodes)
    except ConfigError as error:
        field = spec_field(error.parameter, pool)
        raise ConfigError(f"InferencePool {pool.name}: {field}", error.problem) from None


def print_plan(pool: InferencePool, plan: PoolPlan, console: Console) -> None:
    placement = pool.spec.placement
    assert placement is not None
    rate = placement.workload.arrival_rate
    title = (
        f"InferencePool {pool.name}: {len(plan.chains)} chain(s) for "
        f"{pool.spec.model.name} at {rate:g} req/s"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("chain", no_wrap=True)
    table.add_column("nodes, stage order", min_width=24)
    table.add_column("groups", min_width=12)
    table.add_column("layer partition", no_wrap=True)
    for column in ("capacity c_k", "T_k (s)"):
        table.add_column(column, justify="right", no_wrap=True)
    for chain in plan.chains:
        table.add_row(
            chain.name,
            " → ".join(chain.nodes),
            group_runs(chain.groups),
            chain.partition_string,
            str(chain.capacity),
            f"{chain.service_seconds:.2f}",
        )
    console.print(table)
    bounds = plan.bounds
    console.print(f"capacity parameter c = {plan.capacity_param}")
    console.print(
        f"predicted mean response time: {bounds.lower:.2f} to {bounds.upper:.2f} s "
        "(Theorem 3.7, JFFC)"
    )
    console.print(f"tensor parallel per stage: {plan.tensor_parallel_size}")
    console.print(f"idle nodes: {', '.join(plan.idle_nodes) or 'none'}")
    reasons = Table.grid(padding=(0, 1))
    reasons.add_column(no_wrap=True)
    reasons.add_column()
    for line in plan.explanation:
        reasons.add_row("-", line)
    console.print("why:")
    console.print(reasons, highlight=False)


def group_runs(groups: Sequence[str]) -> str:
    """Each stage's group, runs collapsed: "h100, l40s ×2"."""
    runs = [(name, len(list(run))) for name, run in groupby(groups)]
    return ", ".join(name if count == 1 else f"{name} ×{count}" for name, count in runs)
