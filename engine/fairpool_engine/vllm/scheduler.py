"""fairpool's fair scheduler inside vLLM (`--scheduler-cls`, see `FairScheduler`).

vLLM's scheduler stays in charge of everything but the order of its waiting queue: the
running batch, chunked prefill, KV allocation, preemption and the prefix cache are
vLLM's own. `FairSchedulingMixin` swaps `self.waiting` for a `PolicyRequestQueue`
driven by a fairpool policy (DLPM by default; VTC, FCFS, LPM, any with memory-safe
admission), and charges tenants for the service they get:

- the prefill of the uncached prompt tokens when a request is admitted (VTC, OSDI'24,
  §4.1 Alg. 2 line 16; DLPM, arXiv 2501.14312, §4.1 Alg. 1 line 13), with the hit from
  vLLM's KV-cache manager, so a prefix hit is free;
- each output token as `update_from_output` delivers it (VTC Alg. 2 line 22);
- nothing again for a preempted request that comes back.

When memory runs out, vLLM preempts the most recently admitted request; the plugin has it
preempt from the lowest band with a running request first and, for a policy that shares
memory by weight (VTC, DLPM), the youngest request of the tenant furthest above its share
within that band (`fairpool.sched.kv_share`), by ordering vLLM's running list before each
step; such a policy also holds back an admission that would take a tenant above its share
without leaving a block per running request (of its band or a higher one) free.

The tenant is the request's `vllm_xargs.fairpool_tenant`, its band the tenant's in the
configuration or a lower one its `vllm_xargs.fairpool_band` asks: the request runs in that
flow (`LiveScheduler.flow_of`). The policy, weights, groups and bands come from the file
named by FAIRPOOL_SCHEDULER_CONFIG, re-read while the engine runs. A policy that decides
the shape of each batch (RAD) is refused there, at start and on reload: vLLM schedules its
running requests before it peeks at the queue, so a batch always holds the running
decodes alongside any prefill, which RAD's batches never do.

`FairScheduler` picks vLLM's `AsyncScheduler` or plain `Scheduler` as its base to match
the engine's async-scheduling setting (on by default on GPUs, forced off on CPUs), so
one `--scheduler-cls` serves both.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from vllm.logger import init_logger

from fairpool.sched import kv_share
from fairpool.sched.cost import Tokens, tenant_of
from fairpool.sched.requests import Request as PolicyRequest
from fairpool.sched.requests import Running
from fairpool_engine.live import LiveScheduler
from fairpool_engine.tenant_metrics import TenantMetrics
from fairpool_engine.vllm.compat import (
    AsyncScheduler,
    ObservedBlockMap,
    Request,
    Scheduler,
    check_version,
    kv_capacity_tokens,
    local_hit_tokens,
    observed_block_map,
    prefix_lookup,
    put_victims_last,
)
from fairpool_engine.vllm.request_queue import PolicyRequestQueue, policy_request

# vLLM only installs handlers on loggers under its own namespace.
log = init_logger("vllm.fairpool")
#: Optional JSON-lines file of scheduling events (add, admit, preempt, finish), for tests
#: and for debugging an engine's decisions.
TRACE_ENV = "FAIRPOOL_SCHEDULER_TRACE"
#: Where the prefix cache's changes cannot be followed (hybrid or EAGLE layouts): steps a
#: waiting request's prefix hit is reused for ordering before it is looked up again.
HIT_REFRESH_STEPS = 32
#: Prefix-cache changes kept for the waiting queue's next pick before they are applied
#: anyway (the queue applies them when it picks; this bounds the list while it is empty).
MAX_UNFOLLOWED_CHANGES = 4096


class VllmEngineView:
    """What a fairpool policy sees of a vLLM engine (`fairpool.sched.EngineView`).

    Prefix hits of waiting requests, which LPM and DLPM order by, are looked up once and
    then kept current from the prefix cache's own changes: each hit is forgotten when a
    block it counted is dropped or the block after it is stored (`ObservedBlockMap`),
    and only that tenant's hit epoch moves on. On the usual single full-attention cache
    the hits are therefore exact at every pick, and a steady queue costs no lookups at
    all. Other cache layouts fall back to looking every hit up again each
    HIT_REFRESH_STEPS steps."""

    def __init__(self, scheduler: FairSchedulingMixin) -> None:
        self._scheduler = scheduler
        self._hits: dict[str, int] = {}  # waiting request id → its prefix hit
        self._watchers: dict[bytes, set[str]] = {}  # cache key → requests whose hit it decides
        self._watching: dict[str, list[bytes]] = {}  # request id → its keys in `_watchers`
        self._tenant_epochs: defaultdict[str, int] = defaultdict(int)
        #: `EngineView.hit_epoch`: a tenant's epoch moves on when one of its hits may have
        #: changed. A dict lookup rather than a method, as a pick asks it of every tenant.
        self.hit_epoch: Callable[[str], int] = self._tenant_epochs.__getitem__
        self._followed: ObservedBlockMap | None = None
        self._block_pool: Any = None
        self._step = 0
        self._running: list[Running] | None = None
        self.mean_batch_time = 0.0

    def new_step(self, batch_time: float | None) -> None:
        self._step += 1
        self._running = None
        if self._followed is not None and len(self._followed.changed) > MAX_UNFOLLOWED_CHANGES:
            self.follow_cache()  # the queue has been empty for long: keep the list short
        if self._followed is None and self._step % HIT_REFRESH_STEPS == 0:
            self._forget_all_hits()
        if batch_time is not None:  # exponential mean over recent steps
            self.mean_batch_time += 0.1 * (batch_time - self.mean_batch_time)

    @property
    def now(self) -> float:
        return time.monotonic()

    @property
    def memory_tokens(self) -> int:
        """M for memory-safe admission: the KV capacity in tokens (the check counts the
        block each request may leave partly empty: `block_size`)."""
        scheduler = self._scheduler
        return kv_capacity_tokens(scheduler.kv_cache_manager, scheduler.block_size)

    @property
    def block_size(self) -> int:
        return int(self._scheduler.block_size)

    @property
    def memory_utilization(self) -> float:
        return float(self._scheduler.kv_cache_manager.usage)

    @property
    def running(self) -> list[Running]:
        if self._running is None:
            known = self._scheduler.policy_requests
            self._running = [
                Running(
                    known[request.request_id],
                    output_tokens=request.num_output_tokens,
                    prefill_remaining=max(
                        request.num_prompt_tokens - request.num_computed_tokens, 0
                    ),
                )
                for request in self._scheduler.running
                if request.request_id in known
            ]
        return self._running

    # ------------------------------------------------------------ prefix hits

    def cached_tokens(self, request: PolicyRequest) -> int:
        hit = self._hits.get(request.request_id)
        if hit is None:
            hit = self._look_up(self._scheduler.requests[request.request_id])
        return hit

    def followed_hits(self) -> dict[str, int]:
        """The hits followed now, by request id (for tests and debugging)."""
        return dict(self._hits)

    def admission_hit(self, request: Request) -> int:
        """The hit to charge `request` on admission, as vLLM's own lookup will find it:
        the followed one, or else looked up now (the request is leaving the queue, so
        its hit is not kept)."""
        hit = self._hits.get(request.request_id) if self._followed is not None else None
        if hit is None:
            scheduler = self._scheduler
            hit = prefix_lookup(
                scheduler.kv_cache_manager, request, scheduler.block_size, self._followed
            )[0]
        return hit

    def follow_cache(self) -> None:
        """Forget the hits that the prefix cache's changes since the last call decide."""
        followed = self._followed
        if followed is None or followed is not self._block_pool.cached_block_hash_to_block:
            followed = self._follow_new_map()  # first call, or vLLM reset its cache
        if followed is not None and followed.changed:
            for key in followed.changed:
                for request_id in self._watchers.pop(key, ()):
                    self._forget_hit(request_id, moved=True)
            followed.changed.clear()

    def _follow_new_map(self) -> ObservedBlockMap | None:
        scheduler = self._scheduler
        self._block_pool = scheduler.kv_cache_manager.block_pool
        block_map = observed_block_map(scheduler.kv_cache_manager, scheduler.block_size)
        if block_map is not self._followed:
            self._followed = block_map
            self._forget_all_hits()
        return block_map

    def forget(self, request_id: str) -> None:
        """`request_id` left the waiting queue: admitted (vLLM adds it to its running
        requests before it peeks again) or aborted."""
        self._forget_hit(request_id, moved=False)
        self._running = None  # the next pick of this step must count it as running

    def _look_up(self, request: Request) -> int:
        scheduler = self._scheduler
        hit, keys = prefix_lookup(
            scheduler.kv_cache_manager, request, scheduler.block_size, self._followed
        )
        request_id = request.request_id
        self._hits[request_id] = hit
        if keys:
            self._watching[request_id] = keys
            all_watchers = self._watchers
            for key in keys:
                watchers = all_watchers.get(key)
                if watchers is None:
                    all_watchers[key] = {request_id}
                else:
                    watchers.add(request_id)
        return hit

    def _forget_hit(self, request_id: str, moved: bool) -> None:
        if self._hits.pop(request_id, None) is None:
            return
        for key in self._watching.pop(request_id, ()):
            watchers = self._watchers.get(key)
            if watchers is not None:
                watchers.discard(request_id)
                if not watchers:
                    del self._watchers[key]
        request = self._scheduler.policy_requests.get(request_id)
        if moved and request is not None:
            self._tenant_epochs[request.tenant] += 1

    def _forget_all_hits(self) -> None:
        self._hits.clear()
        self._watchers.clear()
        self._watching.clear()
        epochs = self._tenant_epochs
        for tenant in epochs:  # every tenant a policy has asked about
            epochs[tenant] += 1


