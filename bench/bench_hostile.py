"""One client against the gateway, attack by attack: does everyone else still get served?

Everything runs on this machine: a Valkey server (the replicas' shared state, started from
the package the project installs), two `fairpool engine-sim` workers (`--speedup 20`,
4,096-dimension embeddings) and the gateway with its default client bounds, each a process
of its own; the gateway is pinned to core 0 and everything else to the other cores, so
the gateway — not the load generator — is what is measured. The victim, tenant `alpha`,
keeps `--victim-streams` (4) streamed completions in flight from this process for the whole
run, and probes the admin port's `/healthz` every 0.2 s. Each attack runs in a process of
its own, from its own loopback address (127.0.0.2), for `--seconds` (30), after a baseline
phase of the same length with no attack:

| attack | goal |
|---|---|
| 5,000 idle connections from one address | the victim served; probes answer |
| 100 zero-window streams from one tenant | each socket reset within writeTimeout + 5 s |
| 250 half-sent 4 MB bodies under one key | RSS growth ≤ the tenant's byte budget |
| 8 concurrent 4 MB array bombs | no worker ejected; victim p99 ≤ 2 × baseline |
| an embeddings answer over the cap | 502 naming the cap; RSS growth ≤ the cap |
| forged report, 1e300 and NaN in the shared state | ignored; the victim unaffected |
| a retry storm of 429s with no back-off | victim p50 ≤ 1.5 × baseline |

Measured for each phase: the victim's requests (served in full, failed), their latency
(p50, p99, from the request to the stream's end), the probes that failed, the gateway's
RSS (sampled every 0.1 s from /proc: its rise over the RSS before the attack), workers
ejected (the gateway's "out of rotation" log lines), and what the attack itself saw.

Results: bench/results/hostile.json (every number), hostile.md (the machine, the command,
a table per goal, each verdict computed from the numbers), hostile.png (the victim's
latency and the gateway's RSS per phase).

Run: `python bench/bench_hostile.py` (about six minutes); `--quick` runs each attack for 4 s
at a tenth of its size, records nothing, and fails only if the victim was never served.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import resource
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import RESULTS, write_results
from routers import HOST, EngineOptions, Process, StartError, free_port, spawn, start_engines
from routers import wait_until as wait_for_process

from fairpool.api.gateway_config import GatewayConfig, key_digest
from fairpool.sim.metrics import percentile
from fairpool_cli.local.store import LocalStore

MODEL = "sim"
MAX_MODEL_LEN = 8192
EMBEDDING_DIM = 4096
ATTACKER = "127.0.0.2"  # the attacks' own loopback address
VICTIM = "alpha"
HOSTILE = "mallory"


def attacker_tenant(attack: str) -> str:
    """The tenant an attack sends as: one of its own, so that the refusals of one attack,
    which the gateway damps per tenant, do not decide how the gateway meets the next."""
    return f"{HOSTILE}-{attack.replace(' ', '-')}"


STORM = "storm"
TENANTS = {
    VICTIM: {},
    # Room for the attacks to reach the gateway's bounds, not the tenant's own limits.
    **{
        attacker_tenant(attack): {"concurrent": 512, "requestsPerMinute": 100_000, "queued": 512}
        for attack in ("zero-window streams", "half-sent bodies", "array bombs", "huge answers")
    },
    STORM: {"requestsPerMinute": 1},
}
#: The gateway's client bounds: the defaults but a shorter write timeout, so that the
#: zero-window readers reach it within a phase.
CLIENTS = {"writeTimeout": 5.0}
DEFAULTS = GatewayConfig.model_validate({}).clients
VICTIM_TOKENS = 32
ZERO_WINDOW_TOKENS = 4000
SAMPLE_INTERVAL = 0.1
PROBE_INTERVAL = 0.2


def key(tenant: str) -> str:
    return f"fairpool-hostile-{tenant}"


def say(message: str) -> None:
    print(f"[hostile] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the system


@dataclass(frozen=True)
class Target:
    """What an attack's process needs to know of the system (it is sent to that process)."""

    url: str
    admin_url: str
    store_port: int
    prefix: str
    pool: str
    workers: list[str]


@dataclass
class System:
    gateway: Process
    target: Target

    @property
    def url(self) -> str:
        return self.target.url

    @property
    def admin_url(self) -> str:
        return self.target.admin_url


