"""A soak of the gateway: good and hostile traffic at once for `--duration` seconds (600),
with the gateway's RSS and its slot counts sampled every second.

Everything runs on this machine: a Valkey server (the shared state, which the gateway
uses as its replicas would), two `fairpool engine-sim` workers (`python -m fairpool_cli
engine-sim`, `--speedup 10`, 4,096-dimension embeddings) and the gateway (`python -m
fairpool_cli gateway --config FILE`), each a process of its own; this process sends the
traffic and samples.

- **Good tenants** (`alpha`, weight 1; `beta`, weight 2), with the load generator's parts
  (`fairpool_cli.load`: `Sender`, `open_loop` at seeded Poisson times, `closed_loop`):
  `alpha` at `--good-rate` requests/s (10), `beta` keeping 4 requests in flight, each a
  streamed chat completion, completion or response, or an embedding, in turn, with up to
  64 output tokens. Their outcomes are counted by status (`200`, `limited` for 429,
  `connection`, `stream`, ...: `fairpool_cli.load.request`).
- **Hostile clients**, a few of each kind running side by side, each kind as a tenant of
  its own (`mallory-<kind>`: 8 concurrent, 6,000 requests and 2 million tokens a minute;
  so that one kind's refusal storm, which the gateway damps per tenant, does not hide
  another's) or with no key, from a loopback address of their own (127.0.0.2): malformed
  bodies (not JSON, wrong types, not UTF-8, lone surrogates in the prompt, `n` and
  `prompt_logprobs` as strings, floats or negatives, `max_tokens` of 10^9, 400 KB of
  `tools`); oversized bodies (announced past `maxRequestBytes`, huge arrays) and deeply
  nested JSON; 4 MB bodies of empty lists and of short strings; slowloris headers (a byte
  every half second, never ending); bodies that never complete; half-sent 4 MB bodies, 20
  at once; streams never read; clients that disconnect mid-stream; bursts over the
  tenant's concurrency limit (16 streams at once, all with the same `x-request-id`);
  idle connections by the thousand; embeddings requests whose answers exceed
  `maxAnswerBytes`; a tenant allowed one request a minute retrying its 429s with no
  back-off; and entries forged into the shared state (a report of a replica that is not
  live, charges of 1e300 and NaN, a token bucket that is not a number). Each attempt's
  outcome is counted by kind: the status answered, `closed`/`reset` (the gateway ended
  the connection without an answer: its deadlines, its budgets), `cut` (a stream the
  gateway ended early: its write deadline), `left` (the client hung up first, on
  purpose), `read late` (a stream read only after a stall of three write deadlines, and
  whole).
- **Samples**, every second, during the load and while it drains afterwards: the
  gateway's resident memory (VmRSS from /proc/PID/status) and open file descriptors,
  and from its admin API the fair queue's length, each worker's outstanding requests, the
  tenants' concurrency slots and in-flight requests, and the characters its routing tree
  holds (bounded by `maxTreeBytes`, 64 MiB by default, half of it for text: each good
  request's prompt is new text, so the tree fills up to its bound, then forgets).

The gateway's client deadlines are short (`headerTimeout` 2 s, `bodyTimeout` 5 s,
`writeTimeout` 5 s) and its answer cap 1 MiB (`maxAnswerBytes`) so that hostile
connections reach them often; its other bounds are the defaults. The soak fails if a good
request got a 5xx or lost its connection. Inputs that show the
known findings of the fuzz tier (tests/test_gateway_fuzz_findings.py: a lone surrogate in
`model`, a token id past 64 bits) are not sent.

Results: bench/results/soak.json (every sample and count), soak.md (the machine, the
command, a table and what the numbers say), soak.png (RSS and slots over time).

Run: `python bench/bench_soak.py` (10 minutes; it loads the machine); `--quick` for a
15-second run that records nothing and fails if no good request succeeded or a slot is
still held at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import RESULTS, write_results
from routers import (
    HOST,
    EngineOptions,
    Process,
    StartError,
    free_port,
    spawn,
    start_engines,
    wait_until,
)

from fairpool.api.gateway_config import GatewayConfig, key_digest
from fairpool_cli.load import (
    OutgoingRequest,
    RequestResult,
    Sender,
    closed_loop,
    now,
    open_loop,
    poisson,
)
from fairpool_cli.local.store import LocalStore

MODEL = "sim"
MAX_MODEL_LEN = 4096
MAX_REQUEST_BYTES = 4 << 20
GOOD = {"alpha": 1.0, "beta": 2.0}
HOSTILE = "mallory"
#: each hostile kind's tenant's limits: room for its requests to reach the engines, and a
#: concurrency its bursts (`BURST` streams at once) go past
HOSTILE_LIMITS = {
    "concurrent": 8,
    "requestsPerMinute": 6000,
    "tokensPerMinute": 2_000_000,
    "queued": 8,
}
STORM = "storm"
STORM_LIMITS = {"requestsPerMinute": 1}
BURST = 16
CLIENTS = {
    "headerTimeout": 2.0,
    "bodyTimeout": 5.0,
    "writeTimeout": 5.0,
    "maxAnswerBytes": 1 << 20,
}
#: The hostile kinds' addresses: each its own, 127.0.0.2 and on (a kind that holds its
#: address's connections, as idle connections do, must not hold another kind's).
FIRST_ATTACKER = 2
EMBEDDING_DIM = 4096
IDLE_CONNECTIONS = 2000
APIS = ("chat", "completions", "responses", "embeddings")
VOCABULARY = (
    "harbour tide crane vessel cargo berth pilot anchor quay ledger manifest customs "
    "freight draught buoy channel dock ferry hull keel lock mooring port rudder"
)
WORDS = VOCABULARY.split()
#: hostile kinds: how many clients of each run side by side, and the pause (seconds)
#: each takes between two attempts
HOSTILE_KINDS = {
    "malformed": (2, 0.2),
    "oversized": (1, 0.5),
    "deep nesting": (1, 0.5),
    "array and string bombs": (2, 0.2),
    "slowloris": (4, 0.0),
    "body never completes": (2, 0.0),
    "half-sent bodies": (20, 0.0),
    "stream never read": (4, 0.0),
    "disconnect mid-stream": (2, 0.2),
    "over the limits": (1, 1.0),
    "idle connections": (1, 0.0),
    "huge answers": (1, 1.0),
    "retry storm": (4, 0.0),
    "forged shared state": (1, 0.5),
}
DRAIN_LIMIT = 60.0  # seconds the sampler waits, after the load, for the slots to empty
ATTEMPT_LIMIT = 60.0  # seconds a hostile attempt may take before it counts as `hung`


def key(tenant: str) -> str:
    return f"fairpool-soak-{tenant}"


def say(message: str) -> None:
    print(f"[soak] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- processes


def attacker(kind: str) -> str:
    """The loopback address a hostile kind sends from."""
    index = list(HOSTILE_KINDS).index(kind) if kind in HOSTILE_KINDS else 0
    return f"127.0.0.{FIRST_ATTACKER + index}"


def hostile_tenant(kind: str) -> str:
    """The tenant a hostile kind sends as (its refusals are damped on their own)."""
    return f"{HOSTILE}-{kind.replace(' ', '-')}"


def gateway_document(port: int, admin_port: int, workers: list[str], store: str) -> dict[str, Any]:
    tenants = [
        {"tenant": name, "weight": weight, "apiKeySha256": [key_digest(key(name))]}
        for name, weight in GOOD.items()
    ]
    tenants += [
        {
            "tenant": hostile_tenant(kind),
            "weight": 1.0,
            "apiKeySha256": [key_digest(key(hostile_tenant(kind)))],
            "limits": HOSTILE_LIMITS,
        }
        for kind in HOSTILE_KINDS
    ]
    tenants.append(
        {"tenant": STORM, "apiKeySha256": [key_digest(key(STORM))], "limits": STORM_LIMITS}
    )
    document = {
        "listen": {"host": HOST, "port": port},
        "admin": {"host": HOST, "port": admin_port},
        "clients": CLIENTS,
        "sharedState": {"url": store, "replicas": 1, "timeoutSeconds": 2.0},
        "maxRequestBytes": MAX_REQUEST_BYTES,
        "pools": [
            {
                "name": "soak",
                "model": MODEL,
                "maxModelLen": MAX_MODEL_LEN,
                "workers": {"urls": workers},
                "routing": {"saturation": {"maxOutstanding": 16}, "queueTimeoutSeconds": 30},
            }
        ],
        "tenants": tenants,
    }
    config = GatewayConfig.model_validate(document)  # refused here, not in the gateway
    dumped: dict[str, Any] = json.loads(config.model_dump_json(by_alias=True, exclude_none=True))
    return dumped


@dataclass
class Gateway:
    process: Process
    url: str
    admin_url: str
    store_port: int
    config: dict[str, Any]


def start_gateway(workers: list[str], store: LocalStore, logs: Path) -> Gateway:
    port, admin_port = free_port(), free_port()
    config = gateway_document(port, admin_port, workers, store.url)
    path = logs / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    command = [sys.executable, "-m", "fairpool_cli", "gateway", "--config", str(path)]
    process = spawn("gateway", command, None, logs)
    gateway = Gateway(
        process, f"http://{HOST}:{port}", f"http://{HOST}:{admin_port}", store.port, config
    )

    def serving() -> bool:
        body = {"model": MODEL, "prompt": "Ready?", "max_tokens": 1}
        headers = {"Authorization": f"Bearer {key('alpha')}"}
        answer = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=headers)
        return answer.status_code == 200

    try:
        wait_until(serving, process, 60, "the gateway")
    except BaseException:
        process.stop()
        raise
    return gateway


# ---------------------------------------------------------------------- good traffic


def good_request(tenant: str, number: int, draw: random.Random) -> OutgoingRequest:
    api = APIS[number % len(APIS)]
    text = " ".join(draw.choice(WORDS) for _ in range(draw.randint(8, 120)))
    prompt = f"You answer questions about the harbour ledger. Question {number}: {text}?"
    body: dict[str, Any] = {"model": MODEL}
    output = draw.randint(1, 64)
    if api == "chat":
        body |= {"messages": [{"role": "user", "content": prompt}], "max_tokens": output}
    elif api == "completions":
        body |= {"prompt": prompt, "max_tokens": output}
    elif api == "responses":
        body |= {"input": prompt, "max_output_tokens": output}
    else:
        body |= {"input": prompt}
    if api != "embeddings":
        body["stream"] = True
    if api in ("chat", "completions"):
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {key(tenant)}"}
    return OutgoingRequest(tenant, api, json.dumps(body).encode(), headers)


def outcome(result: RequestResult) -> str:
    return "200" if result.ok else (result.error or f"{result.status}")


#: failed good requests whose details the results keep (the first ones)
FAILURES_KEPT = 20


async def good_traffic(
    gateway: Gateway,
    rate: float,
    concurrency: int,
    more: Callable[[], bool],
    seed: int,
    failures: list[str],
) -> Counter[str]:
    """`alpha` open loop at `rate`, `beta` closed loop at `concurrency`, while `more()`;
    the outcomes by tenant, and the first failures' details in `failures`."""
    counts: Counter[str] = Counter()

    def count(result: RequestResult) -> None:
        counts[f"{result.tenant} {outcome(result)}"] += 1
        if not result.ok and len(failures) < FAILURES_KEPT:
            failures.append(f"{result.tenant} {outcome(result)}: {result.detail}")

    draw = random.Random(seed)
    numbers = itertools.count()

    async with Sender(f"{gateway.url}/v1", timeout=120, parse_events=False) as sender:

        async def alpha(number: int, due: float) -> None:
            count(await sender.send(good_request("alpha", number, draw), due))

        async def beta(_: int) -> None:
            count(await sender.send(good_request("beta", next(numbers), draw)))

        start = now()
        await asyncio.gather(
            open_loop(alpha, poisson(rate, seed, start), more),
            closed_loop(beta, concurrency, more, stagger=1.0),
        )
    return counts


