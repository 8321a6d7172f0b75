"""A single engine in virtual time: continuous batching with a prefix cache.

This is the engine model the simulator builds on. Each step the policy (through
`fairpool.sched.form_batch`) picks decodes, prefill chunks and admissions; the step's
duration comes from a linear iteration-time model; finished prefills enter the prefix
cache; finished requests leave.

Memory model (KV tokens, capacity M): the prefix cache holds the prompts of running and
recently finished requests (shared prefixes once); each running request also reserves
its uncached prompt tokens until its prefill completes, and room for `max_tokens` of
output from admission to completion. Admission evicts unlocked cached prefixes (LRU)
when it needs room, and fails when even that is not enough, so no request is ever
preempted in this model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fairpool.sched.batch import BatchPlan, form_batch
from fairpool.sched.errors import ConfigError, require_count, require_non_negative
from fairpool.sched.policy import LocalPolicy
from fairpool.sched.radix import LockHandle, RadixTree
from fairpool.sched.requests import Request, Running

CACHE_OWNER = "engine"


@dataclass(frozen=True)
class StepTime:
    """Iteration time (seconds) = base + per prefill token + per decoding sequence
    + per context token the decodes attend to (their KV read)."""

    base: float = 0.012
    per_prefill_token: float = 0.00012
    per_decode: float = 0.00025
    per_context_token: float = 0.0

    def __post_init__(self) -> None:
        for name in ("base", "per_prefill_token", "per_decode", "per_context_token"):
            require_non_negative(name, getattr(self, name))

    def duration(self, plan: BatchPlan) -> float:
        prefill = sum(chunk for _, chunk in plan.prefills)
        context = sum(running.held_tokens for running in plan.decodes)
        return (
            self.base
            + self.per_prefill_token * prefill
            + self.per_decode * len(plan.decodes)
            + self.per_context_token * context
        )


@dataclass
class _Serving:
    running: Running
    tokens: Sequence[int]
    output_target: int
    reserved: int  # KV tokens reserved outside the prefix cache
    admitted_at: float
    lock: LockHandle | None = None
    first_token_at: float | None = None


@dataclass
class Completion:
    request: Request
    cached_tokens: int
    output_tokens: int
    admitted_at: float
    first_token_at: float
    finished_at: float


class EngineListener(Protocol):
    """What a fleet hears from its engines."""

    def admitted(self, engine: SimEngine, request: Request) -> None: ...

    def finished(self, engine: SimEngine, completion: Completion) -> None: ...

    def evicted(self, engine: SimEngine, tokens: Sequence[int], keep: int) -> None: ...


@dataclass
class SimEngine:
    """One engine serving requests under a local policy, in virtual time."""

    policy: LocalPolicy
    memory_tokens: int = 10_000
    token_budget: int = 2048
    step_time: StepTime = field(default_factory=StepTime)
    now: float = 0.0
    name: str = "engine"
    listener: EngineListener | None = None

    def __post_init__(self) -> None:
        require_count("memory_tokens", self.memory_tokens, minimum=1)
        require_count("token_budget", self.token_budget, minimum=1)
        self.cache = RadixTree(on_evict=self._report_eviction)
        self._hits: dict[str, int] = {}  # prefix hits looked up during the current step
        self.running: list[Running] = []
        self.completions: list[Completion] = []
        self.steps = 0
        self.busy_time = 0.0
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self._serving: dict[str, _Serving] = {}
        self._pending: dict[str, tuple[Sequence[int], int]] = {}
        self._cached_at_admission: dict[str, int] = {}
        self._reserved = 0

    # ------------------------------------------------------------------ EngineView

    @property
    def mean_batch_time(self) -> float:
        return self.busy_time / self.steps if self.steps else 0.0

    @property
    def memory_used(self) -> int:
        return len(self.cache) + self._reserved

    @property
    def memory_utilization(self) -> float:
        return min(self.memory_used / self.memory_tokens, 1.0)

    def cached_tokens(self, request: Request) -> int:
        """Prefix hit of a waiting request, looked up once per step (LPM orders ask often)."""
        hit = self._hits.get(request.request_id)
        if hit is None:
            tokens = self._tokens_of(request)
            # The last prompt token is always recomputed, as in vLLM, for the first output.
            hit = min(self.cache.match_length(tokens), max(request.prompt_tokens - 1, 0))
            self._hits[request.request_id] = hit
        return hit

    # ------------------------------------------------------------------ requests

    def submit(self, request: Request, tokens: Sequence[int], output_tokens: int) -> None:
        """A request arrives now; it will produce `output_tokens` (≤ max_tokens)."""
        if len(tokens) != request.prompt_tokens:
            raise ConfigError(
                "tokens", f"has {len(tokens)} ids, prompt_tokens says {request.prompt_tokens}"
            )
        require_count("output_tokens", output_tokens, minimum=1)
        if request.prompt_tokens + request.max_tokens > self.memory_tokens:
            raise ConfigError(
                "max_tokens",
                f"prompt + max_tokens = {request.prompt_tokens + request.max_tokens} exceeds "
                f"the engine's memory of {self.memory_tokens} tokens",
            )
        self._pending[request.request_id] = (tokens, min(output_tokens, request.max_tokens))
        self.policy.add(request)

    def try_admit(self, request: Request, cached_tokens: int) -> Running | None:
        tokens, target = self._pending[request.request_id]
        extend = request.prompt_tokens - cached_tokens
        need = extend + request.max_tokens
        # Lock the hit first, so that making room cannot evict the prefix being reused.
        lock = self.cache.lock(tokens[:cached_tokens]) if cached_tokens else None
        shortfall = self.memory_used + need - self.memory_tokens
        if shortfall > 0:
            self.cache.evict_lru(shortfall)
            if self.memory_used + need > self.memory_tokens:
                if lock is not None:
                    self.cache.unlock(lock)
                return None
        del self._pending[request.request_id]
        running = Running(request, prefill_remaining=max(extend, 1), last_step_end=self.now)
        self._serving[request.request_id] = _Serving(
            running, tokens, target, need, admitted_at=self.now, lock=lock
        )
        self._reserved += need
        self.running.append(running)
        self.prompt_tokens += request.prompt_tokens
        self.cached_prompt_tokens += cached_tokens
        self._cached_at_admission[request.request_id] = cached_tokens
        if self.listener is not None:
            self.listener.admitted(self, request)
        return running

    # ------------------------------------------------------------------ time

    def idle(self) -> bool:
        return not self.running and self.policy.waiting_count == 0

    def step(self) -> BatchPlan:
        """Run one iteration; advances `now` by its duration (by nothing if idle)."""
        self._hits.clear()
        plan = form_batch(self.policy, self, self.token_budget)
        if not plan.decodes and not plan.prefills:
            return plan
        duration = self.step_time.duration(plan)
        self.now += duration
        self.steps += 1
        self.busy_time += duration
        for running in plan.decodes:
            self._emit(running)
        for running, chunk in plan.prefills:
            running.prefill_remaining -= chunk
            if running.prefill_remaining == 0:
                self._prefill_done(running)
        return plan

    def _prefill_done(self, running: Running) -> None:
        serving = self._serving[running.request_id]
        extend = running.request.prompt_tokens - self._cached_at_admission[running.request_id]
        serving.reserved -= extend
        self._reserved -= extend
        self.cache.insert(serving.tokens, CACHE_OWNER)
        if serving.lock is not None:
            self.cache.unlock(serving.lock)
        serving.lock = self.cache.lock(serving.tokens)
        self._emit(running)  # the prefill produces the first output token

    def _emit(self, running: Running) -> None:
        serving = self._serving[running.request_id]
        running.output_tokens += 1
        running.last_step_end = self.now
        if serving.first_token_at is None:
            serving.first_token_at = self.now
        self.policy.record_output(running.request_id, 1)
        if running.output_tokens >= serving.output_target:
            self._finish(serving)

    def _finish(self, serving: _Serving) -> None:
        running = serving.running
        request_id = running.request_id
        self.policy.finish(request_id)
        self.running.remove(running)
        del self._serving[request_id]
        self._reserved -= serving.reserved
        if serving.lock is not None:
            self.cache.unlock(serving.lock)
        assert serving.first_token_at is not None
        completion = Completion(
            running.request,
            self._cached_at_admission.pop(request_id),
            running.output_tokens,
            serving.admitted_at,
            serving.first_token_at,
            self.now,
        )
        self.completions.append(completion)
        if self.listener is not None:
            self.listener.finished(self, completion)

    def _report_eviction(self, tokens: Sequence[int], keep: int, owners: object) -> None:
        if self.listener is not None:
            self.listener.evicted(self, tokens, keep)

    def _tokens_of(self, request: Request) -> Sequence[int]:
        pending = self._pending.get(request.request_id)
        if pending is not None:
            return pending[0]
        return self._serving[request.request_id].tokens
