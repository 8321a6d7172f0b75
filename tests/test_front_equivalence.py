"""The gateway and `fairpool sim` run one lifecycle: the same trace, through the real
gateway over loopback (engine-sim workers) and through the simulator's front in virtual
time, gets the same decisions — who is refused and why, who waits, in which order the
fair queue lets them through, which worker each goes to — and the same charges.

Both sides are built from one manifest file (an InferencePool and TenantQuotas), as a
user would simulate the gateway they deploy. The decisions depend only on the order of
events and the usage the engines report, so each scenario fixes the order by its shape,
never by timing:

- routing: requests one at a time over two workers, the next sent only once the previous
  is over and the gateway sees both engines idle (as the simulator's engines are); this
  exercises D2LPM's deficits and prefix tree, and the requests- and tokens-per-minute
  limits;
- queueing: one worker that is not up yet (a pool starting): every request is refused or
  queued before it joins — the test waits for the gateway to have decided each before
  sending the next — and then the fair queue releases them one at a time (one slot).

Prompts are words of three characters, so the gateway's estimate (4 characters a token)
is exact and its text keys and the simulator's token keys share the same prefixes.
"""

from __future__ import annotations

import dataclasses
import string
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from polling import wait_until

from fairpool.api.gateway_config import gateway_config_from_manifests
from fairpool.api.manifests import load_manifests
from fairpool.front import Flight, FrontListener, FrontRequest, Rejection, Settlement
from fairpool.sched.routers import RouteDecision
from fairpool.sim.fleet import Fleet
from fairpool.sim.run import SimulationOptions, fleet_config
from fairpool.sim.trace import Segment, TraceRequest
from fairpool_engine.sim.options import SimOptions as EngineOptions
from fairpool_engine.sim.server import ServerThread
from fairpool_gateway.server import GatewayThread

pytestmark = pytest.mark.loopback

MODEL = "sim-model"
PROFILE = "llama3-8b-h100"  # engine-sim's default
TENANTS: dict[str, dict[str, Any]] = {
    "a": {"weight": 1},
    "b": {"weight": 2},
    "c": {"weight": 1, "limits": {"queued": 2}},
    "d": {"weight": 1, "limits": {"tokensPerMinute": 200}},
    "e": {"weight": 1, "limits": {"requestsPerMinute": 3}},
}
DOC, QUESTION, OUTPUT = 48, 8, 8  # tokens


class Decisions(FrontListener):
    """What a pool's front decided, in order. The gateway knows each request by an id of
    its own; the scenarios send one request at a time until the front has seen it, so the
    n-th id seen is the trace's request `q{n}`, as the simulator names it."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self._names: dict[str, str] = {}

    def seen(self, request_id: str) -> bool:
        with self.lock:
            return any(event[1] == request_id for event in self.events)

    def add(self, kind: str, request_id: str, *rest: Any) -> None:
        with self.lock:
            name = self._names.setdefault(request_id, f"q{len(self._names)}")
            self.events.append((kind, name, *rest))

    def rejected(self, pool: str, request: FrontRequest, rejection: Rejection) -> None:
        self.add("refused", request.request_id, rejection.reason)

    def queued(self, flight: Flight) -> None:
        self.add("queued", flight.request_id)

    def dispatched(self, flight: Flight, decision: RouteDecision) -> None:
        self.add("dispatched", flight.request_id, decision.worker)

    def settled(self, settlement: Settlement) -> None:
        self.add(
            "settled",
            settlement.request.request_id,
            settlement.status,
            settlement.prompt_tokens,
            settlement.cached_tokens,
            settlement.completion_tokens,
        )


# ---------------------------------------------------------------------- the workload


def trace(arrival_gap: float) -> list[TraceRequest]:
    """Each tenant asks about its documents in turn, a few times, interleaved."""
    requests = []
    for round_ in range(4):
        for tenant in TENANTS:
            document = f"doc-{tenant}-{round_ % 2}"
            segments: tuple[Segment, ...] = ((document, DOC), (None, QUESTION))
            requests.append(
                TraceRequest(len(requests) * arrival_gap, tenant, segments, OUTPUT, OUTPUT)
            )
    return requests


def prompt_text(index: int, request: TraceRequest) -> str:
    """The trace request's prompt as three-character words. A named segment always gives
    the same words; every other one is unique, and starts with a character no other
    prompt has there, so text prefixes end where token prefixes do."""
    words: list[str] = []
    for name, length in request.segments:
        if name is None:
            first = (string.ascii_lowercase + string.digits)[index]
            seed = f"q{index}"
        else:
            first = string.ascii_uppercase[sorted(document_names()).index(name)]
            seed = name
        for position in range(length):
            words.append(word(first if position == 0 else None, seed, position))
    return " ".join(words)


def document_names() -> set[str]:
    return {f"doc-{tenant}-{n}" for tenant in TENANTS for n in (0, 1)}


def word(first: str | None, seed: str, position: int) -> str:
    letters = string.ascii_lowercase
    code = zlib.crc32(f"{seed}:{position}".encode())
    tail = letters[code % 26] + letters[(code // 26) % 26]
    return (first or letters[(code // 676) % 26]) + tail


def manifests(path: Path, replicas: int) -> Path:
    documents: list[dict[str, Any]] = [
        {
            "apiVersion": "fairpool.io/v1alpha1",
            "kind": "InferencePool",
            "metadata": {"name": "main"},
            "spec": {
                "model": {"name": MODEL},
                "engine": {"kind": "sim"},
                "replicas": replicas,
                # Engines that keep no weights: the gateway's queue alone decides who goes
                # (fair engines would have each tenant keep a request in every engine).
                "scheduler": {"policy": "fcfs"},
                "routing": {
                    "policy": "d2lpm",
                    "saturation": {"maxOutstanding": 1, "maxWaiting": 1000, "maxKvUsage": 1.0},
                    "queueTimeoutSeconds": 600,
                    "waitForWorkers": True,  # a pool starting holds its requests
                },
            },
        }
    ]
    for tenant, spec in TENANTS.items():
        documents.append(
            {
                "apiVersion": "fairpool.io/v1alpha1",
                "kind": "TenantQuota",
                "metadata": {"name": tenant},
                "spec": {"apiKeySecretRef": {"name": f"keys-{tenant}"}, **spec},
            }
        )
        documents.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"keys-{tenant}"},
                "stringData": {"key": f"sk-{tenant}"},
            }
        )
    file = path / "pool.yaml"
    file.write_text(yaml.safe_dump_all(documents))
    return file


# ---------------------------------------------------------------------- the two front ends


def simulate(file: Path, requests: list[TraceRequest], cold_start: float = 0.0) -> Decisions:
    config = fleet_config(SimulationOptions(pool=str(file), tenants=str(file), profile=PROFILE))
    fleet = Fleet(dataclasses.replace(config, cold_start=cold_start))
    decisions = Decisions()
    fleet.front.listeners.append(decisions)
    fleet.run(requests)
    return decisions


def serve(running: GatewayThread, index: int, request: TraceRequest) -> int:
    body = {
        "model": MODEL,
        "prompt": prompt_text(index, request),
        "max_tokens": request.max_tokens,
    }
    headers = {"Authorization": f"Bearer sk-{request.tenant}", "x-request-id": f"q{index}"}
    response = httpx.post(f"{running.url}/v1/completions", json=body, headers=headers, timeout=120)
    return response.status_code


def engines_idle(running: GatewayThread, workers: int) -> bool:
    """The gateway sees every worker in rotation, with nothing in flight or waiting, and
    its KV empty — as the simulator's front sees its idle engines."""
    state = httpx.get(f"{running.admin_url}/admin/pools").json()["main"]["workers"]
    return len(state) == workers and all(
        worker["healthy"]
        and worker["outstanding"] == 0
        and worker["waiting"] == 0
        and worker["kvUsage"] == 0
        for worker in state.values()
    )