# ---------------------------------------------------------------------- hostile traffic


class Raw:
    """One raw connection to the gateway, for what no well-behaved client sends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.received = bytearray()

    @classmethod
    async def open(cls, url: str, receive_buffer: int | None = None, kind: str = "") -> Raw:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.bind((attacker(kind), 0))
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        except BaseException:
            sock.close()
            raise
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        return cls(reader, writer)

    async def send(self, data: bytes) -> bool:
        """False if the gateway has closed the connection."""
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError):
            return False
        return True

    async def read_some(self, limit: int = 65536) -> bytes:
        try:
            chunk = await self.reader.read(limit)
        except (ConnectionError, OSError):
            chunk = b""
        self.received += chunk
        return chunk

    def whole(self) -> str | None:
        """The answer's status once it has arrived whole (its length, or a chunked
        body's last chunk), else None."""
        head, found, body = bytes(self.received).partition(b"\r\n\r\n")
        if not found:
            return None
        status = head.split(b" ", 2)[1].decode()
        lowered = head.lower()
        if b"content-length:" in lowered:
            length = int(lowered.split(b"content-length:")[1].split(b"\r\n")[0])
            return status if len(body) >= length else None
        return status if body.endswith(b"0\r\n\r\n") else None

    async def answer(self) -> str:
        """Read until the answer is whole (or the connection closes): its status,
        `closed` if the gateway closed (or reset) without one, `cut` if a stream ended
        early."""
        while (status := self.whole()) is None:
            if not await self.read_some():
                head, found, _ = bytes(self.received).partition(b"\r\n\r\n")
                if not found:
                    return "closed"
                return "cut" if b"transfer-encoding: chunked" in head.lower() else "cut short"
        return status

    def close(self, abrupt: bool = False) -> None:
        sock = self.writer.get_extra_info("socket")
        if abrupt and sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        self.writer.close()


