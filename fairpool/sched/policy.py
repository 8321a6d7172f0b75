"""The interface of local policies: what one engine admits next, and who pays for it.

An engine drives a policy with events:

- `add(request)` when a request arrives, `remove(request_id)` when it is aborted;
- `next_request(view)` for the request the policy wants admitted next (None: stop
  admitting for this step). The engine then tries to fit it; if it does not fit, the engine
  stops the pass there (head-of-line, as vLLM, SGLang and all four papers do) and asks
  again next step. If it fits, the engine calls `admit(request_id, cached_tokens)`, which
  charges the prefill of the uncached tokens;
- `record_output(request_id, n)` as tokens are generated, which charges decode;
- `preempt(request_id)` when the engine evicts a running request to recompute it later:
  it goes back to the front of the waiting queue and is not charged again;
- `finish(request_id)` when it completes.

`next_request` has no side effects beyond the policy's own bookkeeping of rounds (DLPM's
refill), so an engine may call it repeatedly before admitting, as vLLM's
`peek_request`/`pop_request` queue interface does.

Memory-safe admission (seed 002, Algorithm 2) combines with any order: with
`memory_safe=True` the policy returns None instead of a request whose admission could
overflow KV memory at a future completion time.

Every policy keeps the fair order's tree (`fairpool.sched.tree.FairTree`) of its tenants'
bands and groups, fed by the same events; the policies that weigh tenants (VTC, DLPM) take
their requests from the flows it offers (`FairTree.candidates`), so a band, a group and a
tenant are ordered alike in an engine, the gateway's queue and the simulator. A request's
`tenant` is its flow: the tenant, or `tenant@band` for a request run below its tenant's
band.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from fairpool.sched import kv_share
from fairpool.sched.cost import CostModel, TenantWeights
from fairpool.sched.errors import ConfigError, require_count
from fairpool.sched.match_order import MatchOrder
from fairpool.sched.memory import OutputPredictor, admission_is_memory_safe, predict_max_tokens
from fairpool.sched.prediction import RecentOutputs
from fairpool.sched.requests import EngineView, Request, Running
from fairpool.sched.tree import FairTree, Shares


@dataclass(eq=False, slots=True)
class Waiting:
    """A queued request; `order` sorts FCFS (preempted requests get negative orders)."""

    request: Request
    order: int
    charged: bool = False  # prefill already paid at an earlier admission
    queued: bool = True  # False once it has left the queue (admitted or aborted)


class LocalPolicy(ABC):
    """Base of all local policies: queues, running set, charging, memory-safe admission."""

    name: ClassVar[str]
    #: Per-step limits the policy imposes; None means the engine's own.
    token_budget: int | None = None
    max_decodes: int | None = None
    #: Whether, by default, memory is shared by weight when it runs out
    #: (`fairpool.sched.kv_share`); the fair policies do.
    shares_memory = False
    #: Whether it orders tenants by their weighted service, so that an engine running it
    #: keeps the weights between tenants with requests in its queue (VTC, DLPM).
    weighs_tenants = False

    def __init__(
        self,
        cost: CostModel | None = None,
        weights: TenantWeights | None = None,
        memory_safe: bool = False,
        predictor: OutputPredictor | None = None,
        predict_output: bool = False,
        share_memory: bool | None = None,
    ) -> None:
        self.cost = cost or CostModel()
        self.tree = FairTree(Shares.of(weights))
        self.memory_safe = memory_safe
        self.predictor: OutputPredictor = predictor or predict_max_tokens
        #: Charge the order at admission for the output predicted (VTC §4.4, Alg. 3).
        self.outputs = RecentOutputs() if predict_output else None
        self.shares_memory = _chosen(share_memory, self.shares_memory)
        self._ahead: dict[str, int] = {}  # running request → output charged, not produced
        self._produced: dict[str, int] = defaultdict(int)  # request → output (predicting)
        self.served: dict[str, float] = defaultdict(float)
        #: The largest prompt admitted so far, in service (w_e·L_input): the bounds' U.
        self.largest_prompt = 0.0
        self._queues: dict[str, deque[Waiting]] = {}  # tenants with a waiting request
        self._waiting: dict[str, Waiting] = {}
        self._running: dict[str, Request] = {}
        self._running_per_tenant: dict[str, int] = defaultdict(int)
        self._arrivals = itertools.count()
        self._match_order = MatchOrder()
        self._requeues = itertools.count(start=-1, step=-1)
        #: The counters of tenants waiting in other queues that share this one's order
        #: (a gateway's replicas, `fairpool.front.peers`); an engine has none.
        self.waiting_elsewhere: Callable[[], Iterable[float]] = tuple
        #: Whether a flow has requests waiting at another queue that shares this one's
        #: order: it is backlogged there, so joining here it is not lifted.
        self.queued_elsewhere: Callable[[str], bool] = lambda flow: False

    @property
    def weights(self) -> Shares:
        """The tenants' weights, with their bands and groups (the tree's shape)."""
        return self.tree.shares

    @weights.setter
    def weights(self, weights: TenantWeights) -> None:
        """New weights (a reloaded tenant table); counters keep their values, and a new
        shape of bands and groups takes the flows waiting now."""
        self.tree.reshape(Shares.of(weights), self._queues)

    # ------------------------------------------------------------------ events

    def add(self, request: Request) -> None:
        if request.request_id in self._waiting or request.request_id in self._running:
            raise ConfigError("request_id", f"{request.request_id!r} is already queued or running")
        tenant = request.tenant
        if tenant not in self._queues:
            self._join(tenant, idle=self._running_per_tenant[tenant] == 0)
        self._enqueue(Waiting(request, next(self._arrivals)), front=False)

    def remove(self, request_id: str) -> bool:
        """Abort a waiting or running request; False if the policy does not know it."""
        if request_id in self._waiting:
            entry = self._waiting[request_id]
            self._dequeue(entry)
            if entry.charged:  # preempted: its output charge ends with it
                self._settle_output(entry.request, completed=False)
            return True
        if request_id in self._running:
            self._settle_output(self._pop_running(request_id), completed=False)
            return True
        return False

    def next_request(self, view: EngineView) -> Request | None:
        entry = self._select(view)
        if entry is None:
            return None
        request = entry.request
        if self.memory_safe and not admission_is_memory_safe(view, request, self.predictor):
            return None
        if self.shares_memory and not kv_share.leaves_headroom(
            view, request, self._queues, self.weights
        ):
            return None
        return request

    def admit(self, request_id: str, cached_tokens: int = 0) -> float:
        """The engine started serving `request_id`; returns the service it received (its
        prefill). A policy that predicts output also charges its order, now, for the
        output the request is predicted to produce."""
        entry = self._waiting.get(request_id)
        if entry is None:
            raise ConfigError("request_id", f"{request_id!r} is not waiting")
        request = entry.request
        require_count("cached_tokens", cached_tokens, minimum=0)
        self._dequeue(entry)
        self._running[request_id] = request
        self._running_per_tenant[request.tenant] += 1
        if entry.charged:
            return 0.0
        self.largest_prompt = max(self.largest_prompt, self.cost.prefill(request.prompt_tokens, 0))
        service = self._charge(
            request.tenant, self.cost.prefill(request.prompt_tokens, cached_tokens)
        )
        if self.outputs is not None:
            self._ahead[request_id] = self.outputs.predict(request)
            self._charged(request.tenant, self.cost.decode(self._ahead[request_id]))
        return service

    def record_output(self, request_id: str, tokens: int = 1) -> float:
        """`tokens` more output tokens were generated for a running request (or for one
        preempted since: engines that schedule ahead deliver a step's tokens late); returns
        the service they are. What admission charged the order ahead covers them first."""
        request = self._served_request(request_id)
        if self.outputs is not None:
            self._produced[request_id] += tokens
        service = self.cost.decode(tokens)
        self.served[request.tenant] += service
        covered = min(self._ahead.get(request_id, 0), tokens)
        if covered:
            self._ahead[request_id] -= covered
        if covered < tokens:
            self._charged(request.tenant, self.cost.decode(tokens - covered))
        return service

    def correct_charge(self, request_id: str, service: float) -> float:
        """Add `service` (negative to refund) to what `request_id`'s tenant was charged,
        when the engine learns that an estimate it charged was off."""
        return self._charge(self._served_request(request_id).tenant, service)

    def charge_elsewhere(self, tenant: str, service: float) -> None:
        """Another queue that shares this one's order (a gateway replica's) served
        `tenant` `service`: it counts in the order as this policy's own service does, and
        not in `served`, which is this policy's own."""
        self._charged(tenant, service)

    def preempt(self, request_id: str) -> None:
        """Send a running request back to the front of the queue, already paid for. Its
        tenant rejoins the waiting tenants as any tenant does (VTC's counter lift): a
        preempted request is waiting again like a new one."""
        request = self._pop_running(request_id)
        tenant = request.tenant
        if tenant not in self._queues:
            self._join(tenant, idle=False)  # it had a request running a moment ago
        self._enqueue(Waiting(request, next(self._requeues), charged=True), front=True)

    def finish(self, request_id: str) -> None:
        """The request completed: output charged ahead and not produced is refunded."""
        self._settle_output(self._pop_running(request_id), completed=True)

    def _settle_output(self, request: Request, completed: bool) -> None:
        request_id = request.request_id
        unproduced = self._ahead.pop(request_id, 0)
        if unproduced:  # the order's charge for output that never came
            self._charged(request.tenant, -self.cost.decode(unproduced))
        produced = self._produced.pop(request_id, 0)
        if completed and self.outputs is not None:
            self.outputs.observe(request.tenant, produced)

    def take_over(self, previous: LocalPolicy) -> None:
        """Continue from `previous` (a configuration change in a live engine): its running
        requests, its waiting ones in their order (those already paid for stay paid), and
        the service each tenant received. Scheduling state (counters, deficits) starts
        afresh, as for tenants that just joined."""
        if self._waiting or self._running:
            raise ConfigError("policy", "can only take over from another policy when empty")
        for tenant, service in previous.served.items():
            self.served[tenant] += service
        for request in previous._running.values():
            self._running[request.request_id] = request
            self._running_per_tenant[request.tenant] += 1
        if self.outputs is not None:  # else what was charged ahead stays charged
            self._produced.update(previous._produced)
            self._ahead.update(previous._ahead)
        for entry in sorted(previous.waiting(), key=fcfs_key):
            self.add(entry.request)
            self._waiting[entry.request.request_id].charged = entry.charged

    # ------------------------------------------------------------------ preemption

    #: Preempt every request `preemption_order` names, even once memory suffices.
    preempt_all = False

    def preemption_order(self, running: Sequence[Running]) -> list[Running]:
        """Which running requests to preempt, in order, when memory runs out. The engine
        stops as soon as there is room (unless `preempt_all`) and asks again if not.

        Victims come from the lowest band with a running request first (batch, standard,
        interactive), as the bands' strict priority wants. Inside a band, vLLM's choice
        is the most recently admitted first, whoever it belongs to: under KV pressure
        that undoes a fair policy's latest admission — often the under-served tenant's
        request it just let in. A policy that `shares_memory` takes memory back from the
        tenant furthest above its share first (`fairpool.sched.kv_share`); the others
        keep vLLM's order.
        """
        if self.shares_memory:
            return kv_share.preemption_order(running, self._queues, self.weights)
        return kv_share.latest_first(running, self.weights)

    # ------------------------------------------------------------------ batch shape

    def split_decodes(self, view: EngineView) -> tuple[list[Running], list[Running]]:
        """Running requests to decode this step: (first, before prefills; after, if room).

        Every policy but SLAI decodes everything first, as vLLM and SGLang do.
        """
        return [r for r in view.running if r.decoding], []

    # ------------------------------------------------------------------ state

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    @property
    def running_count(self) -> int:
        return len(self._running)

    def is_running(self, request_id: str) -> bool:
        return request_id in self._running

    def waiting_tenants(self) -> list[str]:
        return list(self._queues)

    @property
    def may_hold_back(self) -> bool:
        """Whether `next_request` may give nothing while requests wait: memory-safe
        admission, or the headroom of memory shared by weight."""
        return self.memory_safe or self.shares_memory

    def running_ids(self) -> list[str]:
        """The running requests, in the order they were admitted (re-admitted, for a
        preempted one)."""
        return list(self._running)

    def head_of(self, tenant: str) -> Request | None:
        """`tenant`'s earliest waiting request (None if it has none)."""
        queue = self._queues.get(tenant)
        return queue[0].request if queue else None

    def tenant_waiting(self, tenant: str) -> int:
        return len(self._queues.get(tenant, ()))

    def tenant_running(self, tenant: str) -> int:
        return self._running_per_tenant.get(tenant, 0)

    def active_tenants(self) -> set[str]:
        """Tenants with a waiting or a running request."""
        running = {tenant for tenant, count in self._running_per_tenant.items() if count}
        return running.union(self.waiting_tenants())

    def is_active(self, tenant: str) -> bool:
        return tenant in self._queues or self._running_per_tenant.get(tenant, 0) > 0

    def tenant_state(self) -> dict[str, float]:
        """The per-tenant quantity the policy schedules by (counter, deficit); {} if none."""
        return {}

    @property
    def quantum(self) -> float | None:
        """The quantum in force, for deficit policies (DLPM's Q); None for the others."""
        return None

    def service_bound(self, memory_tokens: int) -> float | None:
        """The bound the policy's theorem gives on the gap between two backlogged tenants'
        weighted service (service / weight) on an engine holding `memory_tokens` of KV,
        with the largest prompt admitted so far and the policy's parameters in force; None
        for policies without one."""
        return None

    def _largest_request(self, memory_tokens: int) -> float:
        """The bounds' U = w_e·L_input + w_q·M (M: the tokens the KV cache holds, the
        most one request can decode), divided by the smallest weight of a tenant served or
        active, as weighted service is compared."""
        tenants = self.active_tenants().union(self.served)
        lightest = min((self.weights[tenant] for tenant in tenants), default=1.0)
        return (self.largest_prompt + self.cost.decode(memory_tokens)) / lightest

    def waiting(self) -> Iterator[Waiting]:
        return iter(self._waiting.values())

    # ------------------------------------------------------------------ for subclasses

    @abstractmethod
    def _select(self, view: EngineView) -> Waiting | None:
        """The waiting request this policy would admit next."""

    def _on_join(self, tenant: str, idle: bool) -> None:
        """`tenant` had no waiting request and now gets one; `idle`: nothing running either."""

    def _on_charge(self, tenant: str, service: float) -> None:
        """`tenant` received `service` (already in token-service units, not weighted)."""

    def _on_leave(self, tenant: str) -> None:
        """`tenant`'s last waiting request left the queue."""

    def _first_head(
        self,
        tenant_rank: Mapping[str, float] | Callable[[str], float] | None = None,
        tenants: Iterable[str] | None = None,
    ) -> Waiting | None:
        """The earliest waiting request of the tenant (of `tenants`, or of all waiting)
        ranked first by `tenant_rank` (ties, or no ranks: the earliest of all), or None if
        nobody waits. A loop rather than `min` with a key function: it runs once per
        admission over every tenant."""
        best: Waiting | None = None
        best_rank = 0.0
        rank_of = tenant_rank.__getitem__ if isinstance(tenant_rank, Mapping) else tenant_rank
        queues = self._queues
        for tenant in queues if tenants is None else tenants:
            head = queues[tenant][0]
            rank = 0.0 if rank_of is None else rank_of(tenant)
            if best is None or rank < best_rank or (rank == best_rank and head.order < best.order):
                best, best_rank = head, rank
        return best

    def _best(self, entries: Iterator[Waiting], key: Callable[[Waiting], object]) -> Waiting | None:
        return min(entries, key=key, default=None)  # type: ignore[arg-type]

    def _longest_match(self, view: EngineView, tenants: Iterable[str]) -> Waiting | None:
        """The waiting request of `tenants` with the most cached prompt tokens (ties:
        FCFS), the order LPM and DLPM admit in (see `MatchOrder`)."""
        return self._match_order.first(view, tenants, self._queues)

    # ------------------------------------------------------------------ internals

    def _charge(self, tenant: str, service: float) -> float:
        """`tenant` received `service`: counted, and charged to the policy's order."""
        self.served[tenant] += service
        self._charged(tenant, service)
        return service

    def _charged(self, tenant: str, service: float) -> None:
        """Charge `service` to `tenant`'s order: the tree's, and the policy's own."""
        self.tree.charge(tenant, service)
        self._on_charge(tenant, service)

    def _join(self, tenant: str, idle: bool) -> None:
        """`tenant` (a flow) gets its first waiting request: the tree lifts it, and the
        counters of the tenants waiting at a gateway's other replicas count in the lift."""
        if self.queued_elsewhere(tenant):  # backlogged at another replica all along
            self.tree.join(tenant, lift=False)
        else:
            self.tree.join(tenant, self.waiting_elsewhere())
        self._on_join(tenant, idle)

    def _enqueue(self, entry: Waiting, front: bool) -> None:
        self._match_order.arrived(entry)
        queue = self._queues.setdefault(entry.request.tenant, deque())
        if front:
            queue.appendleft(entry)
        else:
            queue.append(entry)
        self._waiting[entry.request.request_id] = entry

    def _dequeue(self, entry: Waiting) -> None:
        tenant = entry.request.tenant
        queue = self._queues[tenant]
        if queue[0] is entry:
            queue.popleft()
        else:
            queue.remove(entry)
        del self._waiting[entry.request.request_id]
        entry.queued = False
        if not queue:
            del self._queues[tenant]  # so that scans over waiting tenants skip idle ones
            self._match_order.forget(tenant)
            self.tree.leave(tenant)
            self._on_leave(tenant)

    def _served_request(self, request_id: str) -> Request:
        """A running request, or a waiting one that was served before (preempted)."""
        request = self._running.get(request_id)
        entry = self._waiting.get(request_id)
        if request is None and entry is not None and entry.charged:
            request = entry.request
        if request is None:
            raise ConfigError("request_id", f"{request_id!r} is not running")
        return request

    def _pop_running(self, request_id: str) -> Request:
        request = self._running.pop(request_id, None)
        if request is None:
            raise ConfigError("request_id", f"{request_id!r} is not running")
        self._running_per_tenant[request.tenant] -= 1
        return request


def fcfs_key(entry: Waiting) -> int:
    return entry.order


__all__ = ["LocalPolicy", "OutputPredictor", "Waiting", "fcfs_key"]


def _chosen(option: bool | None, default: bool) -> bool:
    return default if option is None else option
