"""`fairpool up -f FILE.yaml`: the manifests you would `kubectl apply`, run on this machine.

The manifests are validated before anything starts (a bad one is an error naming the
document and field). Then the pools' engines and the gateway start as child processes
(`local.supervisor`), the command waits until they answer, prints where everything is,
and keeps them running — restarting any that dies — until Ctrl-C or SIGTERM stops them
all. Edits to the manifests' tenants (weights, keys, limits) and pools' scheduling reach
the running processes within seconds; changes to a pool's replicas or engine need a
restart of `fairpool up`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

import httpx
from rich.console import Console

from fairpool.api.manifests import Manifests, load_manifests
from fairpool.files import FileWatch
from fairpool.sched.errors import ConfigError
from fairpool_cli.local.plan import Fairness, LocalPlan, plan_local
from fairpool_cli.local.supervisor import Supervisor
from fairpool_engine.fetch import FetchError, fetch, local_model_cache

READY_TIMEOUT = 300.0  # vLLM takes a while to load a model
WATCH_INTERVAL = 0.5


def up(
    paths: Sequence[str],
    port: int,
    admin_port: int | None,
    fairness: bool,
    console: Console,
    gateway_replicas: int = 1,
) -> int:
    manifests = load_manifests(*paths)
    fetch_models(manifests, console)
    workdir = Path(tempfile.mkdtemp(prefix="fairpool-up-"))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, _setter(stop)) for sig in (signal.SIGINT, signal.SIGTERM)}
    supervisor: Supervisor | None = None
    try:
        plan = plan_local(
            manifests, workdir, port, admin_port, Fairness(fairness), gateway_replicas
        )
        write_files(plan.files)
        supervisor = Supervisor(plan.processes, lambda line: console.print(f"[yellow]{line}"))
        supervisor.start()
        if not wait_until_ready(plan, supervisor, stop, console):
            return 130 if stop.is_set() else 1
        print_banner(plan, manifests, fairness, console)
        keep_running(plan, supervisor, stop, paths, console)
        console.print("stopping …")
        return 0
    finally:
        if supervisor is not None:
            supervisor.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def fetch_models(manifests: Manifests, console: Console) -> None:
    """Brings the weights of the vLLM pools with hf, s3 or gs sources into the local cache
    (credentials from the environment: HF_TOKEN, the AWS variables, Google's defaults)."""
    for pool in manifests.pools:
        uri = pool.spec.model.uri
        if pool.spec.engine.kind != "vllm" or uri is None or not uri.fetched:
            continue
        console.print(f"fetching {uri} into {local_model_cache()} …")
        try:
            fetch(uri, local_model_cache())
        except FetchError as error:
            raise ConfigError(f"InferencePool {pool.name}: spec.model.source", str(error)) from None


def _setter(stop: threading.Event) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    return handler


def write_files(files: dict[Path, str]) -> None:
    """Write each file whole (a new file renamed over the old), as the processes watching
    them must never read half of one."""
    for path, content in files.items():
        if path.exists() and path.read_text() == content:
            continue
        partial = path.with_suffix(path.suffix + ".partial")
        partial.write_text(content)
        os.replace(partial, path)


def wait_until_ready(
    plan: LocalPlan, supervisor: Supervisor, stop: threading.Event, console: Console
) -> bool:
    pending = {spec.name: spec.health_url for spec in plan.processes}
    deadline = time.monotonic() + READY_TIMEOUT
    with console.status("starting: " + ", ".join(pending)) as status:
        while pending:
            if stop.is_set():
                return False
            if time.monotonic() > deadline:
                console.print(
                    f"[red]not ready after {READY_TIMEOUT:g} s:[/red] {', '.join(pending)}"
                )
                return False
            supervisor.check()
            for name, url in list(pending.items()):
                if _answers(url):
                    del pending[name]
            status.update("starting: " + (", ".join(pending) or "done"))
            stop.wait(0.2)
    return True


def _answers(url: str) -> bool:
    """`url` answers 200 (http://), or accepts a connection (tcp://host:port)."""
    if url.startswith("tcp://"):
        host, _, port = url.removeprefix("tcp://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
        except OSError:
            return False
        return True
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def print_banner(plan: LocalPlan, manifests: Manifests, fairness: bool, console: Console) -> None:
    console.print(f"[bold green]fairpool is up[/bold green]{'' if fairness else ' (fairness off)'}")
    for replica in plan.gateways:
        console.print(f"  gateway  {replica.url}   (OpenAI API; Authorization: Bearer KEY)")
        console.print(
            f"  metrics  {replica.admin_url}/metrics   tenants: {replica.admin_url}/admin/tenants"
        )
    if plan.store_url is not None:
        console.print(
            f"  shared   {plan.store_url}   (the {len(plan.gateways)} gateways' tenant limits)"
        )
    for pool in manifests.pools:
        urls = ", ".join(plan.workers.get(pool.name, [])) or "no replicas"
        console.print(
            f"  pool {pool.name}: model {pool.spec.model.name}, "
            f"{pool.spec.replicas} × {pool.spec.engine.kind} engine ({urls})"
        )
    console.print("  tenants:")
    for quota in manifests.quotas:
        pools = ", ".join(quota.spec.pools) or "every pool"
        secret = quota.spec.api_key_secret_ref
        keys = f"keys in Secret {secret.name}" if secret else "no keys"
        place = quota.spec.slo.slo_class + (f" in {quota.spec.group}" if quota.spec.group else "")
        console.print(
            f"    {quota.tenant:<12} weight {quota.spec.weight:g}   {place}   {pools}   {keys}"
        )
    console.print("  Ctrl-C stops everything.")


def keep_running(
    plan: LocalPlan,
    supervisor: Supervisor,
    stop: threading.Event,
    paths: Sequence[str],
    console: Console,
) -> None:
    """Restart what dies and apply edits of the manifests, until asked to stop."""
    watched = FileWatch(*paths)
    while not stop.wait(WATCH_INTERVAL):
        supervisor.check()
        if watched.changed():
            apply_edit(plan, paths, console)


def apply_edit(plan: LocalPlan, paths: Sequence[str], console: Console) -> None:
    try:
        manifests = load_manifests(*paths)
        files = plan.config_files(manifests)
    except ConfigError as error:
        console.print(f"[red]manifests not applied, keeping the running ones:[/red] {error}")
        return
    running = {pool: len(urls) for pool, urls in plan.workers.items()}
    wanted = {pool.name: pool.spec.replicas for pool in manifests.pools}
    if running != wanted:
        console.print("[yellow]pools or replicas changed: restart `fairpool up` to apply[/yellow]")
        return
    write_files(files)
    console.print("manifests applied: tenants, groups, weights, limits and scheduling updated")