def gateway_document(port: int, admin: int, workers: list[str], store: str) -> dict[str, Any]:
    document = {
        "listen": {"host": HOST, "port": port},
        "admin": {"host": HOST, "port": admin},
        "clients": CLIENTS,
        "sharedState": {"url": store, "replicas": 1, "timeoutSeconds": 2.0},
        "pools": [
            {
                "name": "hostile",
                "model": MODEL,
                "maxModelLen": MAX_MODEL_LEN,
                "workers": {"urls": workers},
                "routing": {"saturation": {"maxOutstanding": 64}, "queueTimeoutSeconds": 60},
            }
        ],
        "tenants": [
            {"tenant": name, "apiKeySha256": [key_digest(key(name))], "limits": limits}
            for name, limits in TENANTS.items()
        ],
    }
    config = GatewayConfig.model_validate(document)
    dumped: dict[str, Any] = json.loads(config.model_dump_json(by_alias=True, exclude_none=True))
    return dumped


def start_gateway(workers: list[str], store: LocalStore, logs: Path, cores: str | None) -> System:
    port, admin = free_port(), free_port()
    document = gateway_document(port, admin, workers, store.url)
    path = logs / "gateway.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    command = [sys.executable, "-m", "fairpool_cli", "gateway", "--config", str(path)]
    process = spawn("gateway", command, cores, logs)
    target = Target(
        f"http://{HOST}:{port}",
        f"http://{HOST}:{admin}",
        store.port,
        document["sharedState"].get("keyPrefix", "fairpool"),
        "hostile",
        workers,
    )
    system = System(process, target)

    def serving() -> bool:
        body = {"model": MODEL, "prompt": "Ready?", "max_tokens": 1}
        answer = httpx.post(f"{system.url}/v1/completions", json=body, headers=auth(VICTIM))
        return answer.status_code == 200

    wait_for_process(serving, process, 60, "the gateway")
    return system


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key(tenant)}"}


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def ejections(log: Path) -> list[str]:
    """Why the gateway took workers out of rotation so far, one entry each (its log lines
    `worker URL out of rotation: REASON`)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        with contextlib.suppress(ValueError, KeyError):
            message = json.loads(line)["message"]
            if " out of rotation: " in message:
                found.append(message.split(" out of rotation: ", 1)[1])
    return found


def cuts(log: Path) -> dict[str, float]:
    """When the gateway cut each answer whose client stopped reading, by the client's
    request id (its log lines)."""
    found: dict[str, float] = {}
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        if "answer cut" not in line:
            continue
        with contextlib.suppress(ValueError, KeyError):
            record = json.loads(line)
            found[str(record["client_request_id"])] = float(record["time"])
    return found


def forged_warnings(log: Path) -> int:
    """Warnings the gateway logged about entries of the shared state it would not trust."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if '"level": "warning"' in line and "shared" in line.lower())


# ---------------------------------------------------------------------- the victim


@dataclass
class Victim:
    """`alpha`'s streams and the admin probes, while `running()`."""

    system: System
    latencies: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    probes: Counter[str] = field(default_factory=Counter)

    async def stream(self, http: httpx.AsyncClient, number: int) -> None:
        body = {
            "model": MODEL,
            "prompt": f"Victim question {number}: what does the harbour ledger say today?",
            "max_tokens": VICTIM_TOKENS,
            "stream": True,
        }
        started = time.monotonic()
        try:
            async with http.stream("POST", "/v1/completions", json=body) as answer:
                text = b"".join([chunk async for chunk in answer.aiter_bytes()])
            if answer.status_code != 200:
                self.outcomes[str(answer.status_code)] += 1
                return
            if not text.rstrip().endswith(b"data: [DONE]"):
                self.outcomes["cut"] += 1
                return
        except httpx.HTTPError as error:
            self.outcomes[type(error).__name__] += 1
            return
        self.outcomes["200"] += 1
        self.latencies.append(time.monotonic() - started)

    async def run(self, streams: int, running: Callable[[], bool]) -> None:
        limits = httpx.Limits(max_connections=streams + 2)
        async with httpx.AsyncClient(
            base_url=self.system.url, headers=auth(VICTIM), timeout=120, limits=limits
        ) as http:
            numbers = iter(range(10**9))

            async def loop() -> None:
                while running():
                    await self.stream(http, next(numbers))

            await asyncio.gather(*(loop() for _ in range(streams)), self.probe(running))

    async def probe(self, running: Callable[[], bool]) -> None:
        async with httpx.AsyncClient(base_url=self.system.admin_url, timeout=5) as http:
            while running():
                try:
                    answer = await http.get("/healthz")
                    self.probes[str(answer.status_code)] += 1
                except httpx.HTTPError as error:
                    self.probes[type(error).__name__] += 1
                await asyncio.sleep(PROBE_INTERVAL)

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        return {
            "served": self.outcomes.get("200", 0),
            "failed": sum(n for outcome, n in self.outcomes.items() if outcome != "200"),
            "outcomes": dict(self.outcomes),
            "p50_s": round(percentile(ordered, 0.5) or 0.0, 4),
            "p99_s": round(percentile(ordered, 0.99) or 0.0, 4),
            "probes_ok": self.probes.get("200", 0),
            "probes_failed": sum(n for outcome, n in self.probes.items() if outcome != "200"),
        }


