"""The interface of routers: which worker of a pool gets a request.

A router tracks the pool's workers (outstanding requests it dispatched, KV usage the
engines report), and is told of dispatches, completions and cache evictions:

- `route(request)` picks a worker, counts the request as outstanding there and returns the
  decision: the worker, and how much of the key its cache holds (as far as the router
  knows) before this request;
- `complete(request_id, output_tokens, uncached_input)` when the answer is done (or failed),
  with the engine's count of prompt tokens it did not find cached, if it reported one;
- `evicted(key, worker)` when a worker reports a prefix gone from its cache;
- `update_load(worker, ...)` with what a worker's metrics say;
- `add_worker` / `remove_worker` as the pool changes;
- `room(worker)` for routers that cap a worker's concurrency (JFFC's chain capacities);
- `set_weights(weights)` and `tenant_state()` for routers that keep per-tenant state
  (D2LPM's deficits); `cache_size()` for those that keep a prefix tree.

Prefix-aware routers keep an approximate radix tree of the keys they routed — text at the
gateway, token ids in the simulator — that learns from their own decisions and forgets by
LRU under a size bound, like SGLang's router.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fairpool.sched.cost import TenantWeights, Tokens
from fairpool.sched.errors import ConfigError, require_count, require_non_negative
from fairpool.sched.radix import RadixTree

DEFAULT_TREE_TOKENS = 1 << 22


@dataclass(frozen=True)
class RouteRequest:
    """What a router sees of a request: the tenant, the prefix key, and its size."""

    request_id: str
    tenant: str
    key: Sequence[Any]  # prompt text or token ids; one kind per router
    input_tokens: int

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ConfigError("request_id", "must be a non-empty string")
        if not self.tenant:
            raise ConfigError("tenant", "must be a non-empty string")
        require_count("input_tokens", self.input_tokens, minimum=0)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a request goes: the worker, and the length of the request's key that the
    router believes the worker holds in its prefix cache (0 for routers without a tree;
    matches shorter than the router's `min_match` count as 0, as an engine cannot reuse
    them)."""

    worker: str
    matched: int = 0


@dataclass
class WorkerState:
    worker_id: str
    outstanding: int = 0  # s_w: requests dispatched and not yet complete
    kv_usage: float = 0.0  # 0..1, as the engine last reported
    waiting: int = 0  # the engine's own queue, as last reported
    dispatched: int = 0  # total requests sent here
    sent_since_report: int = 0  # dispatched since `waiting` was last reported, outstanding
    reports: int = 0  # how many times `waiting` was reported
    #: Outstanding requests per tenant (tenants with none are dropped).
    tenants: dict[str, int] = field(default_factory=dict)

    @property
    def expected_waiting(self) -> int:
        """The engine's queue as it may be now: the last report, plus the requests sent
        since that are still outstanding (each may still wait). A front that read the
        report alone would send a whole burst into a queue it believes short."""
        return self.waiting + self.sent_since_report


@dataclass
class InFlight:
    """A dispatched request, as the router charged it."""

    worker_id: str
    tenant: str
    input_tokens: int  # charged at dispatch as extend tokens, as the router estimated them
    report: int = 0  # its worker's `reports` when it was dispatched
    orphaned: bool = False  # its worker left the pool while it was in flight


