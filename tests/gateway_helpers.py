"""Gateways in front of `fairpool engine-sim` workers, on loopback, for the gateway's tests."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import httpx
from polling import wait_until
from sim_http import scrape

from fairpool.api.gateway_config import GatewayConfig, key_digest
from fairpool_engine.sim.options import SimOptions
from fairpool_engine.sim.server import ServerThread
from fairpool_gateway.server import GatewayThread

MODEL = "sim-model"
#: `clients.refusalBurst` for gateways whose tests send refusals by the hundred on purpose
#: (a malformed field eight times, a fuzzer): refusal storms are not damped there.
UNDAMPED = 1e9
KEYS = {"flood": "sk-flood-0001", "light": "sk-light-0002", "other": "sk-other-0003"}


def tenant_entry(tenant: str, weight: float = 1.0, **fields: Any) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "weight": weight,
        "apiKeySha256": [key_digest(KEYS[tenant])],
        **fields,
    }


def gateway_config(
    workers: list[str], tenants: list[dict[str, Any]], **pool_fields: Any
) -> GatewayConfig:
    pool = {"name": "main", "model": MODEL, "workers": {"urls": workers}, **pool_fields}
    # Health polls every 0.2 s, each given 30 s: a loaded machine may take over the default
    # second to answer one, and no test here is about slow answers (a dead worker refuses
    # connections, a failing one answers 503: both fail at once).
    return GatewayConfig.model_validate(
        {
            "pools": [pool],
            "tenants": tenants,
            "healthInterval": 0.2,
            "timeouts": {"health": 30.0},
        }
    )


@contextlib.contextmanager
def engines(count: int, **options: Any) -> Iterator[list[ServerThread]]:
    settings = {"model": MODEL, "speedup": 50.0, "access_log": False, **options}
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(ServerThread(SimOptions(**settings))) for _ in range(count)]


@contextlib.contextmanager
def gateway(config: GatewayConfig) -> Iterator[GatewayThread]:
    """The gateway, once every worker its pools list is in rotation (not only one: a test
    must not depend on which worker's first health check came back first)."""
    with GatewayThread(config) as running:
        wait_until(lambda: all_in_rotation(running, config), what="every worker in rotation")
        yield running


def all_in_rotation(running: GatewayThread, config: GatewayConfig) -> bool:
    listed = {pool.name: set(pool.workers.urls or ()) for pool in config.pools}
    pools = running.gateway.pools
    return all(set(pools[name].front.router.workers) >= urls for name, urls in listed.items())


class Settlements(logging.Handler):
    """The gateway's "request done" log records, in the order the gateway settled the
    requests (its own account of what it served, written as it happens). Each record
    also gets `in_flight`: the requests the pool's fair queue had admitted and not yet
    finished at that moment (read in the gateway's thread, as it logs)."""

    def __init__(self, running: GatewayThread) -> None:
        super().__init__(logging.INFO)
        self.queue = running.gateway.pools["main"].front.queue
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "request done":
            record.in_flight = self.queue.in_flight()
            self.records.append(record)


@contextlib.contextmanager
def settlements(running: GatewayThread) -> Iterator[Settlements]:
    """Collect the gateway's settlements (of its pool "main") for the block."""
    logger = logging.getLogger("fairpool.gateway")
    handler, level = Settlements(running), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextlib.contextmanager
def logging_kept() -> Iterator[None]:
    """For tests that run `fairpool gateway` in-process: its `configure_logging` gives the
    "fairpool" logger a handler of its own and stops propagation; put both back after."""
    logger = logging.getLogger("fairpool")
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    try:
        yield
    finally:
        logger.handlers[:], logger.propagate = handlers, propagate
        logger.setLevel(level)


def service(record: logging.LogRecord) -> float:
    """What the gateway charged for a settled request (the default cost: 1 per uncached
    prompt token, 2 per output token)."""
    return float(record.prompt_tokens - record.cached_tokens + 2 * record.completion_tokens)


def client(gateway: GatewayThread, tenant: str, **options: Any) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url,
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout=options.pop("timeout", 30),
        **options,
    )


def async_client(gateway: GatewayThread, tenant: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=gateway.url,
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout=60,
        limits=httpx.Limits(max_connections=None),
    )


def completion(prompt: str, max_tokens: int = 8, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, **fields}


def gateway_metric(gateway: GatewayThread, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(
        value
        for (sample, sample_labels), value in scrape(gateway.admin_url).items()
        if sample == name and wanted <= set(sample_labels)
    )