def post(
    path: str, body: bytes, tenant: str | None, length: int | None = None, extra: str = ""
) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
    if tenant is not None:
        head += f"Authorization: Bearer {key(tenant)}\r\n"
    head += extra
    head += f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    return head.encode() + body


def stream_body(api: str, tokens: int) -> bytes:
    limit = "max_output_tokens" if api == "responses" else "max_tokens"
    body: dict[str, Any] = {"model": MODEL, limit: tokens, "stream": True}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "Tell me the whole ledger."}]
    elif api == "completions":
        body["prompt"] = "Tell me the whole ledger."
    else:
        body["input"] = "Tell me the whole ledger."
    return json.dumps(body).encode()


PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
}


def malformed_body(draw: random.Random) -> tuple[str, bytes]:
    path = draw.choice([*PATHS.values(), "/v1/embeddings"])
    bodies = [
        b'{"model": "sim", "prompt": ',  # not JSON
        b"[1, 2, 3]",  # not an object
        b'{"model": 5, "prompt": "x"}',
        b'{"model": "sim", "messages": "hello"}',
        b'{"model": "sim", "prompt": "x", "max_tokens": "many"}',
        b'{"model": "sim", "prompt": "x", "stream": {"yes": 1}}',
        b'{"model": "sim", "prompt": "x", "vllm_xargs": [1, 2]}',
        b'{"model": "sim", "prompt": "x", "n": 1000}',
        b'{"model": "sim", "prompt": "x\\ud800y", "max_tokens": 2}',  # a lone surrogate
        b'{"model": "sim", "prompt": "x\xff\xfey", "max_tokens": 2}',  # not UTF-8
        b'{"model": "sim", "input": [{"role": 7}]}',
        b'{"model": "nowhere", "prompt": "x"}',
        # types the engine coerces, and what they would buy: capped as the engine reads them
        b'{"model": "sim", "prompt": "x", "n": "100"}',
        b'{"model": "sim", "prompt": "x", "n": 9.0}',
        b'{"model": "sim", "prompt": "x", "prompt_logprobs": -1}',
        b'{"model": "sim", "prompt": "x", "max_tokens": 1000000000}',
        # input outside the text: counted against tokens per minute
        b'{"model": "sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, '
        b'"tools": [{"type": "function", "function": {"name": "f", "description": "'
        + b"d" * 400_000
        + b'"}}]}',
    ]
    return path, draw.choice(bodies)