class Router(ABC):
    """Base of all routers: worker table, in-flight requests and their bookkeeping."""

    name: ClassVar[str]

    def __init__(self, workers: Iterable[str] = ()) -> None:
        self.workers: dict[str, WorkerState] = {}
        self._in_flight: dict[str, InFlight] = {}
        for worker in workers:
            self.add_worker(worker)

    # ------------------------------------------------------------------ pool

    def add_worker(self, worker_id: str) -> None:
        if not isinstance(worker_id, str) or not worker_id:
            raise ConfigError("worker_id", f"must be a non-empty string, got {worker_id!r}")
        self.workers.setdefault(worker_id, WorkerState(worker_id))

    def remove_worker(self, worker_id: str) -> None:
        if self.workers.pop(worker_id, None) is None:
            return
        # Requests still in flight there complete without touching a worker re-added
        # under the same id later.
        for flight in self._in_flight.values():
            if flight.worker_id == worker_id:
                flight.orphaned = True

    def update_load(
        self, worker_id: str, kv_usage: float | None = None, waiting: int | None = None
    ) -> None:
        state = self._worker(worker_id)
        if kv_usage is not None:
            state.kv_usage = require_non_negative("kv_usage", kv_usage)
        if waiting is not None:
            state.waiting = require_count("waiting", waiting)
            state.sent_since_report = 0
            state.reports += 1

    # ------------------------------------------------------------------ requests

    def route(
        self, request: RouteRequest, eligible: Collection[str] | None = None
    ) -> RouteDecision:
        """Pick the worker for `request` among the `eligible` ones (default: every worker;
        the gateway's front passes those below its saturation thresholds), and count the
        request there."""
        if not self.workers:
            raise ConfigError("workers", "the pool has no workers to route to")
        if request.request_id in self._in_flight:
            raise ConfigError("request_id", f"{request.request_id!r} is already in flight")
        candidates = list(self.workers)
        if eligible is not None:
            candidates = [worker for worker in candidates if worker in eligible]
            if not candidates:
                raise ConfigError("eligible", "no worker of the pool is eligible")
        worker_id = self._choose(request, candidates)
        # Before `_dispatched`: a prefix router learns the key there, and would then
        # report a never-seen prompt as fully cached.
        decision = RouteDecision(worker_id, self._matched(request, worker_id))
        state = self.workers[worker_id]
        state.outstanding += 1
        state.dispatched += 1
        state.sent_since_report += 1
        state.tenants[request.tenant] = state.tenants.get(request.tenant, 0) + 1
        self._in_flight[request.request_id] = InFlight(
            worker_id, request.tenant, request.input_tokens, report=state.reports
        )
        self._dispatched(request, worker_id)
        return decision

    def complete(
        self, request_id: str, output_tokens: int = 0, uncached_input: int | None = None
    ) -> None:
        """The request finished (or failed) after producing `output_tokens`. When the engine
        reported how many prompt tokens it computed (`uncached_input`: prompt − cached),
        the input charged at dispatch is corrected to it."""
        require_count("output_tokens", output_tokens)
        if uncached_input is not None:
            require_count("uncached_input", uncached_input)
        flight = self._in_flight.pop(request_id, None)
        if flight is None:
            raise ConfigError("request_id", f"{request_id!r} is not in flight")
        if flight.orphaned:
            return
        state = self.workers[flight.worker_id]
        state.outstanding -= 1
        if flight.report == state.reports:  # sent since the last report: waits no more
            state.sent_since_report -= 1
        left = state.tenants[flight.tenant] - 1
        if left:
            state.tenants[flight.tenant] = left
        else:
            del state.tenants[flight.tenant]
        self._completed(flight, Tokens(extend=uncached_input, output=output_tokens))

    def evicted(self, key: Sequence[Any], worker_id: str, keep: int | None = None) -> None:
        """`worker_id` dropped `key` (beyond `keep` elements) from its prefix cache."""

    def room(self, worker_id: str) -> int | None:
        """More requests `worker_id` may take now; None when the router sets no limit
        (the gateway's saturation thresholds still apply)."""
        return None

    def set_weights(self, weights: TenantWeights) -> None:
        """New tenant weights (a reloaded tenant table), for routers that use them."""

    def charge_elsewhere(self, tenant: str, worker_id: str, service: float) -> None:
        """Another replica of the gateway served `tenant` `service` on `worker_id`, for
        routers whose decisions follow what tenants were served (D2LPM's deficits)."""

    def tenant_state(self) -> dict[str, dict[str, float]]:
        """Per tenant, per worker, the quantity the router balances tenants by (D2LPM's
        deficit q[tenant, worker]); {} for routers that keep none."""
        return {}

    def cache_size(self) -> int | None:
        """Elements of keys the router's prefix tree holds; None without a tree."""
        return None

    @property
    def worker_quantum(self) -> float | None:
        """The per-worker quantum in force, for routers with per-worker deficits (D2LPM's
        Q^w); None for the others."""
        return None

    def has_room(self) -> bool:
        """Some worker may take another request."""
        return bool(self.workers) and any(self.room(worker) != 0 for worker in self.workers)

    def in_flight(self, request_id: str) -> str | None:
        flight = self._in_flight.get(request_id)
        return flight.worker_id if flight else None

    # ------------------------------------------------------------------ for subclasses

    @abstractmethod
    def _choose(self, request: RouteRequest, candidates: list[str]) -> str:
        """The worker for `request` among `candidates` (not empty; in pool order)."""

    def _dispatched(self, request: RouteRequest, worker_id: str) -> None:
        """`request` was sent to `worker_id`."""

    def _matched(self, request: RouteRequest, worker_id: str) -> int:
        """How much of `request.key` the router believes `worker_id` holds (not yet
        counting `request` itself)."""
        return 0

    def _completed(self, flight: InFlight, served: Tokens) -> None:
        """`flight` completed having been served `served` (its extend tokens unknown when
        the engine did not report them); it was charged `flight.input_tokens` at dispatch."""

    def _least_loaded(self, candidates: Iterable[str]) -> str:
        """Fewest outstanding requests; ties by KV usage, then fewest ever dispatched."""
        return min(
            candidates,
            key=lambda worker: (
                self.workers[worker].outstanding,
                self.workers[worker].kv_usage,
                self.workers[worker].dispatched,
                worker,
            ),
        )

    def _worker(self, worker_id: str) -> WorkerState:
        state = self.workers.get(worker_id)
        if state is None:
            raise ConfigError("worker_id", f"unknown worker {worker_id!r}")
        return state