# ---------------------------------------------------------------------- raw attack sockets


async def connect(url: str, receive_buffer: int | None = None) -> socket.socket | None:
    """A non-blocking connection from the attacker's address; None if refused or reset."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.bind((ATTACKER, 0))
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    except OSError:
        sock.close()
        return None
    return sock


def tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of `sock` (1 established, 7 closed: reset or closed)."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return 7


ESTABLISHED = 1


async def read_answer(sock: socket.socket, limit: float = 60.0) -> str:
    """Read until the gateway ends the connection or `limit` passes; the answer's status
    (or `reset`, `closed`, `timeout` if none came)."""
    loop = asyncio.get_running_loop()
    received = b""
    how = "timeout"
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(limit):
            while True:
                try:
                    chunk = await loop.sock_recv(sock, 65536)
                except ConnectionResetError:
                    how = "reset"
                    break
                if not chunk:
                    how = "closed"
                    break
                received += chunk
                if b"\r\n\r\n" in received and b"content-length" in received.lower():
                    head, _, body = received.partition(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    if len(body) >= length:
                        break
    if received.startswith(b"HTTP/1.1 "):
        return received.split(b" ", 2)[1].decode()
    return how


def request_head(path: str, tenant: str | None, length: int, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
    if tenant is not None:
        head += f"Authorization: Bearer {key(tenant)}\r\n"
    return (head + extra + f"Content-Length: {length}\r\n\r\n").encode()


# ---------------------------------------------------------------------- the attacks


Attack = Callable[[Target, float, float], Coroutine[Any, Any, dict[str, Any]]]


def keep_established(sockets: list[socket.socket]) -> list[socket.socket]:
    """The sockets still established; the others (reset by the gateway) are closed."""
    kept = []
    for sock in sockets:
        if tcp_state(sock) == ESTABLISHED:
            kept.append(sock)
        else:
            sock.close()
    return kept


async def idle_connections(system: Target, seconds: float, scale: float) -> dict[str, Any]:
    """As many idle connections from one address as it can hold, reopened when reset."""
    wanted = max(10, int(5000 * scale))
    end = time.monotonic() + seconds
    held: list[socket.socket] = []
    opened = refused = 0
    most = 0
    while time.monotonic() < end:
        held = keep_established(held)
        while len(held) < wanted and time.monotonic() < end:
            sock = await connect(system.url)
            opened += 1
            if sock is None:
                refused += 1
                continue
            held.append(sock)
        await asyncio.sleep(0.05)  # the gateway resets those over its budget
        alive = [sock for sock in held if tcp_state(sock) == ESTABLISHED]
        most = max(most, len(alive))
        await asyncio.sleep(0.2)
    for sock in held:
        sock.close()
    return {
        "wanted": wanted,
        "opened": opened,
        "refused_at_connect": refused,
        "established_at_most": most,  # as this end saw them: the backlog's included
    }


async def zero_window_streams(system: Target, seconds: float, scale: float) -> dict[str, Any]:
    """Streams whose reader reads nothing: when each socket was reset (or closed), by the
    stream's `x-request-id`; the phase lasts until every socket is closed (at most
    `seconds` + 180 s). Each stream is some 600 KB: more than the kernel's send buffer
    (`clients.sendBufferBytes`, doubled) and the transport's, so its writes stall."""
    count = max(4, int(100 * scale))
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": "Tell me the whole ledger.",
            "max_tokens": ZERO_WINDOW_TOKENS,
            "stream": True,
        }
    ).encode()
    loop = asyncio.get_running_loop()
    sockets: dict[str, socket.socket] = {}
    for index in range(count):
        sock = await connect(system.url, receive_buffer=4096)
        if sock is None:
            continue
        name = f"zero-window-{index}"
        tenant = attacker_tenant("zero-window streams")
        head = request_head("/v1/completions", tenant, len(body), f"x-request-id: {name}\r\n")
        await loop.sock_sendall(sock, head + body)
        sockets[name] = sock  # from now on nothing is read
    closed_at: dict[str, float] = {}
    end = time.monotonic() + seconds + 180
    while len(closed_at) < len(sockets) and time.monotonic() < end:
        for name, sock in sockets.items():
            if name not in closed_at and tcp_state(sock) != ESTABLISHED:
                closed_at[name] = time.time()
                sock.close()
        await asyncio.sleep(0.05)
    for name, sock in sockets.items():
        if name not in closed_at:
            sock.close()
    return {"streams": len(sockets), "closed_at": closed_at}