class FairSchedulingMixin:
    """The fair queue and the charging, over whichever vLLM scheduler it is mixed into."""

    # Provided by vLLM's Scheduler.
    kv_cache_manager: Any
    block_size: int
    running: list[Request]
    requests: dict[str, Request]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.vllm_version = check_version()
        self.live = LiveScheduler.from_environment(queue_only=True)
        self.policy_requests: dict[str, PolicyRequest] = {}
        self.view = VllmEngineView(self)
        self.metrics = TenantMetrics()
        self._step_started: float | None = None
        self._finishing: list[str] | None = None  # set while update_from_output runs
        self._first_victim: str | None = None  # flow of this step's first victim, planned
        self._trace = _open_trace()
        super().__init__(*args, **kwargs)
        self.waiting = PolicyRequestQueue(self)
        self.metrics.export(self.live, self.view.memory_tokens, force=True)
        log.info(
            "fairpool scheduler active: %s over %s, policy=%s, block_size=%d, vLLM %s",
            type(self).__name__,
            type(self).__mro__[2].__name__,
            self.live.config.policy_name,
            self.block_size,
            self.vllm_version,
        )

    def register(self, request: Request) -> PolicyRequest:
        scheduled = policy_request(request, self.live)
        self.policy_requests[request.request_id] = scheduled
        self._record(
            "add",
            request.request_id,
            **self._flow_fields(scheduled.tenant),
            prompt=scheduled.prompt_tokens,
        )
        return scheduled

    # ------------------------------------------------------------ vLLM's interface

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.live.maybe_reload():
            log.info("fairpool scheduler now runs %s", self.live.config.policy_name)
        now = time.monotonic()
        self.view.new_step(None if self._step_started is None else now - self._step_started)
        # len(), not bool(): with memory-safe admission bool() would pick a request now.
        self._step_started = now if self.running or len(self.waiting) else None
        self.waiting.new_step()
        self._put_victims_last()
        output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        self._check_charged_hits(output)
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        self._finishing = []
        try:
            outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        finally:
            finishing, self._finishing = self._finishing, None
        policy = self.live.policy
        for engine_outputs in outputs.values():
            for output in engine_outputs.outputs:
                if output.new_token_ids and output.request_id in self.policy_requests:
                    policy.record_output(output.request_id, len(output.new_token_ids))
        for request_id in finishing:
            self._forget(request_id)
        self.metrics.export(self.live, self.view.memory_tokens, force=not self.policy_requests)
        return outputs

    def _get_local_prefix_cache_hit(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        found = super()._get_local_prefix_cache_hit(request, *args, **kwargs)  # type: ignore[misc]
        self.waiting.note_vllm_hit(request.request_id, local_hit_tokens(found))
        return found

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        result = super()._free_request(request, *args, **kwargs)  # type: ignore[misc]
        if self._finishing is not None:  # the step's last tokens are charged first
            self._finishing.append(request.request_id)
        else:
            self._forget(request.request_id)
        return result

    # ------------------------------------------------------------ internals

    def _put_victims_last(self) -> None:
        """Have vLLM preempt, when memory runs out this step, in the policy's order
        (`LocalPolicy.preemption_order`): the lowest band's requests first, and for a
        policy that shares memory the youngest requests of the tenants furthest above
        their share first, where vLLM would take the most recently admitted of all. Left
        to vLLM when its choice is the policy's: memory not shared, and the flows with
        requests (a few, where the running requests are many) all in one band."""
        policy = self.live.policy
        self._first_victim = None
        if len(self.running) < 2:
            return
        if not policy.shares_memory and not kv_share.spans_bands(
            policy.active_tenants(), policy.weights
        ):
            return
        admitted = {request_id: index for index, request_id in enumerate(policy.running_ids())}
        running = sorted(self.view.running, key=lambda r: admitted.get(r.request_id, -1))
        order = policy.preemption_order(running)
        put_victims_last(self, [request.request_id for request in order])
        self._first_victim = order[0].tenant if order else None

    def preempted(self, request_id: str) -> None:
        """vLLM preempted `request_id` (traced with its tenant and band, the flow planned
        to lose memory first this step and how many of its requests still run, and the
        bands of the requests still running)."""
        if self._trace is None:
            return
        planned = self._first_victim
        still_running = [
            known
            for request in self.running
            if (known := self.policy_requests.get(request.request_id)) is not None
        ]
        left = sum(1 for known in still_running if known.tenant == planned)
        bands = self.live.policy.weights.band_of
        self._record(
            "preempt",
            request_id,
            **self._flow_fields(self.policy_requests[request_id].tenant),
            planned=planned,
            planned_left=left,
            running_bands=sorted({bands(known.tenant) for known in still_running}),
        )

    def _forget(self, request_id: str) -> None:
        if self.policy_requests.pop(request_id, None) is not None:
            self.live.policy.remove(request_id)
            self.view.forget(request_id)
            self._record("finish", request_id)
            if not self.policy_requests:
                self.metrics.export(self.live, self.view.memory_tokens, force=True)

    def _check_charged_hits(self, output: Any) -> None:
        """Charge the difference where vLLM's hit differs from the one charged (a KV
        connector's external hit, which the queue cannot see)."""
        charged = self.waiting.charged_hits
        if not charged:
            return
        policy = self.live.policy
        for new in output.scheduled_new_reqs:
            estimate = charged.get(new.req_id)
            if estimate is None:
                continue
            actual = int(new.num_computed_tokens)
            if actual != estimate:
                prompt = self.requests[new.req_id].num_prompt_tokens
                correction = policy.cost.correction(  # hits never pass the prompt
                    Tokens(extend=max(prompt - estimate, 0)), Tokens(extend=max(prompt - actual, 0))
                )
                policy.correct_charge(new.req_id, correction)
            if self._trace is not None:
                self._record(
                    "admit",
                    new.req_id,
                    **self._flow_fields(self.policy_requests[new.req_id].tenant),
                    cached=actual,
                    estimated=estimate,
                )

    def _flow_fields(self, flow: str) -> dict[str, str]:
        """A flow as the trace names it: its tenant and band."""
        return {"tenant": tenant_of(flow), "band": self.live.policy.weights.band_of(flow)}

    def _record(self, event: str, request_id: str, **fields: Any) -> None:
        if self._trace is not None:
            line = {"t": time.time(), "event": event, "request": request_id, **fields}
            self._trace.write(json.dumps(line) + "\n")
            self._trace.flush()


def _open_trace() -> Any:
    path = os.environ.get(TRACE_ENV)
    return open(path, "a") if path else None


class FairSyncScheduler(FairSchedulingMixin, Scheduler):
    """Over vLLM's plain scheduler (CPU, or --no-async-scheduling)."""


class FairAsyncScheduler(FairSchedulingMixin, AsyncScheduler):
    """Over vLLM's async scheduler (the GPU default)."""


def FairScheduler(*args: Any, vllm_config: Any, **kwargs: Any) -> FairSchedulingMixin:
    """What `--scheduler-cls` names: the fair scheduler over the base vLLM would use."""
    cls = FairAsyncScheduler if vllm_config.scheduler_config.async_scheduling else FairSyncScheduler
    return cls(*args, vllm_config=vllm_config, **kwargs)
