"""The simulated engine in wall-clock time: one asyncio task steps a `SimEngine`.

Each step takes the model time the engine's cost model gives it; the loop then sleeps
until wall time × `speedup` reaches the engine's clock. A wake-up that comes a little
late (the event loop was writing to clients) is made up by shorter sleeps, so steps keep
the model's cadence; but the engine's clock never trails wall time × speedup by more
than `max_lag` wall seconds: after an idle spell, or when the host cannot keep up, it
jumps ahead, and latencies include the host's lag. Each step's new
tokens go to their requests' `Generation` as they are produced; a client that reads
slower than the engine generates gets them several at a time, as vLLM's streams do.

Every step also applies a changed scheduler configuration (`LiveScheduler`) and brings
the metrics up to date; while idle, the loop still checks the configuration and
exports the metrics once per `idle_check` seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable, Sequence

from fairpool.runtime import wait_at_most
from fairpool.sched.requests import Request, Running
from fairpool.sim.engine import Completion, SimEngine
from fairpool_engine.live import LiveScheduler
from fairpool_engine.sim.metrics import EngineMetrics

IDLE_CHECK = 0.25  # seconds between configuration checks while idle
MAX_LAG = 0.02  # wall seconds the engine's clock may trail the wall clock, busy


class Generation:
    """One request's output as the engine produces it, for the client's handler."""

    def __init__(self, request: Request, output_target: int) -> None:
        self.request = request
        self.output_target = output_target  # tokens it will produce (≤ max_tokens)
        self.generated = 0
        self.finished = False
        self.cached_tokens = 0  # prefix-cache hit at its (latest) admission, once finished
        self.last_token_at: float | None = None  # model time
        self._changed = asyncio.Event()

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def finish_reason(self) -> str:
        return "length" if self.output_target == self.request.max_tokens else "stop"

    async def wait(self) -> None:
        """Until tokens arrived or the request finished since the last call."""
        await self._changed.wait()
        self._changed.clear()

    def add_tokens(self, count: int) -> None:
        self.generated += count
        self._changed.set()

    def finish(self, cached_tokens: int) -> None:
        self.cached_tokens = cached_tokens
        self.finished = True
        self._changed.set()


class EngineRunner:
    """Owns the engine: requests go in through `submit` and `abort`, `run` steps it."""

    def __init__(
        self,
        engine: SimEngine,
        live: LiveScheduler,
        metrics: EngineMetrics,
        speedup: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        idle_check: float = IDLE_CHECK,
        max_lag: float = MAX_LAG,
    ) -> None:
        self.engine, self.live, self.metrics = engine, live, metrics
        self.speedup, self.idle_check = speedup, idle_check
        self.max_lag = max_lag * speedup  # in model seconds
        engine.policy = live.policy
        engine.listener = self
        self._clock = clock
        self._started = clock()
        self._generations: dict[str, Generation] = {}
        self._finished: list[Completion] = []
        self._wake = asyncio.Event()
        self._ids = itertools.count()

    # ------------------------------------------------------------------ requests

    def now(self) -> float:
        """Model time: the engine's clock, or a little behind wall time × speedup if that
        is later (never after the start of the engine's next step)."""
        return max(self.engine.now, self._wall() - self.max_lag)

    def _wall(self) -> float:
        return (self._clock() - self._started) * self.speedup

    def submit(
        self, flow: str, tokens: Sequence[int], max_tokens: int, output_tokens: int
    ) -> Generation:
        """Queue a request in `flow` (`LiveScheduler.flow_of`); it produces
        `output_tokens` (≤ `max_tokens`) tokens, or none (prefill-only: an embedding)."""
        request_id = f"sim-{next(self._ids)}"
        arrival = self.now()
        request = Request(request_id, flow, len(tokens), max_tokens, arrival, tokens=tokens)
        self.engine.submit(request, tokens, output_tokens)
        generation = Generation(request, min(output_tokens, max_tokens))
        self._generations[request_id] = generation
        self._wake.set()
        return generation

    def abort(self, generation: Generation) -> None:
        """Forget a request whose client went away (no-op once it has finished)."""
        if self._generations.pop(generation.request_id, None) is not None:
            self.engine.abort(generation.request_id)
            self._wake.set()

    @property
    def in_flight(self) -> int:
        return len(self._generations)

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        engine = self.engine
        while True:
            if self.live.maybe_reload():
                engine.policy = self.live.policy
            if engine.idle() or engine.stalled:
                self.metrics.observe_engine(engine, self.live, force=True)
                self._wake.clear()
                await wait_at_most(self._wake, self.idle_check)
                engine.now = self.now()  # an idle engine's clock catches up at once
                continue
            engine.now = self.now()
            plan = engine.step()
            self._deliver(itertools.chain(plan.decodes, (running for running, _ in plan.prefills)))
            self.metrics.observe_engine(engine, self.live)
            await asyncio.sleep(max(engine.now - self._wall(), 0.0) / self.speedup)

    def _deliver(self, advanced: Iterable[Running]) -> None:
        now = self.engine.now
        for running in advanced:
            generation = self._generations.get(running.request_id)
            if generation is None or running.output_tokens <= generation.generated:
                continue  # aborted, or a prefill chunk that yields no token yet
            request = generation.request
            if generation.last_token_at is None:
                self.metrics.first_token(request.prompt_tokens, now - request.arrival)
                gap = None
            else:
                gap = now - generation.last_token_at
            self.metrics.tokens(running.output_tokens - generation.generated, gap)
            generation.last_token_at = now
            generation.add_tokens(running.output_tokens - generation.generated)
        for completion in self._finished:
            generation = self._generations.pop(completion.request.request_id)
            request = completion.request
            if generation.output_target == 0:  # prefill-only: its result is its first output
                self.metrics.first_token(request.prompt_tokens, now - request.arrival)
            self.metrics.finished(
                generation.finish_reason,
                now - request.arrival,
                completion.admitted_at - request.arrival,
            )
            generation.finish(completion.cached_tokens)
        self._finished.clear()
        self.engine.completions.clear()  # a server runs indefinitely: keep no history

    # ------------------------------------------------------------------ EngineListener

    def admitted(self, engine: SimEngine, request: Request) -> None:
        pass

    def preempted(self, engine: SimEngine, request: Request) -> None:
        pass

    def finished(self, engine: SimEngine, completion: Completion) -> None:
        self._finished.append(completion)

    def evicted(self, engine: SimEngine, tokens: Sequence[int], keep: int) -> None:
        pass