class PrefixRouter(Router):
    """A router that keeps an approximate prefix tree of what it sent where."""

    def __init__(
        self,
        workers: Iterable[str] = (),
        max_tree_tokens: int = DEFAULT_TREE_TOKENS,
        min_match: int = 0,
        max_tree_nodes: int | None = None,
    ) -> None:
        if max_tree_nodes is not None:
            require_count("max_tree_nodes", max_tree_nodes, 1)
        self.tree = RadixTree(
            max_tokens=require_count("max_tree_tokens", max_tree_tokens, 1),
            max_nodes=max_tree_nodes,
        )
        #: Shorter matches count as none: an engine reuses whole KV blocks only, so a few
        #: shared characters ("You are") are no reason to pick a worker.
        self.min_match = require_count("min_match", min_match)
        super().__init__(workers)

    def remove_worker(self, worker_id: str) -> None:
        super().remove_worker(worker_id)
        self.tree.remove_owner(worker_id)

    def evicted(self, key: Sequence[Any], worker_id: str, keep: int | None = None) -> None:
        self.tree.evict(key, worker_id, keep)

    def cache_size(self) -> int:
        return len(self.tree)

    def _matched(self, request: RouteRequest, worker_id: str) -> int:
        matched = self.tree.match_length(request.key, worker_id)
        return matched if matched >= self.min_match else 0

    def _dispatched(self, request: RouteRequest, worker_id: str) -> None:
        self.tree.insert(request.key, worker_id)

    def _longest_match(self, request: RouteRequest) -> tuple[int, list[str]]:
        """Longest cached prefix of the key and the live workers holding all of it."""
        match = self.tree.match(request.key)
        if match.length < self.min_match:
            return 0, []
        return match.length, [w for w in match.owners if isinstance(w, str) and w in self.workers]