async def slow_bodies(system: Target, seconds: float, scale: float) -> dict[str, Any]:
    """Half-sent 4 MB bodies under one key, kept open (reopened when answered)."""
    count = max(4, int(250 * scale))
    length = 4 << 20
    half = b'{"model": "sim", "prompt": "' + b"x" * (1 << 20)
    outcomes: Counter[str] = Counter()
    end = time.monotonic() + seconds
    loop = asyncio.get_running_loop()

    async def one() -> None:
        while time.monotonic() < end:
            sock = await connect(system.url)
            if sock is None:
                outcomes["refused"] += 1
                await asyncio.sleep(0.1)
                continue
            try:
                tenant = attacker_tenant("half-sent bodies")
                await loop.sock_sendall(sock, request_head("/v1/completions", tenant, length))
                with contextlib.suppress(OSError):
                    await loop.sock_sendall(sock, half)
                outcomes[await read_answer(sock, max(0.1, end - time.monotonic()))] += 1
            finally:
                sock.close()

    await asyncio.gather(*(one() for _ in range(count)))
    return {"connections": count, "outcomes": dict(outcomes)}


def array_bomb() -> bytes:
    return b'{"model": "sim", "prompt": [' + b",".join([b"[]"] * 1_398_000) + b"]}"


async def array_bombs(system: Target, seconds: float, scale: float) -> dict[str, Any]:
    """Eight clients posting 4 MB bodies of empty lists, over and over."""
    bomb = array_bomb()
    head = request_head("/v1/completions", attacker_tenant("array bombs"), len(bomb))
    outcomes: Counter[str] = Counter()
    end = time.monotonic() + seconds
    loop = asyncio.get_running_loop()

    async def one() -> None:
        while time.monotonic() < end:
            sock = await connect(system.url)
            if sock is None:
                outcomes["refused"] += 1
                await asyncio.sleep(0.1)
                continue
            try:
                with contextlib.suppress(OSError):
                    await loop.sock_sendall(sock, head + bomb)
                outcomes[await read_answer(sock)] += 1
            finally:
                sock.close()

    await asyncio.gather(*(one() for _ in range(8)))
    return {"bomb_bytes": len(bomb), "outcomes": dict(outcomes)}


async def huge_answers(system: Target, seconds: float, scale: float) -> dict[str, Any]:
    """Embeddings requests of 2,048 inputs to a 4,096-dimension pool: a 17 KB request
    buying a ~90 MB answer."""
    inputs = max(8, int(2048 * scale))
    body = {"model": MODEL, "input": ["ledger"] * inputs}
    outcomes: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    end = time.monotonic() + seconds
    headers = auth(attacker_tenant("huge answers"))
    async with httpx.AsyncClient(base_url=system.url, headers=headers, timeout=300) as http:
        while time.monotonic() < end:
            try:
                answer = await http.post("/v1/embeddings", json=body)
            except httpx.HTTPError as error:
                outcomes[type(error).__name__] += 1
                continue
            outcomes[str(answer.status_code)] += 1
            if answer.status_code >= 400:
                said = answer.json().get("error", {})
                errors[f"{said.get('code')} ({said.get('param')})"] += 1
    return {
        "inputs": inputs,
        "request_bytes": len(json.dumps(body)),
        "outcomes": dict(outcomes),
        "errors": dict(errors),
    }


async def forged_state(system: Target, seconds: float, scale: float) -> dict[str, Any]:
    """Entries no replica wrote, into the shared server, every 0.2 s: a report of a replica
    that is not live holding every worker full, one whose expiry is far in the future,
    charges of 1e300 and NaN, and a token bucket that is not a number."""
    server = redis.Redis(host=HOST, port=system.store_port)
    tag = f"{system.prefix}:pool:{{{system.pool}}}"
    full = {"inFlight": {worker: 10**6 for worker in system.workers}, "queued": {}}
    written = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        server.hset(f"{tag}:holdings", "f0f0f0f0f0f0", json.dumps(full))
        server.hset(f"{tag}:holdings", "e0e0e0e0e0e0", json.dumps(full))
        server.zadd(f"{tag}:replicas", {"e0e0e0e0e0e0": 1e18})
        for service in ("1e300", "nan", "-1e300", "inf"):
            server.xadd(
                f"{tag}:charges",
                {
                    "replica": "f0f0f0f0f0f0",
                    "tenant": VICTIM,
                    "worker": system.workers[0],
                    "service": service,
                },
            )
        second = int(server.time()[0])
        server.hset(f"{system.prefix}:{{{VICTIM}}}:tokens", str(second), "nan")
        written += 8
        await asyncio.sleep(0.2)
    server.close()
    return {"entries_written": written}


