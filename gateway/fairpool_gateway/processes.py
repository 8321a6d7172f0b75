"""`fairpool gateway --workers N`: N gateway processes behind one port, one event loop each.

A Python gateway is one event loop on one core. To use more cores in one pod, N processes
each bind the tenant port with SO_REUSEPORT, and the kernel spreads new connections over
them. Each process is a replica of the gateway in every respect:

- with `sharedState`, hard limits, the fleet's service record, D2LPM's deficits and the
  fair queues (their order and `maxOutstanding`) are shared as between pods, and each
  process counts as a replica for the fallback (`replicas` × N);
- without it, each process keeps its limits in memory divided by N (the fallback's rule),
  so the processes together stay near the limits, and `maxOutstanding` ÷ N (rounded up)
  per worker, so the engines see what one process would send;
- process i serves its admin API (metrics, tenant state, probes) on the admin port + i.

The parent only supervises: SIGTERM or SIGINT has every process drain and stop, and
if one exits on its own, the others are stopped and the parent exits with an error, so a
supervisor (Kubernetes, systemd) restarts the whole gateway rather than run it short.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable

from fairpool.api.gateway_config import GatewayConfig, GatewayPool
from fairpool.front.limits import divided_limits


def config_for_worker(config: GatewayConfig, workers: int) -> GatewayConfig:
    """What each of `workers` processes runs with (see the module's docstring)."""
    if workers == 1:
        return config
    shared = config.shared_state
    update: dict[str, object] = {
        "pools": [
            _pool_part(pool, workers) if shared is None else pool  # shared: peers count
            for pool in config.pools
        ]
    }
    if shared is not None:
        update["shared_state"] = shared.model_copy(update={"replicas": shared.replicas * workers})
    else:
        update["tenants"] = [
            tenant.model_copy(update={"limits": divided_limits(tenant.limits, workers)})
            for tenant in config.tenants
        ]
    return config.model_copy(update=update)


def _pool_part(pool: GatewayPool, workers: int) -> GatewayPool:
    """`pool` with its `maxOutstanding` divided among `workers` processes (rounded up)."""
    saturation = pool.routing.saturation
    part = math.ceil(saturation.max_outstanding / workers)
    saturation = saturation.model_copy(update={"max_outstanding": part})
    routing = pool.routing.model_copy(update={"saturation": saturation})
    return pool.model_copy(update={"routing": routing})


def run_workers(workers: int, run_one: Callable[[int], None]) -> int:
    """Fork `workers` processes, process i running `run_one(i)`; supervise them (see the
    module's docstring) and return the exit status for the parent."""
    children: dict[int, int] = {}  # pid → index
    for index in range(workers):
        pid = os.fork()
        if pid == 0:  # the child: serve, then leave without running the parent's cleanup
            code = 0
            try:
                run_one(index)
            except BaseException:  # reported here; the parent sees the status
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = index
    stopping = False

    def stop_all(_signum: int = signal.SIGTERM, _frame: object = None) -> None:
        # SIGTERM for Ctrl-C too: the terminal's SIGINT has reached every worker already,
        # and a second SIGINT would make them stop without draining.
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    status = 0
    while children:
        pid, wait_status = os.wait()
        if pid not in children:
            continue
        index = children.pop(pid)
        code = os.waitstatus_to_exitcode(wait_status)
        if not stopping:
            print(
                f"fairpool gateway: worker {index} exited ({code}); stopping the others",
                file=sys.stderr,
                flush=True,
            )
            status = 1
            stop_all()
        elif code not in (0, -signal.SIGTERM, -signal.SIGINT):
            status = status or 1
    return status
