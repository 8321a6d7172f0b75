"""A single engine in virtual time: continuous batching with a prefix cache.

This is the engine model the simulator builds on. Each step the policy (through
`fairpool.sched.form_batch`) picks decodes, prefill chunks and admissions; the step's
duration comes from a linear iteration-time model; finished prefills enter the prefix
cache; finished requests leave, their generated tokens entering the cache too when the
caller gave their ids (a later prompt may continue with them, as vLLM's cache allows).

Memory (KV tokens, capacity M): the prefix cache holds the prompts of running and
recently finished requests (shared prefixes once; unlocked entries are evicted LRU when
room is needed); each running request also holds its uncached prompt tokens until its
prefill completes, and its generated tokens. Two admission disciplines:

- `paged` (vLLM): a request needs room for its prompt at admission and one token per
  decode step after. When a step cannot get room, running requests are preempted in the
  policy's `preemption_order` — by default the lowest band's first and, within a band,
  the most recently admitted first, as vLLM does — and recomputed later: their KV is
  dropped and the prompt plus what they had generated is prefilled again on
  re-admission. The policy is told (`preempt`) and does not charge the tenant twice.
- `reserve` (S-LoRA, the VTC artifact): admission reserves room for `max_tokens` of
  output as well, so nothing is ever preempted.

KV is allocated in blocks of `block_size` tokens (vLLM: 16; S-LoRA's unified paging:
1). A request's private tokens occupy whole blocks, only full prompt blocks enter the
prefix cache, and a prefix hit counts whole blocks only — so a hit never covers a
partial last block, exactly as vLLM's hash-per-full-block cache behaves.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from fairpool.sched.batch import BatchPlan, form_batch
from fairpool.sched.errors import ConfigError, require_count, require_non_negative
from fairpool.sched.policy import LocalPolicy
from fairpool.sched.radix import LockHandle, RadixTree
from fairpool.sched.requests import Request, Running

CACHE_OWNER = "engine"
Admission = Literal["paged", "reserve"]


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
class _Job:
    """A request from arrival to completion, across preemptions."""

    request: Request
    tokens: Sequence[int]
    output_target: int
    output_ids: Sequence[int] = ()  # the generated tokens' ids, when known
    output_done: int = 0
    running: Running | None = None
    private: int = 0  # KV tokens held outside the prefix cache
    reserved: int = 0  # room kept for outputs still to come (reserve mode)
    footprint: int = 0  # private + reserved, rounded up to whole blocks
    cached: int = 0  # prompt tokens served from the cache at the latest admission
    lock: LockHandle | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None
    preemptions: int = 0
    # Time between tokens (TBT); one per output token, so doubles rather than float objects.
    token_gaps: array[float] = field(default_factory=lambda: array("d"))
    last_token_at: float = 0.0


@dataclass
class Completion:
    request: Request
    cached_tokens: int
    output_tokens: int
    admitted_at: float
    first_token_at: float
    finished_at: float
    preemptions: int = 0
    token_gaps: array[float] = field(default_factory=lambda: array("d"))


class EngineListener(Protocol):
    """What a fleet hears from its engines."""

    def admitted(self, engine: SimEngine, request: Request) -> None: ...

    def preempted(self, engine: SimEngine, request: Request) -> None: ...

    def finished(self, engine: SimEngine, completion: Completion) -> None: ...

    def evicted(self, engine: SimEngine, tokens: Sequence[int], keep: int) -> None: ...


@dataclass
class SimEngine:
    """One engine serving requests under a local policy, in virtual time."""

    policy: LocalPolicy
    memory_tokens: int = 10_000
    token_budget: int = 2048
    step_time: StepTime = field(default_factory=StepTime)
    admission: Admission = "paged"
    block_size: int = 1
    now: float = 0.0
    name: str = "engine"
    listener: EngineListener | None = None

    def __post_init__(self) -> None:
        require_count("memory_tokens", self.memory_tokens, minimum=1)
        require_count("token_budget", self.token_budget, minimum=1)
        require_count("block_size", self.block_size, minimum=1)
        if self.admission not in ("paged", "reserve"):
            raise ConfigError("admission", f"must be 'paged' or 'reserve', got {self.admission!r}")
        self.cache = RadixTree(on_evict=self._report_eviction)
        self.running: list[Running] = []
        self.completions: list[Completion] = []
        self.steps = 0
        self.busy_time = 0.0
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.preemptions = 0
        self.peak_memory = 0
        self._jobs: dict[str, _Job] = {}
        self._hits: dict[str, int] = {}  # prefix hits looked up during the current step
        self._hit_epoch = 0  # advances whenever `_hits` is forgotten
        self._held = 0  # Σ footprint over running jobs
        self._decode_room = 0  # tokens set aside for this step's decodes (paged)
        self._stalled = False

    # ------------------------------------------------------------------ EngineView

    @property
    def mean_batch_time(self) -> float:
        return self.busy_time / self.steps if self.steps else 0.0

    @property
    def memory_used(self) -> int:
        return len(self.cache) + self._held

    @property
    def memory_in_use(self) -> int:
        """KV tokens running requests need: their locked prefixes and private tokens.
        Unlocked cached prefixes count as free, as vLLM counts its evictable blocks."""
        return self.cache.locked_tokens + self._held

    @property
    def memory_utilization(self) -> float:
        return min(self.memory_in_use / self.memory_tokens, 1.0)

    def cached_tokens(self, request: Request) -> int:
        """Prefix hit of a waiting request, looked up once per step (LPM orders ask often)."""
        hit = self._hits.get(request.request_id)
        if hit is None:
            tokens = self._jobs[request.request_id].tokens
            # The last prompt token is always recomputed, as in vLLM, for the first output.
            hit = min(self.cache.match_length(tokens), max(request.prompt_tokens - 1, 0))
            hit -= hit % self.block_size
            self._hits[request.request_id] = hit
        return hit

    def hit_epoch(self, tenant: str) -> int:
        return self._hit_epoch  # every tenant's hits are forgotten together

    # ------------------------------------------------------------------ requests

    def submit(
        self,
        request: Request,
        tokens: Sequence[int],
        output_tokens: int,
        output_ids: Sequence[int] = (),
    ) -> None:
        """A request arrives now; it will produce `output_tokens` (≤ max_tokens). With 0 it
        is prefill-only (an embedding, as vLLM's pooling requests): it finishes when its
        prompt is computed, charged for the uncached prompt alone. `output_ids`, when
        given, are the ids of the tokens it generates: when it finishes, the full blocks of
        its prompt and generated tokens stay in the prefix cache, as vLLM's do."""
        if len(tokens) != request.prompt_tokens:
            raise ConfigError(
                "tokens", f"has {len(tokens)} ids, but prompt_tokens is {request.prompt_tokens}"
            )
        require_count("output_tokens", output_tokens, minimum=0)
        if self.blocks_for(request.prompt_tokens + request.max_tokens) > self.memory_tokens:
            raise ConfigError(
                "max_tokens",
                f"prompt + max_tokens = {request.prompt_tokens + request.max_tokens} exceeds "
                f"the engine's memory of {self.memory_tokens} tokens "
                f"(in blocks of {self.block_size})",
            )
        target = min(output_tokens, request.max_tokens)
        if output_ids and len(output_ids) < target:
            raise ConfigError("output_ids", f"has {len(output_ids)} ids for {target} output tokens")
        self._jobs[request.request_id] = _Job(request, tokens, target, output_ids)
        self.policy.add(request)
        self._stalled = False

    def abort(self, request_id: str) -> bool:
        """Drop a request (its client went away): a waiting one leaves the policy's queue,
        a running one releases its KV memory and is finished in the policy, keeping what
        it was charged. Prefixes it already put in the cache stay there, unlocked. False
        if the engine does not know the request (never submitted, or already finished)."""
        job = self._jobs.pop(request_id, None)
        if job is None:
            return False
        if job.running is not None:
            self._release(job)
            self.running.remove(job.running)
        self.policy.remove(request_id)
        self._hits.pop(request_id, None)
        self._stalled = False  # the head of the queue may have changed
        return True

    def produced(self, request_id: str) -> int:
        """Output tokens the request has generated so far — what its stream has delivered
        (0 for a request the engine does not hold)."""
        job = self._jobs.get(request_id)
        return 0 if job is None else job.output_done

    def try_admit(self, request: Request, cached_tokens: int) -> Running | None:
        job = self._jobs[request.request_id]
        # After a preemption the generated tokens are recomputed along with the prompt.
        extend = request.prompt_tokens + job.output_done - cached_tokens
        private = extend
        reserved = request.max_tokens - job.output_done if self.admission == "reserve" else 0
        # Lock the hit first, so that making room cannot evict the prefix being reused.
        lock = self.cache.lock(job.tokens[:cached_tokens]) if cached_tokens else None
        if not self._room_in_cache(self.blocks_for(private + reserved)):
            if lock is not None:
                self.cache.unlock(lock)
            return None
        running = Running(
            request,
            output_tokens=job.output_done,
            prefill_remaining=max(extend, 1),
            last_step_end=self.now,
        )
        job.running, job.lock, job.cached = running, lock, cached_tokens
        self._hold(job, private, reserved)
        if job.admitted_at is None:
            job.admitted_at = self.now
        self.running.append(running)
        self.prompt_tokens += request.prompt_tokens
        self.cached_prompt_tokens += cached_tokens
        self._note_memory()
        if self.listener is not None:
            self.listener.admitted(self, request)
        return running

    # ------------------------------------------------------------------ time

    def idle(self) -> bool:
        return not self.running and self.policy.waiting_count == 0

    @property
    def stalled(self) -> bool:
        """Requests wait, nothing runs, and the policy admitted none at the last step:
        nothing changes until another request arrives."""
        return self._stalled and not self.running

    def step(self) -> BatchPlan:
        """Run one iteration; advances `now` by its duration (by nothing if idle)."""
        self._forget_hits()
        if self.admission == "paged":
            self._decode_room = sum(
                self._decode_growth(running) for running in self.running if running.decoding
            )
            self._make_room()
        plan = form_batch(self.policy, self, self.token_budget)
        self._decode_room = 0  # what the plan does not decode is not needed this step
        self._stalled = not plan.decodes and not plan.prefills
        if self._stalled:
            return plan
        duration = self.step_time.duration(plan)
        self.now += duration
        self.steps += 1
        self.busy_time += duration
        for running in plan.decodes:
            self._emit(running, grows=True)
        for running, chunk in plan.prefills:
            running.prefill_remaining -= chunk
            if running.prefill_remaining == 0:
                self._prefill_done(running)
        self._note_memory()
        return plan

    def blocks_for(self, tokens: int) -> int:
        """KV tokens that `tokens` occupy: whole blocks."""
        return -(-tokens // self.block_size) * self.block_size

    def _hold(self, job: _Job, private: int, reserved: int) -> None:
        job.private, job.reserved = private, reserved
        footprint = self.blocks_for(private + reserved)
        self._held += footprint - job.footprint
        job.footprint = footprint

    def _decode_growth(self, running: Running) -> int:
        """Room the next decode of `running` needs: a new block when its last is full."""
        job = self._jobs[running.request_id]
        return self.blocks_for(job.private + 1) - job.footprint

    def _room_in_cache(self, tokens: int) -> bool:
        """Is there room for `tokens` more (beyond this step's decodes), after evicting
        unlocked cached prefixes if needed?"""
        need = self.memory_used + self._decode_room + tokens
        if need > self.memory_tokens:
            self.cache.evict_lru(need - self.memory_tokens)
        return self.memory_used + self._decode_room + tokens <= self.memory_tokens

    def _make_room(self) -> None:
        """Room for this step's decodes: evict cached prefixes, then preempt as the
        policy orders."""
        while not self._room_in_cache(0) and self.running:
            for running in self.policy.preemption_order(self.running):
                self._preempt(running)
                if self._room_in_cache(0) and not self.policy.preempt_all:
                    return

    def _preempt(self, running: Running) -> None:
        job = self._jobs[running.request_id]
        if running.decoding:
            self._decode_room -= self._decode_growth(running)
        self._release(job)
        self.running.remove(running)
        job.running = None
        job.preemptions += 1
        self.preemptions += 1
        self.policy.preempt(running.request_id)
        if self.listener is not None:
            self.listener.preempted(self, running.request)

    def _release(self, job: _Job) -> None:
        self._hold(job, 0, 0)
        if job.lock is not None:
            self.cache.unlock(job.lock)
            job.lock = None

    def _prefill_done(self, running: Running) -> None:
        job = self._jobs[running.request_id]
        # The prompt's full blocks move into the shared cache; the partial last block and
        # generated tokens stay private.
        prompt = running.request.prompt_tokens
        shared = prompt - prompt % self.block_size
        self._hold(job, job.private - (shared - job.cached), job.reserved)
        if shared:
            self.cache.insert(job.tokens[:shared], CACHE_OWNER)
        if job.lock is not None:
            self.cache.unlock(job.lock)
        job.lock = self.cache.lock(job.tokens[:shared]) if shared else None
        if job.output_target == 0:  # prefill-only: its result is ready, no token follows
            job.first_token_at = job.last_token_at = self.now
            self._finish(job)
            return
        self._emit(running, grows=False)  # a prefill (or a recompute) yields the next token

    def _emit(self, running: Running, grows: bool) -> None:
        """One more output token. A decode step `grows` the KV by the token it read (the
        previous one); the prefill's token adds none, so a request with prompt s and o
        outputs peaks at s + o − 1 tokens, as in vLLM. In reserve mode the room was set
        aside at admission."""
        request_id = running.request.request_id
        job = self._jobs[request_id]
        now = self.now
        running.output_tokens += 1
        job.output_done = running.output_tokens
        if job.first_token_at is None:
            job.first_token_at = now
        else:  # time between tokens, across preemptions too
            job.token_gaps.append(now - job.last_token_at)
        job.last_token_at = running.last_step_end = now
        if self.admission == "reserve":
            # Reserved room becomes used room: memory use is unchanged.
            self._hold(job, job.private + 1, job.reserved - 1)
        elif grows:
            self._hold(job, job.private + 1, 0)
        self.policy.record_output(request_id, 1)
        if running.output_tokens >= job.output_target:
            self._finish(job)

    def _finish(self, job: _Job) -> None:
        running = job.running
        assert running is not None and job.admitted_at is not None
        assert job.first_token_at is not None
        self.policy.finish(running.request_id)
        self.running.remove(running)
        self._release(job)
        self._cache_generated(job)
        del self._jobs[running.request_id]
        completion = Completion(
            job.request,
            job.cached,
            running.output_tokens,
            job.admitted_at,
            job.first_token_at,
            self.now,
            job.preemptions,
            job.token_gaps,
        )
        self.completions.append(completion)
        if self.listener is not None:
            self.listener.finished(self, completion)

    def _cache_generated(self, job: _Job) -> None:
        """A finished request's KV — its prompt and every generated token but the last,
        whose KV is never computed — stays in the cache in full blocks, when the ids of
        what it generated are known. Its private blocks were just released, so the room
        is there."""
        if not job.output_ids:
            return
        computed = job.request.prompt_tokens + job.output_done - 1
        shared = computed - computed % self.block_size
        if shared > job.request.prompt_tokens - job.request.prompt_tokens % self.block_size:
            ids = list(job.tokens) + list(job.output_ids[: job.output_done - 1])
            self.cache.insert(ids[:shared], CACHE_OWNER)

    def _note_memory(self) -> None:
        """Track the peak of what running requests hold (evictable cache excluded)."""
        self.peak_memory = max(self.peak_memory, self.memory_in_use)

    def _forget_hits(self) -> None:
        self._hits.clear()
        self._hit_epoch += 1

    def _report_eviction(self, tokens: Sequence[int], keep: int, owners: object) -> None:
        self._forget_hits()  # hits looked up earlier this step may have just been evicted
        if self.listener is not None:
            self.listener.evicted(self, tokens, keep)