async def attempt(kind: str, gateway: Gateway, draw: random.Random) -> str:
    """One hostile attempt of `kind`; its outcome."""
    url = gateway.url
    me = hostile_tenant(kind)
    if kind == "malformed":
        path, body = malformed_body(draw)
        raw = await Raw.open(url, kind=kind)
        try:
            tenant = draw.choice([me, me, None])  # a third without a key
            await raw.send(post(path, body, tenant))
            return await raw.answer()
        finally:
            raw.close()
    if kind == "oversized":
        raw = await Raw.open(url, kind=kind)
        try:
            if draw.random() < 0.5:  # announced past maxRequestBytes: refused on its headers
                head = post("/v1/completions", b"", me, length=MAX_REQUEST_BYTES * 2)
                await raw.send(head + b'{"model": "sim", "prompt": "' + b"x" * 65536)
            else:  # a huge array: past maxJsonObjects
                items = b",".join([b'{"role":"user","content":""}'] * 30_000)
                body = b'{"model": "sim", "messages": [' + items + b"]}"
                await raw.send(post("/v1/chat/completions", body, me))
            return await raw.answer()
        finally:
            raw.close()
    if kind == "deep nesting":
        depth = draw.choice([65, 1000, 50_000])
        body = b'{"model": "sim", "prompt": "x", "x": ' + b"[" * depth + b"]" * depth + b"}"
        raw = await Raw.open(url, kind=kind)
        try:
            await raw.send(post("/v1/completions", body, me))
            return await raw.answer()
        finally:
            raw.close()
    if kind == "array and string bombs":
        raw = await Raw.open(url, kind=kind)
        try:
            await raw.send(post("/v1/completions", draw.choice(BOMBS), me))
            return await raw.answer()
        finally:
            raw.close()
    if kind == "slowloris":
        raw = await Raw.open(url, kind=kind)
        try:
            head = post("/v1/chat/completions", b"", me)[:-4] + b"\r\nX-Slow: " + b"z" * 1000
            for byte in range(len(head)):
                if not await raw.send(head[byte : byte + 1]):
                    break
                await asyncio.sleep(0.5)
            return await raw.answer()
        finally:
            raw.close()
    if kind == "body never completes":
        raw = await Raw.open(url, kind=kind)
        try:
            await raw.send(post("/v1/completions", b'{"model": "sim", ', me, length=1000))
            return await raw.answer()
        finally:
            raw.close()
    if kind == "half-sent bodies":
        raw = await Raw.open(url, kind=kind)
        try:
            half = b'{"model": "sim", "prompt": "' + b"x" * (1 << 20)
            await raw.send(post("/v1/completions", half, me, length=MAX_REQUEST_BYTES))
            return await raw.answer()
        finally:
            raw.close()
    if kind == "stream never read":
        raw = await Raw.open(url, receive_buffer=4096, kind=kind)
        try:
            api = draw.choice(list(PATHS))
            await raw.send(post(PATHS[api], stream_body(api, 3000), me))
            await raw.read_some(1024)  # the answer started: then nothing is read for a while
            await asyncio.sleep(3 * CLIENTS["writeTimeout"])
            answered = await raw.answer()  # what is left: the whole answer, or a cut stream
            return answered if answered == "cut" else f"{answered} read late"
        finally:
            raw.close()
    if kind == "disconnect mid-stream":
        raw = await Raw.open(url, kind=kind)
        try:
            api = draw.choice(list(PATHS))
            await raw.send(post(PATHS[api], stream_body(api, draw.randint(50, 2000)), me))
            wanted = draw.randint(1, 40_000)
            while len(raw.received) < wanted:
                if (status := raw.whole()) is not None:  # the whole answer came first
                    return status
                if not await raw.read_some():
                    return "cut"
            return "left"
        finally:
            raw.close(abrupt=draw.random() < 0.5)
    if kind == "over the limits":  # all with one x-request-id: ids are the gateway's own
        api = draw.choice(list(PATHS))
        burst = [asyncio.ensure_future(one_stream(url, api, me, kind)) for _ in range(BURST)]
        outcomes = await asyncio.gather(*burst)
        return ",".join(sorted(set(outcomes)))
    if kind == "idle connections":
        return await idle_connections(url, kind)
    if kind == "huge answers":  # 64 inputs at 4,096 dimensions: some 4 MB, over the cap
        raw = await Raw.open(url, kind=kind)
        try:
            body = json.dumps({"model": MODEL, "input": ["ledger"] * 64}).encode()
            await raw.send(post("/v1/embeddings", body, me))
            return await raw.answer()
        finally:
            raw.close()
    if kind == "retry storm":
        raw = await Raw.open(url, kind=kind)
        try:
            await raw.send(post("/v1/completions", stream_body("completions", 1), STORM))
            return await raw.answer()
        finally:
            raw.close()
    if kind == "forged shared state":
        workers = gateway.config["pools"][0]["workers"]["urls"]
        await asyncio.to_thread(forge, gateway.store_port, workers)
        return "written"
    raise ValueError(kind)


