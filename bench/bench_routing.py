"""Routing micro-benchmark: decision latency and locality of each router.

A pool of 64 workers serves 16 tenants. Each tenant has two shared system prompts and
holds multi-turn conversations: a request is the system prompt, the turns so far (user
messages and the answers) and a new user message, 1-8k characters. A conversation's next
turn is only sent once its previous one completed. Tenants' rates are skewed (rank^-0.8).
About 256 requests are in flight: once over, a random in-flight request completes. The
request stream depends only on the seed, not on the router, so every router sees the same
one; it runs twice, with text keys (the gateway) and with token-id keys (the simulator;
one token per word).

After a warm-up of 20k requests (trees populated, LRU at its bound), each measured
decision is timed as route() plus the complete() it triggers. Reported:

- p50/p99 decision latency and decisions/s (over the timed calls only);
- hit rate: requests sent to a worker holding their longest cached prefix, measured on a
  tree that records every routing decision (the router's own tree for prefix routers);
- held: mean fraction of the key the chosen worker holds by that tree;
- spread: max/min requests dispatched per worker during the measured window.

Run: `python bench/bench_routing.py` (`--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import percentiles, write_results

from fairpool.sched.radix import RadixTree
from fairpool.sched.registry import make_router
from fairpool.sched.routers import Router, RouteRequest
from fairpool.sched.routers.base import DEFAULT_TREE_TOKENS

ROUTERS = ["round_robin", "least_load", "cache_aware", "d2lpm"]
WORKERS = 64
TENANTS = 16
IN_FLIGHT = 4 * WORKERS
MAX_CHARS = 8000
VOCABULARY = 2000


@dataclass
class RoutingConversation:
    tenant: int
    words: list[int]
    text: str


@dataclass
class Event:
    """Route `request`; then, if set, complete `complete_id` with `output_tokens`."""

    request: RouteRequest
    complete_id: str | None = None
    output_tokens: int = 0


@dataclass
class RoutingWorkload:
    """The request stream: deterministic in the seed, independent of routing decisions."""

    seed: int
    tokens: bool  # token-id keys instead of text keys
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.vocabulary = [
            "".join(self.rng.choices(letters, k=self.rng.randint(2, 9))) for _ in range(VOCABULARY)
        ]
        self.rates = [1 / (rank + 1) ** 0.8 for rank in range(TENANTS)]
        self.systems = [
            [self._words(150, 400) for _ in range(2)] for _ in range(TENANTS)
        ]  # 1-3k characters each

    def _words(self, low: int, high: int) -> list[int]:
        return [self.rng.randrange(VOCABULARY) for _ in range(self.rng.randint(low, high))]

    def _text(self, words: list[int]) -> str:
        return " ".join(self.vocabulary[word] for word in words)

    def events(self, count: int) -> Iterator[Event]:
        rng = self.rng
        idle: list[list[RoutingConversation]] = [[] for _ in range(TENANTS)]
        in_flight: list[tuple[str, RoutingConversation]] = []
        for number in range(count):
            tenant = rng.choices(range(TENANTS), weights=self.rates)[0]
            message = self._words(20, 150)
            conversations = idle[tenant]
            if conversations and rng.random() < 0.7:
                conversation = conversations.pop(rng.randrange(len(conversations)))
                conversation.words += message
                conversation.text += " " + self._text(message)
            else:
                system = self.systems[tenant][rng.randrange(2)]
                words = system + message
                conversation = RoutingConversation(tenant, words, self._text(words))
            request_id = f"r{number}"
            key: Any = (
                [1000 + word for word in conversation.words] if self.tokens else conversation.text
            )
            request = RouteRequest(request_id, f"tenant{tenant}", key, len(conversation.words))
            in_flight.append((request_id, conversation))
            event = Event(request)
            if len(in_flight) > IN_FLIGHT:
                index = rng.randrange(len(in_flight))
                in_flight[index], in_flight[-1] = in_flight[-1], in_flight[index]
                done_id, done = in_flight.pop()
                answer = self._words(30, 200)
                event.complete_id, event.output_tokens = done_id, len(answer)
                done.words += answer
                done.text += " " + self._text(answer)
                if len(done.text) < MAX_CHARS - 1200 and len(idle[done.tenant]) < 32:
                    idle[done.tenant].append(done)  # the user may send another turn
            yield event


def run(name: str, tokens: bool, warmup: int, measured: int, seed: int) -> dict[str, Any]:
    router: Router = make_router(name, [f"w{i:02d}" for i in range(WORKERS)])
    shadow = getattr(router, "tree", None)
    own_tree = shadow is not None
    if shadow is None:  # load-only routers: record their decisions in a tree of our own
        shadow = RadixTree(max_tokens=DEFAULT_TREE_TOKENS)
    assert isinstance(shadow, RadixTree)
    events = RoutingWorkload(seed, tokens).events(warmup + measured)
    started = time.perf_counter()
    for event in itertools.islice(events, warmup):
        worker = router.route(event.request).worker
        if not own_tree:
            shadow.insert(event.request.key, worker)
        if event.complete_id is not None:
            router.complete(event.complete_id, event.output_tokens)
    warm_s = time.perf_counter() - started

    dispatched_before = {w: state.dispatched for w, state in router.workers.items()}
    samples: list[int] = []
    hits = 0
    held = 0.0
    key_chars = 0
    gc.collect()
    clock = time.perf_counter_ns
    for event in events:
        request = event.request
        lengths = shadow.match_lengths(request.key)
        begin = clock()
        worker = router.route(request).worker
        if event.complete_id is not None:
            router.complete(event.complete_id, event.output_tokens)
        samples.append(clock() - begin)
        longest = max(lengths.values(), default=0)
        if longest and lengths.get(worker) == longest:
            hits += 1
        held += lengths.get(worker, 0) / max(len(request.key), 1)
        key_chars += len(request.key)
        if not own_tree:
            shadow.insert(request.key, worker)
    dispatched = [state.dispatched - dispatched_before[w] for w, state in router.workers.items()]
    stats = percentiles(samples)
    total_s = sum(samples) / 1e9
    return {
        "router": name,
        "keys": "tokens" if tokens else "text",
        "decision_latency": stats,
        "decisions_per_s": round(len(samples) / total_s),
        "hit_rate": round(hits / len(samples), 4),
        "held_fraction": round(held / len(samples), 4),
        # None when some worker got nothing in the window (an unbounded ratio)
        "spread_max_over_min": round(max(dispatched) / min(dispatched), 2)
        if min(dispatched)
        else None,
        "dispatched_min_max": [min(dispatched), max(dispatched)],
        "mean_key_length": round(key_chars / len(samples)),
        "tree_tokens": len(shadow),
        "warmup_s": round(warm_s, 2),
    }


def _ratio(value: float | None) -> str:
    return "∞" if value is None else f"{value:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| keys | router | p50 µs | p99 µs | decisions/s | hit rate | held | spread max/min |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        latency = row["decision_latency"]
        low, high = row["dispatched_min_max"]
        spread = row["spread_max_over_min"]
        lines.append(
            f"| {row['keys']} | {row['router']} | {latency['p50_us']:.1f} | "
            f"{latency['p99_us']:.1f} | {row['decisions_per_s']:,} | {row['hit_rate']:.3f} | "
            f"{row['held_fraction']:.3f} | {_ratio(spread)} ({low}-{high}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=20_000)
    parser.add_argument("--measured", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="2k warm-up, 1k measured")
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.measured = 2_000, 1_000
    rows = []
    for tokens in (False, True):
        for name in ROUTERS:
            row = run(name, tokens, args.warmup, args.measured, args.seed)
            rows.append(row)
            latency = row["decision_latency"]
            print(
                f"{row['keys']:>6} {name:<12} p50 {latency['p50_us']:7.1f} µs  "
                f"p99 {latency['p99_us']:7.1f} µs  {row['decisions_per_s']:>7,}/s  "
                f"hit {row['hit_rate']:.3f}  held {row['held_fraction']:.3f}  "
                f"spread {_ratio(row['spread_max_over_min'])}  (warm-up {row['warmup_s']} s)",
                flush=True,
            )
    results = {
        "workers": WORKERS,
        "tenants": TENANTS,
        "in_flight": IN_FLIGHT,
        "warmup_requests": args.warmup,
        "measured_requests": args.measured,
        "seed": args.seed,
        "rows": rows,
    }
    notes = f"""

- {WORKERS} workers, {TENANTS} tenants (rates ∝ rank^-0.8), ~{IN_FLIGHT} requests in flight;
  {args.warmup:,} warm-up requests, then {args.measured:,} timed decisions per row, each
  route() plus the complete() it triggers; one process, one core.
- hit rate: share of requests sent to a worker holding their longest cached prefix, on
  the router's own tree (a tree of the same size recording the decisions, for the
  load-only routers); held: mean fraction of the key the chosen worker holds.
- spread: max/min requests dispatched per worker in the timed window (∞: some worker
  got none). Completions are drawn at random, not from a service model, so a hot worker
  does not slow down here: spread shows where routing sends work, not its effect.
- Router defaults: cache_aware threshold 0.3, balance 64 / 1.5; d2lpm Q^w = 8192.
"""
    if args.quick:
        return  # a smoke run: numbers too small to record
    path = write_results("routing", results, table(rows) + notes)
    print(f"wrote {path.name} and {path.with_suffix('.md').name} in bench/results/")


if __name__ == "__main__":
    main()