def engine(port_holder: list[ServerThread]) -> ServerThread:
    server = ServerThread(EngineOptions(model=MODEL, speedup=50.0, access_log=False))
    port_holder.append(server)
    return server


def gateway_for(file: Path, servers: list[ServerThread]) -> GatewayThread:
    config = gateway_config_from_manifests(
        load_manifests(file),
        {"main": [server.url for server in servers]},
        healthInterval=0.2,
    )
    return GatewayThread(config)


def worker_names(
    events: list[tuple[Any, ...]], servers: list[ServerThread]
) -> list[tuple[Any, ...]]:
    """The gateway's events with worker URLs named as the simulator names its engines: in
    the same order, as routers break ties between equally loaded workers by name."""
    urls = sorted(server.url for server in servers)
    names = {url: f"w{index}" for index, url in enumerate(urls)}
    return [
        (*event[:2], names[event[2]]) if event[0] == "dispatched" else event for event in events
    ]


# ---------------------------------------------------------------------- the scenarios


def test_one_at_a_time_over_two_workers_routes_and_limits_alike(tmp_path):
    file = manifests(tmp_path, replicas=2)
    requests = trace(arrival_gap=2.0)  # virtual seconds: each is over long before the next
    simulated = simulate(file, requests)

    servers: list[ServerThread] = []
    with engine(servers), engine(servers), gateway_for(file, servers) as running:
        decisions = Decisions()
        running.gateway.listeners.append(decisions)
        for index, request in enumerate(requests):
            wait_until(lambda: engines_idle(running, 2))
            serve(running, index, request)
        wait_until(lambda: len(decisions.events) >= len(simulated.events))
    real = worker_names(decisions.events, servers)

    assert real == simulated.events
    kinds = {event[0] for event in real}
    refusals = {event[2] for event in real if event[0] == "refused"}
    workers = {event[2] for event in real if event[0] == "dispatched"}
    assert kinds == {"dispatched", "settled", "refused"}
    assert refusals == {"tokens_per_minute", "requests_per_minute"}
    assert workers == {"w0", "w1"}
    assert any(event[0] == "settled" and event[4] > 0 for event in real)  # cache hits


def test_a_pool_that_starts_late_releases_its_queue_alike(tmp_path):
    file = manifests(tmp_path, replicas=1)
    requests = trace(arrival_gap=0.001)  # all before the worker joins at 1 s
    simulated = simulate(file, requests, cold_start=1.0)

    servers: list[ServerThread] = []
    server = engine(servers)  # its port is bound, not yet listening: the worker is down
    with gateway_for(file, servers) as running:
        decisions = Decisions()
        running.gateway.listeners.append(decisions)
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            answers = []
            for index, request in enumerate(requests):
                answers.append(pool.submit(serve, running, index, request))
                wait_until(lambda rid=f"q{index}": decisions.seen(rid))
            with server:  # the worker comes up
                statuses = [answer.result(timeout=120) for answer in answers]
                wait_until(lambda: len(decisions.events) >= len(simulated.events))
    real = worker_names(decisions.events, servers)

    assert real == simulated.events
    refusals = {event[2] for event in real if event[0] == "refused"}
    assert refusals == {"queued", "tokens_per_minute", "requests_per_minute"}
    assert statuses.count(200) == sum(1 for event in real if event[0] == "dispatched")
    released = [event[1] for event in real if event[0] == "dispatched"]
    arrived = [f"q{index}" for index in range(len(requests))]
    assert released != [rid for rid in arrived if rid in released]  # fair order, not FIFO
