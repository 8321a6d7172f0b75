"""Helpers for the tests that talk HTTP to `fairpool engine-sim` servers."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fairpool_engine.sim.server import ServerThread


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    text = httpx.get(f"{url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(url: str, name: str, **labels: str) -> float:
    """One sample, summed over the labels not given."""
    wanted = set(labels.items())
    return sum(
        value
        for (sample, sample_labels), value in scrape(url).items()
        if sample == name and wanted <= set(sample_labels)
    )


def drained(server: ServerThread) -> bool:
    """Nothing left anywhere: no request in flight, engine idle, policy empty."""
    runner = server.sim.runner
    policy = runner.engine.policy
    return (
        runner.in_flight == 0
        and runner.engine.idle()
        and policy.waiting_count == 0
        and policy.running_count == 0
        and runner.engine.memory_in_use == 0
    )


@contextlib.contextmanager
def held(*servers: ServerThread) -> Iterator[None]:
    """Inside the block the servers' engines take no step: a request that arrives waits
    in its engine's policy, none is admitted, none makes progress. On leaving, each engine
    goes on from there (at its next idle check, within a quarter of a second). For tests
    whose outcome must not depend on how fast requests arrive compared with how fast the
    engine serves them: everything arrives first, then the engine runs."""
    engines = [server.sim.runner.engine for server in servers]
    for engine in engines:
        engine.idle = lambda: True  # the runner waits, as for an engine with nothing to do
    try:
        yield
    finally:
        for engine in engines:
            del engine.idle


def sse_events(response: httpx.Response) -> list[Any]:
    """The `data:` payloads of a finished SSE response ("[DONE]" kept as text)."""
    events = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def tenant(name: str) -> dict[str, Any]:
    return {"vllm_xargs": {"fairpool_tenant": name}}


class Finishes:
    """An engine's listener (its runner), passed through; at each request that finishes,
    in the engine's own order, the service its policy has given each of `tenants` so far
    and how many requests each still has waiting."""

    def __init__(self, runner: Any, tenants: Iterable[str]) -> None:
        self.runner = runner
        self.tenants = tuple(tenants)
        self.events: list[tuple[dict[str, float], dict[str, int]]] = []

    def admitted(self, engine: Any, request: Any) -> None:
        self.runner.admitted(engine, request)

    def preempted(self, engine: Any, request: Any) -> None:
        self.runner.preempted(engine, request)

    def evicted(self, engine: Any, tokens: Any, keep: int) -> None:
        self.runner.evicted(engine, tokens, keep)

    def finished(self, engine: Any, completion: Any) -> None:
        self.runner.finished(engine, completion)
        policy = engine.policy
        served = {who: policy.served.get(who, 0.0) for who in self.tenants}
        self.events.append((served, {who: policy.tenant_waiting(who) for who in self.tenants}))