BOMBS = (
    b'{"model": "sim", "prompt": [' + b",".join([b"[]"] * 1_398_000) + b"]}",
    b'{"model": "sim", "input": [' + b",".join([b'"ab"'] * 838_000) + b"]}",
)


async def idle_connections(url: str, kind: str) -> str:
    """`IDLE_CONNECTIONS` connections that send nothing, held for two seconds: how many
    the gateway kept (its per-address budget) and how many it reset."""
    held = []
    for _ in range(IDLE_CONNECTIONS):
        try:
            held.append(await Raw.open(url, kind=kind))
        except OSError:  # reset before it was established: over the budget at once
            continue
    await asyncio.sleep(2.0)
    kept = 0
    for raw in held:
        kept += not raw.reader.at_eof() and not raw.writer.is_closing()  # not reset
        raw.close()
    return f"kept {kept}, reset {IDLE_CONNECTIONS - kept}"


def forge(port: int, workers: list[str]) -> None:
    """Entries no replica wrote: a report of a replica that is not live (every worker
    full), one with an expiry far in the future, charges of 1e300 and NaN, and a token
    bucket that is not a number."""
    server = redis.Redis(host=HOST, port=port)
    try:
        tag = "fairpool:pool:{soak}"
        report = json.dumps({"inFlight": dict.fromkeys(workers, 10**6), "queued": {}})
        server.hset(f"{tag}:holdings", "f0f0f0f0f0f0", report)
        server.zadd(f"{tag}:replicas", {"e0e0e0e0e0e0": 1e18})
        server.hset(f"{tag}:holdings", "e0e0e0e0e0e0", report)
        for service in ("1e300", "nan"):
            fields = {"replica": "f0f0f0f0f0f0", "tenant": "alpha", "worker": workers[0]}
            server.xadd(f"{tag}:charges", {**fields, "service": service})
        second = str(int(server.time()[0]))
        server.hset("fairpool:{alpha}:tokens", second, "nan")
    finally:
        server.close()


async def one_stream(url: str, api: str, tenant: str, kind: str) -> str:
    raw = await Raw.open(url, kind=kind)
    try:
        extra = "x-request-id: burst-same\r\n"
        await raw.send(post(PATHS[api], stream_body(api, 64), tenant, extra=extra))
        return await raw.answer()
    finally:
        raw.close()


async def hostile_traffic(
    gateway: Gateway, more: Callable[[], bool], seed: int
) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {kind: Counter() for kind in HOSTILE_KINDS}

    async def client(kind: str, index: int, pause: float) -> None:
        draw = random.Random(f"{seed}-{kind}-{index}")
        while more():
            try:
                async with asyncio.timeout(ATTEMPT_LIMIT):
                    result = await attempt(kind, gateway, draw)
            except TimeoutError:
                result = "hung"
            except OSError as error:
                result = f"error {type(error).__name__}"
            for part in (piece.strip() for piece in result.split(",")):
                if part.startswith(("kept ", "reset ")):  # idle connections: counts
                    name, number = part.split(" ")
                    counts[kind][name] += int(number)
                else:
                    counts[kind][part] += 1
            await asyncio.sleep(pause)

    await asyncio.gather(
        *(
            client(kind, index, pause)
            for kind, (clients, pause) in HOSTILE_KINDS.items()
            for index in range(clients)
        )
    )
    return counts


# ---------------------------------------------------------------------- samples


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


