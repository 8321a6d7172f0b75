"""`fairpool operator`: the kopf operator, run in-process for one namespace."""

from __future__ import annotations

import ipaddress
import os
import random

from fairpool.sched.errors import ConfigError
from fairpool_operator.config import OperatorConfig


def run(
    namespace: str | None,
    peering: str,
    standalone: bool,
    liveness: str | None,
    priority: int | None,
    verbose: bool = False,
    log_format: str = "plain",
    metrics_port: int | None = None,
) -> int:
    """Runs until SIGINT/SIGTERM. With peering, the operator replica of the highest
    priority works and the others wait (kopf's peering through the KopfPeering `peering`)."""
    try:
        import kopf
    except ImportError:
        raise ConfigError(
            "fairpool operator", "needs the operator extra: pip install 'fairpool[operator]'"
        ) from None
    config = OperatorConfig.from_environment(namespace=namespace)
    formats = {"plain": kopf.LogFormat.PLAIN, "json": kopf.LogFormat.JSON}
    kopf.configure(verbose=verbose, log_format=formats[log_format])
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)  # fairpool_operator.metrics, and the process's
    from fairpool_operator import handlers  # registers the handlers with kopf

    if config.watch_nodes:
        handlers.watch_nodes()

    kopf.run(
        namespaces=[config.namespace],
        standalone=standalone,
        peering_name=None if standalone else peering,
        priority=default_priority() if priority is None else priority,
        liveness_endpoint=liveness,
        memo=kopf.Memo(config=config),
    )
    return 0


def default_priority() -> int:
    """Distinct among replicas (kopf freezes operators of equal priority): the pod's IP as a
    number (the chart sets POD_IP), else a random one."""
    try:
        return 1 + int(ipaddress.ip_address(os.environ.get("POD_IP", ""))) % (2**31 - 2)
    except ValueError:
        return random.SystemRandom().randint(1, 2**31 - 1)