async def retry_storm(system: Target, seconds: float, scale: float) -> dict[str, Any]:
    """A tenant allowed one request a minute, retrying its 429s at once on 16 connections."""
    outcomes: Counter[str] = Counter()
    end = time.monotonic() + seconds
    body = {"model": MODEL, "prompt": "again", "max_tokens": 1}

    async def one(http: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            try:
                answer = await http.post("/v1/completions", json=body)
                outcomes[str(answer.status_code)] += 1
            except httpx.HTTPError as error:
                outcomes[type(error).__name__] += 1

    transport = httpx.AsyncHTTPTransport(local_address=ATTACKER)
    async with httpx.AsyncClient(
        base_url=system.url,
        headers=auth(STORM),
        timeout=30,
        transport=transport,
        limits=httpx.Limits(max_connections=16),
    ) as http:
        await asyncio.gather(*(one(http) for _ in range(16)))
    attempts = sum(outcomes.values())
    return {
        "attempts": attempts,
        "per_second": round(attempts / seconds, 1),
        "outcomes": dict(outcomes),
    }


ATTACKS: dict[str, Attack] = {
    "idle connections": idle_connections,
    "zero-window streams": zero_window_streams,
    "half-sent bodies": slow_bodies,
    "array bombs": array_bombs,
    "huge answers": huge_answers,
    "forged shared state": forged_state,
    "retry storm": retry_storm,
}


def run_attack(name: str, target: Target, seconds: float, scale: float, out: Any) -> None:
    """The attack's process: its own event loop, its findings sent back through `out`."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    out.send(asyncio.run(ATTACKS[name](target, seconds, scale)))


# ---------------------------------------------------------------------- phases


@dataclass
class Phase:
    name: str
    victim: dict[str, Any]
    attack: dict[str, Any]
    rss_before_mb: float
    rss_peak_mb: float
    rss_after_mb: float
    ejected: list[str]  # why each worker left rotation
    forged_warnings: int
    rss: list[tuple[float, float]]
    connections: list[tuple[float, int]]  # the gateway's open tenant connections
    cuts: dict[str, float]  # answers cut for clients that stopped reading: id → time

    @property
    def rss_growth_mb(self) -> float:
        return round(self.rss_peak_mb - self.rss_before_mb, 1)

    def attack_requests(self) -> str:
        """What the attack sent that engines served, in its own words."""
        if "streams" in self.attack:
            return f"{self.attack['streams']} streams of {ZERO_WINDOW_TOKENS:,} tokens"
        if "inputs" in self.attack:
            return f"embeddings of {self.attack['inputs']:,} inputs × {EMBEDDING_DIM:,} dimensions"
        return ""


async def phase(
    name: str, system: System, seconds: float, scale: float, streams: int, cores: str | None
) -> Phase:
    say(f"{name}: {seconds:g} s")
    log = system.gateway.log
    ejected_before, warned_before = ejections(log), forged_warnings(log)
    rss_before = rss_mb(system.gateway.pid)
    receiver, sender = multiprocessing.Pipe(duplex=False)
    attacker = None
    if name in ATTACKS:
        attacker = multiprocessing.get_context("spawn").Process(
            target=run_attack, args=(name, system.target, seconds, scale, sender), daemon=True
        )
        attacker.start()
        if cores is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(attacker.pid or 0, {int(c) for c in cores.split(",")})
    start = time.monotonic()
    end = start + seconds
    victim = Victim(system)
    samples: list[tuple[float, float]] = []
    connections: list[tuple[float, int]] = []

    async def sample() -> None:
        async with httpx.AsyncClient(base_url=system.admin_url, timeout=5) as http:
            while time.monotonic() < end or (attacker is not None and attacker.is_alive()):
                at = round(time.monotonic() - start, 2)
                samples.append((at, rss_mb(system.gateway.pid)))
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    status = (await http.get("/admin/status")).json()
                    connections.append((at, status["clients"]["connections"]["tenant"]))
                await asyncio.sleep(SAMPLE_INTERVAL)

    await asyncio.gather(victim.run(streams, lambda: time.monotonic() < end), sample())
    found: dict[str, Any] = {}
    if attacker is not None:
        attacker.join(timeout=600)
        if receiver.poll(5):
            found = receiver.recv()
    await settle(system)
    return Phase(
        name,
        victim.summary(),
        found,
        round(rss_before, 1),
        round(max((rss for _, rss in samples), default=rss_before), 1),
        round(rss_mb(system.gateway.pid), 1),
        ejections(log)[len(ejected_before) :],
        forged_warnings(log) - warned_before,
        samples,
        connections,
        {name: at for name, at in cuts(log).items() if name.startswith("zero-window")},
    )


async def settle(system: System, limit: float = 60.0) -> None:
    """Until the gateway holds nothing for anyone (or `limit` seconds)."""
    deadline = time.monotonic() + limit
    async with httpx.AsyncClient(timeout=10) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                status = (await http.get(f"{system.admin_url}/admin/status")).json()
                clients = status["clients"]
                if clients["bytesInFlight"] == 0 and clients["connections"]["tenant"] == 0:
                    return
            await asyncio.sleep(0.5)


# ---------------------------------------------------------------------- verdicts


def verdicts(phases: dict[str, Phase]) -> list[dict[str, Any]]:
    """Each goal of the issue, measured: what was wanted, what was seen, met or not."""
    base = phases["baseline"].victim
    rows = []

    def row(attack: str, goal: str, seen: str, met: bool) -> None:
        rows.append({"attack": attack, "goal": goal, "measured": seen, "met": met})

    def served(attack: str) -> tuple[str, bool]:
        victim = phases[attack].victim
        ok = victim["served"] > 0 and victim["failed"] == 0
        return f"victim {victim['served']} served, {victim['failed']} failed", ok

    if "idle connections" in phases:
        p = phases["idle connections"]
        text, ok = served("idle connections")
        probes = p.victim["probes_failed"]
        held = max((count for _, count in p.connections), default=0)
        row(
            "idle connections",
            "5,000 idle connections from one address: others served; probes unaffected",
            f"{p.attack.get('opened', 0):,} opened, the gateway held {held:,} tenant "
            f"connections at most (per address: {DEFAULTS.max_connections_per_client:,}); "
            f"{text}; {probes} probe(s) failed",
            ok and probes == 0,
        )
    if "zero-window streams" in phases:
        p = phases["zero-window streams"]
        streams = p.attack.get("streams", 0)
        closed = p.attack.get("closed_at", {})
        delays = [closed[name] - at for name, at in p.cuts.items() if name in closed]
        slowest = max(delays, default=math.inf)
        text, ok = served("zero-window streams")
        row(
            "zero-window streams",
            f"100 zero-window streams from one tenant: sockets closed within the stall "
            f"timeout ({CLIENTS['writeTimeout']:g} s) + 5 s; others unaffected",
            f"{len(p.cuts)} of {streams} cut, {len(closed)} sockets closed, each at most "
            f"{slowest:.2f} s after its cut (the cut comes {CLIENTS['writeTimeout']:g} s after "
            f"the stall); {text}",
            ok and len(closed) == streams and len(delays) == len(p.cuts) and slowest <= 5.0,
        )
    if "half-sent bodies" in phases:
        p = phases["half-sent bodies"]
        budget = DEFAULTS.max_tenant_bytes_in_flight / 2**20
        text, ok = served("half-sent bodies")
        row(
            "half-sent bodies",
            f"250 half-sent 4 MB bodies under one key: RSS growth ≤ the body budget "
            f"({budget:g} MiB); others unaffected",
            f"RSS +{p.rss_growth_mb} MB; {text}; outcomes {p.attack.get('outcomes')}",
            ok and p.rss_growth_mb <= budget,
        )
    if "array bombs" in phases:
        p = phases["array bombs"]
        ratio = p.victim["p99_s"] / base["p99_s"] if base["p99_s"] else math.inf
        row(
            "array bombs",
            "8 concurrent 4 MB array bombs: no worker ejected; others' p99 within 2×",
            f"{len(p.ejected)} ejected; victim p99 {p.victim['p99_s']:.3f} s = {ratio:.2f}× "
            f"baseline ({base['p99_s']:.3f} s); outcomes {p.attack.get('outcomes')}",
            not p.ejected and ratio <= 2.0 and p.victim["failed"] == 0,
        )
    if "huge answers" in phases:
        p = phases["huge answers"]
        cap = DEFAULTS.max_answer_bytes / 2**20
        errors = p.attack.get("errors", {})
        named = any("clients.maxAnswerBytes" in error for error in errors)
        row(
            "huge answers",
            f"an embeddings answer over the cap ({cap:g} MiB): 4xx/502 naming the cap; RSS "
            "growth ≤ the cap",
            f"answers {p.attack.get('outcomes')}, errors {errors}; RSS +{p.rss_growth_mb} MB",
            named and p.rss_growth_mb <= cap,
        )
    if "forged shared state" in phases:
        p = phases["forged shared state"]
        text, ok = served("forged shared state")
        ratio = p.victim["p50_s"] / base["p50_s"] if base["p50_s"] else math.inf
        row(
            "forged shared state",
            "a forged report, 1e300 and NaN in the shared server: ignored with a warning; no "
            "tenant affected",
            f"{p.attack.get('entries_written', 0)} entries written; {p.forged_warnings} "
            f"warning line(s); {text}; victim p50 {ratio:.2f}× baseline",
            ok and p.forged_warnings > 0 and ratio <= 1.5,
        )
    if "retry storm" in phases:
        p = phases["retry storm"]
        ratio = p.victim["p50_s"] / base["p50_s"] if base["p50_s"] else math.inf
        row(
            "retry storm",
            "a retry storm of 429s with no back-off: others' p50 within 1.5× baseline",
            f"{p.attack.get('per_second')} attempts/s; victim p50 {p.victim['p50_s']:.3f} s = "
            f"{ratio:.2f}× baseline ({base['p50_s']:.3f} s)",
            ratio <= 1.5 and p.victim["failed"] == 0,
        )
    return rows


def report(settings: Settings, phases: dict[str, Phase], rows: list[dict[str, Any]]) -> str:
    lines = [
        f"Each phase {settings.seconds:g} s; the victim keeps {settings.streams} streamed "
        f"completions of {VICTIM_TOKENS} tokens in flight and probes the admin port every "
        f"{PROBE_INTERVAL:g} s; the gateway (pinned to core {settings.gateway_cores}) runs "
        f"its default client bounds but `writeTimeout` {CLIENTS['writeTimeout']:g} s.",
        "",
        "| attack | goal | measured | met |",
        "|---|---|---|:-:|",
    ]
    lines += [
        f"| {r['attack']} | {r['goal']} | {r['measured']} | {'yes' if r['met'] else '**no**'} |"
        for r in rows
    ]
    lines += [
        "",
        "| phase | victim served | failed | p50 (s) | p99 (s) | probes failed | RSS before → "
        "peak (MB) | workers ejected |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, p in phases.items():
        v = p.victim
        lines.append(
            f"| {name} | {v['served']} | {v['failed']} | {v['p50_s']:.3f} | {v['p99_s']:.3f} | "
            f"{v['probes_failed']} | {p.rss_before_mb:.0f} → {p.rss_peak_mb:.0f} | "
            f"{len(p.ejected)} |"
        )
    met = sum(1 for r in rows if r["met"])
    lines += ["", f"{met} of {len(rows)} goals met."]
    missed = [r["attack"] for r in rows if not r["met"]]
    if missed:
        lines.append("Missed: " + ", ".join(missed) + " (measured above).")
    lines += notes(phases)
    return "\n".join(lines)


def notes(phases: dict[str, Phase]) -> list[str]:
    """What else the table shows: phases where the victim was slower than 1.5 × its
    baseline, and workers that left rotation, with the reasons the gateway logged."""
    base = phases["baseline"].victim
    found = []
    for name, p in phases.items():
        if name == "baseline":
            continue
        if base["p50_s"] and p.victim["p50_s"] > 1.5 * base["p50_s"]:
            sent = p.attack_requests()
            beside = (
                f"with the attack's own requests ({sent}) on the same engines"
                if sent
                else "the attack sending the engines nothing (the gateway's own work)"
            )
            found.append(
                f"- During {name} the victim's p50 was {p.victim['p50_s'] / base['p50_s']:.1f}× "
                f"its baseline, {beside}."
            )
        if p.ejected:
            reasons = Counter(p.ejected)
            said = "; ".join(f"{count} × {reason}" for reason, count in reasons.items())
            found.append(
                f"- During {name} {len(p.ejected)} worker(s) left rotation: {said} (the "
                f"gateway's RSS rose {p.rss_growth_mb:+.1f} MB in that phase)."
            )
    return ["", "Notes:", *found] if found else []


def plot(phases: dict[str, Phase], path: Path) -> Path:
    from fairpool.sim.plots import pyplot, save

    plt = pyplot()
    names = list(phases)
    figure, (latency, memory) = plt.subplots(2, 1, figsize=(10, 6.5))
    p50 = [phases[n].victim["p50_s"] for n in names]
    p99 = [phases[n].victim["p99_s"] for n in names]
    places = range(len(names))
    latency.bar([x - 0.2 for x in places], p50, width=0.4, label="p50")
    latency.bar([x + 0.2 for x in places], p99, width=0.4, label="p99")
    latency.set_xticks(list(places), names, rotation=20, fontsize=8)
    latency.set_ylabel("victim latency (s)")
    latency.legend(fontsize=8)
    for name in names:
        points = phases[name].rss
        memory.plot([t for t, _ in points], [r for _, r in points], label=name, lw=0.9)
    memory.set_xlabel("seconds into the phase")
    memory.set_ylabel("gateway RSS (MB)")
    memory.set_ylim(bottom=0)
    memory.legend(fontsize=7, ncol=2)
    latency.set_title("the victim tenant and the gateway's memory, attack by attack", fontsize=10)
    figure.tight_layout()
    return save(figure, path)


# ---------------------------------------------------------------------- main


@dataclass
class Settings:
    seconds: float = 30.0
    streams: int = 4
    quick: bool = False
    attacks: list[str] = field(default_factory=lambda: list(ATTACKS))
    gateway_cores: str = "0"
    other_cores: str | None = None


def parse(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds per phase (30)")
    parser.add_argument("--victim-streams", type=int, default=4, help="victim's in flight (4)")
    parser.add_argument(
        "--attacks", default=",".join(ATTACKS), help="comma-separated, of: " + ", ".join(ATTACKS)
    )
    parser.add_argument("--quick", action="store_true", help="4 s phases at a tenth of the size")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.attacks.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in ATTACKS]
    if unknown:
        parser.error(f"--attacks: unknown {unknown}; known: {', '.join(ATTACKS)}")
    cores = os.cpu_count() or 1
    return Settings(
        seconds=4.0 if args.quick else args.seconds,
        streams=args.victim_streams,
        quick=args.quick,
        attacks=chosen,
        gateway_cores="0",
        other_cores=None if cores < 2 else ",".join(str(c) for c in range(1, cores)),
    )


async def run(system: System, settings: Settings) -> dict[str, Phase]:
    scale = 0.1 if settings.quick else 1.0
    phases = {}
    for name in ["baseline", *settings.attacks]:
        phases[name] = await phase(
            name, system, settings.seconds, scale, settings.streams, settings.other_cores
        )
    return phases


def main(argv: list[str] | None = None) -> None:
    settings = parse(argv)
    logs = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    if settings.other_cores is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {int(c) for c in settings.other_cores.split(",")})
    engines: list[Process] = []
    gateway: Process | None = None
    try:
        with LocalStore() as store:
            options = EngineOptions(
                speedup=20.0, max_model_len=MAX_MODEL_LEN, embedding_dim=EMBEDDING_DIM
            )
            engines = start_engines(2, options, settings.other_cores, logs)
            system = start_gateway([e.url for e in engines], store, logs, settings.gateway_cores)
            gateway = system.gateway
            phases = asyncio.run(run(system, settings))
            alive = gateway.alive()
    except StartError as error:
        raise SystemExit(f"hostile: {error}") from None
    finally:
        if gateway is not None:
            gateway.stop()
        for engine in engines:
            engine.stop()
    if not alive:
        raise SystemExit(f"hostile: the gateway exited; its log: {logs / 'gateway.log'}")
    if settings.quick:
        if phases["baseline"].victim["served"] == 0:
            raise SystemExit("hostile: the victim was never served")
        return
    rows = verdicts(phases)
    results = {
        "settings": {
            "seconds": settings.seconds,
            "victim_streams": settings.streams,
            "victim_tokens": VICTIM_TOKENS,
            "gateway_clients": {**DEFAULTS.model_dump(by_alias=True), **CLIENTS},
            "tenants": TENANTS,
        },
        "goals": rows,
        "phases": {
            name: {
                "victim": p.victim,
                "attack": p.attack,
                "rss_before_mb": p.rss_before_mb,
                "rss_peak_mb": p.rss_peak_mb,
                "rss_after_mb": p.rss_after_mb,
                "rss_growth_mb": p.rss_growth_mb,
                "workers_ejected": p.ejected,
                "victim_vs_baseline_p50": round(
                    p.victim["p50_s"] / phases["baseline"].victim["p50_s"], 3
                )
                if phases["baseline"].victim["p50_s"]
                else None,
                "forged_warnings": p.forged_warnings,
                "tenant_connections_at_most": max((n for _, n in p.connections), default=0),
                "cuts": p.cuts,
            }
            for name, p in phases.items()
        },
    }
    path = write_results("hostile", results, report(settings, phases, rows))
    plot(phases, RESULTS / "hostile.png")
    say(f"wrote {path}, hostile.md and hostile.png")


if __name__ == "__main__":
    main()