@dataclass
class Sampler:
    gateway: Gateway
    start: float
    samples: list[dict[str, Any]] = field(default_factory=list)

    async def sample(self, http: httpx.AsyncClient, phase: str) -> dict[str, Any]:
        pools = (await http.get(f"{self.gateway.admin_url}/admin/pools")).json()
        tenants = (await http.get(f"{self.gateway.admin_url}/admin/tenants")).json()["tenants"]
        pid = self.gateway.process.pid
        outstanding = {
            url: worker["outstanding"]
            for pool in pools.values()
            for url, worker in pool["workers"].items()
        }
        concurrent = {t["tenant"]: t["usage"]["concurrent"] for t in tenants}
        in_flight = sum(state.get("in_flight", 0) for t in tenants for state in t["state"].values())
        sample = {
            "t": round(time.monotonic() - self.start, 2),
            "phase": phase,
            "rss_mb": round(rss_mb(pid), 2),
            "fds": open_fds(pid),
            "queued": sum(pool["queued"] for pool in pools.values()),
            "outstanding": sum(outstanding.values()),
            "outstanding_per_worker": outstanding,
            "concurrent": sum(concurrent.values()),
            "concurrent_per_tenant": concurrent,
            "in_flight": in_flight,
            "tree_chars": sum(pool["prefixTreeChars"] for pool in pools.values()),
        }
        self.samples.append(sample)
        return sample

    async def run(self, phase: Callable[[], str]) -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            while True:
                due = time.monotonic() + 1.0
                with contextlib.suppress(httpx.HTTPError):
                    await self.sample(http, phase())
                await asyncio.sleep(max(0.0, due - time.monotonic()))

    async def drain(self, limit: float) -> dict[str, Any]:
        """Sample until every slot is free (or `limit` seconds): the last sample."""
        deadline = time.monotonic() + limit
        async with httpx.AsyncClient(timeout=10) as http:
            while True:
                last = await self.sample(http, "drain")
                held = last["queued"] + last["outstanding"] + last["concurrent"]
                if held + last["in_flight"] == 0 or time.monotonic() > deadline:
                    return last
                await asyncio.sleep(1.0)


# ---------------------------------------------------------------------- run


@dataclass
class Settings:
    duration: float = 600.0
    good_rate: float = 10.0
    good_concurrency: int = 4
    workers: int = 2
    speedup: float = 10.0
    seed: int = 0
    quick: bool = False
    keep_logs: bool = False
    logs: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench-soak-")))


async def soak(gateway: Gateway, settings: Settings) -> dict[str, Any]:
    start = time.monotonic()
    end = start + settings.duration
    sampler = Sampler(gateway, start)

    def more() -> bool:
        return time.monotonic() < end

    sampling = asyncio.ensure_future(sampler.run(lambda: "load"))
    say(f"load for {settings.duration:g} s")
    failures: list[str] = []
    good, hostile = await asyncio.gather(
        good_traffic(
            gateway, settings.good_rate, settings.good_concurrency, more, settings.seed, failures
        ),
        hostile_traffic(gateway, more, settings.seed),
    )
    load_seconds = time.monotonic() - start
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    say("load done; draining")
    last = await sampler.drain(DRAIN_LIMIT)
    return {
        "load_seconds": round(load_seconds, 1),
        "good": dict(sorted(good.items())),
        "good_failures": failures,
        "hostile": {kind: dict(sorted(counts.items())) for kind, counts in hostile.items()},
        "samples": sampler.samples,
        "end": last,
    }


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return 0.0
    times = [t for t, _ in points]
    values = [v for _, v in points]
    mean_t, mean_v = statistics.fmean(times), statistics.fmean(values)
    spread = sum((t - mean_t) ** 2 for t in times)
    if spread == 0:
        return 0.0
    return 60 * sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    load = [s for s in run["samples"] if s["phase"] == "load"]
    if not load:
        raise SystemExit("no sample during the load")
    half = load[-1]["t"] / 2
    second_half = [(s["t"], s["rss_mb"]) for s in load if s["t"] >= half]
    peak = max(load, key=lambda s: s["rss_mb"])
    end = run["end"]
    good = Counter[str]()
    for outcome_name, count in run["good"].items():
        good[outcome_name.split(" ", 1)[1]] += count
    hostile_total = sum(sum(counts.values()) for counts in run["hostile"].values())
    tree_top = max(s["tree_chars"] for s in load)
    tree_full = next(s for s in load if s["tree_chars"] >= 0.95 * tree_top)
    return {
        "tree_chars_peak": tree_top,
        "tree_95_percent_at_s": tree_full["t"],
        "rss_at_tree_95_percent_mb": tree_full["rss_mb"],
        "rss_start_mb": load[0]["rss_mb"],
        "rss_peak_mb": peak["rss_mb"],
        "rss_peak_at_s": peak["t"],
        "rss_end_of_load_mb": load[-1]["rss_mb"],
        "rss_after_drain_mb": end["rss_mb"],
        "rss_slope_last_half_mb_per_min": round(slope_per_minute(second_half), 3),
        "fds_start": load[0]["fds"],
        "fds_peak": max(s["fds"] for s in load),
        "fds_after_drain": end["fds"],
        "slots_held_peak": max(s["outstanding"] + s["concurrent"] + s["queued"] for s in load),
        "end": {
            key: end[key]
            for key in ("queued", "outstanding", "concurrent", "in_flight", "tree_chars")
        },
        "drained_after_s": round(end["t"] - load[-1]["t"], 1),
        "good_total": sum(good.values()),
        "good_ok": good.get("200", 0),
        "good_by_outcome": dict(sorted(good.items())),
        "hostile_total": hostile_total,
    }


# ---------------------------------------------------------------------- report


def report(settings: Settings, run: dict[str, Any], summary: dict[str, Any]) -> str:
    end = summary["end"]
    lines = [
        f"{run['load_seconds']:g} s of load: good tenants `alpha` ({settings.good_rate:g} "
        f"requests/s, open loop) and `beta` ({settings.good_concurrency} in flight), "
        f"hostile clients of {len(HOSTILE_KINDS)} kinds side by side; "
        f"{settings.workers} engine-sim workers at `--speedup {settings.speedup:g}`.",
        "",
        "| | start | peak | end of load | after draining |",
        "|---|---:|---:|---:|---:|",
        f"| gateway RSS (MB) | {summary['rss_start_mb']:.1f} | {summary['rss_peak_mb']:.1f} "
        f"(at {summary['rss_peak_at_s']:.0f} s) | {summary['rss_end_of_load_mb']:.1f} | "
        f"{summary['rss_after_drain_mb']:.1f} |",
        f"| routing tree (M characters) | {run['samples'][0]['tree_chars'] / 1e6:.1f} | "
        f"{summary['tree_chars_peak'] / 1e6:.1f} | — | {end['tree_chars'] / 1e6:.1f} |",
        f"| open file descriptors | {summary['fds_start']} | {summary['fds_peak']} | — | "
        f"{summary['fds_after_drain']} |",
        f"| slots held (queued + outstanding + concurrency) | — | "
        f"{summary['slots_held_peak']:g} | — | "
        f"{end['queued'] + end['outstanding'] + end['concurrent']:g} |",
        "",
        "| good requests | count |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {count:,} |" for name, count in run["good"].items()]
    lines += ["", "| hostile kind | outcomes |", "|---|---|"]
    for kind, counts in run["hostile"].items():
        shown = ", ".join(f"{name} {count:,}" for name, count in counts.items())
        lines.append(f"| {kind} | {shown} |")
    good_share = summary["good_ok"] / summary["good_total"] if summary["good_total"] else 0.0
    slope = summary["rss_slope_last_half_mb_per_min"]
    held = end["queued"] + end["outstanding"] + end["concurrent"] + end["in_flight"]
    lines += [
        "",
        "## What the numbers say",
        "",
        f"- The gateway's RSS was {summary['rss_start_mb']:.1f} MB at the first sample, "
        f"peaked at {summary['rss_peak_mb']:.1f} MB at {summary['rss_peak_at_s']:.0f} s and "
        f"was {summary['rss_end_of_load_mb']:.1f} MB when the load stopped "
        f"({summary['rss_end_of_load_mb'] - summary['rss_start_mb']:+.1f} MB over the run).",
        f"- The routing tree held {summary['tree_chars_peak'] / 1e6:.1f} M characters at "
        f"most; it first reached 95 % of that at {summary['tree_95_percent_at_s']:.0f} s, "
        f"when the RSS was {summary['rss_at_tree_95_percent_mb']:.1f} MB; from then to the "
        f"end of the load the RSS changed by "
        f"{summary['rss_end_of_load_mb'] - summary['rss_at_tree_95_percent_mb']:+.1f} MB.",
        f"- Over the last half of the load its RSS changed by {slope:+.3f} MB per minute "
        f"(least squares over {sum(1 for s in run['samples'] if s['phase'] == 'load') // 2} "
        "samples).",
        f"- {summary['drained_after_s']:g} s after the load stopped, the gateway held "
        f"{end['queued']:g} queued requests, {end['outstanding']:g} outstanding on workers, "
        f"{end['concurrent']:g} concurrency slots and {end['in_flight']:g} requests in "
        f"flight" + (": every slot was free." if held == 0 else "."),
        f"- Open file descriptors: {summary['fds_start']} at the start, "
        f"{summary['fds_peak']} at most, {summary['fds_after_drain']} after draining.",
        f"- Good tenants: {summary['good_ok']:,} of {summary['good_total']:,} requests "
        f"answered in full ({good_share:.2%}); hostile attempts: "
        f"{summary['hostile_total']:,}.",
    ]
    return "\n".join(lines)


def plot(run: dict[str, Any], path: Path) -> Path:
    from fairpool.sim.plots import pyplot, save

    plt = pyplot()
    samples = run["samples"]
    times = [s["t"] for s in samples]
    figure, (memory, tree, slots) = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    memory.plot(times, [s["rss_mb"] for s in samples], color="tab:blue", label="RSS")
    memory.set_ylabel("gateway RSS (MB)")
    memory.set_ylim(bottom=0)
    descriptors = memory.twinx()
    descriptors.plot(times, [s["fds"] for s in samples], color="tab:gray", lw=0.8)
    descriptors.set_ylabel("open fds", color="tab:gray")
    descriptors.set_ylim(bottom=0)
    tree.plot(times, [s["tree_chars"] / 1e6 for s in samples], color="tab:green")
    tree.set_ylabel("routing tree (M chars)")
    tree.set_ylim(bottom=0)
    for name, label in (
        ("outstanding", "outstanding on workers"),
        ("concurrent", "tenants' concurrency slots"),
        ("queued", "queued"),
    ):
        slots.plot(times, [s[name] for s in samples], label=label, lw=0.9)
    slots.set_ylabel("slots held")
    slots.set_xlabel("seconds")
    slots.legend(loc="upper right", fontsize=8)
    load_end = max((s["t"] for s in samples if s["phase"] == "load"), default=0.0)
    for axis in (memory, tree, slots):
        axis.axvline(load_end, color="black", lw=0.6, ls="--")
    memory.set_title("gateway under good and hostile traffic (dashed: load stops)", fontsize=10)
    return save(figure, path)


def parse(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (600)")
    parser.add_argument("--good-rate", type=float, default=10.0, help="alpha's requests/s (10)")
    parser.add_argument("--good-concurrency", type=int, default=4, help="beta's in flight (4)")
    parser.add_argument("--workers", type=int, default=2, help="engine-sim workers (2)")
    parser.add_argument("--speedup", type=float, default=10.0, help="engine-sim speedup (10)")
    parser.add_argument("--seed", type=int, default=0, help="seeds every draw (0)")
    parser.add_argument("--quick", action="store_true", help="15 s, records nothing")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    args = parser.parse_args(argv)
    settings = Settings(
        duration=15.0 if args.quick else args.duration,
        good_rate=args.good_rate,
        good_concurrency=args.good_concurrency,
        workers=args.workers,
        speedup=args.speedup,
        seed=args.seed,
        quick=args.quick,
        keep_logs=args.keep_logs,
    )
    return settings


def main(argv: list[str] | None = None) -> None:
    settings = parse(argv)
    engines: list[Process] = []
    gateway: Gateway | None = None
    try:
        with LocalStore() as store:
            options = EngineOptions(
                speedup=settings.speedup, max_model_len=MAX_MODEL_LEN, embedding_dim=EMBEDDING_DIM
            )
            engines = start_engines(settings.workers, options, None, settings.logs)
            gateway = start_gateway([engine.url for engine in engines], store, settings.logs)
            run = asyncio.run(soak(gateway, settings))
            alive = gateway.process.alive()
    except StartError as error:
        raise SystemExit(f"soak: {error}") from None
    finally:
        if gateway is not None:
            gateway.process.stop()
        for engine in engines:
            engine.stop()
    summary = summarize(run)
    say(json.dumps(summary))
    say(json.dumps(run["hostile"]))
    end = summary["end"]
    held = end["queued"] + end["outstanding"] + end["concurrent"] + end["in_flight"]
    problems = []
    if not alive:
        problems.append("the gateway exited during the soak")
    broken = {
        outcome: count
        for outcome, count in summary["good_by_outcome"].items()
        if outcome != "200" and (outcome.startswith("5") or not outcome[:1].isdigit())
    }
    if broken:
        problems.append(f"good requests got a 5xx or lost their connection: {broken}")
    if summary["good_ok"] == 0:
        problems.append("no good request was answered in full")
    if held:
        problems.append(f"slots still held after draining: {end}")
    if settings.quick:
        if problems:
            raise SystemExit("soak: " + "; ".join(problems))
        return
    results = {
        "settings": {
            "duration_s": settings.duration,
            "good_rate": settings.good_rate,
            "good_concurrency": settings.good_concurrency,
            "workers": settings.workers,
            "speedup": settings.speedup,
            "seed": settings.seed,
            "hostile_kinds": {
                kind: {"clients": clients, "pause_s": pause}
                for kind, (clients, pause) in HOSTILE_KINDS.items()
            },
            "gateway_clients": CLIENTS,
            "hostile_limits": HOSTILE_LIMITS,
        },
        "summary": summary,
        "good": run["good"],
        "good_failures": run["good_failures"],
        "hostile": run["hostile"],
        "problems": problems,
        "samples": run["samples"],
    }
    path = write_results("soak", results, report(settings, run, summary))
    plot(run, RESULTS / "soak.png")
    say(f"wrote {path}, soak.md and soak.png")
    if problems:
        raise SystemExit("soak: " + "; ".join(problems))


if __name__ == "__main__":
    main()
