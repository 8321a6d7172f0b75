"""RAD's throughput theorems in the simulator's step-time model, and the queue they bound.

Bari, Hegde, de Veciana, "Optimal Scheduling Algorithms for LLM Inference: Theory and
Practice", §4.3. Theorem 2: with r nodes fed at random by a Poisson process of rate λ,
i.i.d. bounded lengths and λ·T̄^R ≤ r(1 − ε), RAD with
n > (t*_col − 1)·T^max / (ε·T̄^R) keeps every node's number of pending requests Q(t) a
positive-recurrent regenerative process. Conversely a node cannot finish requests
faster than one per T̄^R of its own work, so above λ = r / T̄^R its queue grows linearly
(the argument of Theorem 1).

The paper's T̄^R is a request's share of optimally tiled batches under its GeMM cost model
(Eq. 7). Our engines' step time is linear (`StepTime`): base + per prefill token + per
decode + per context token read. The same argument gives, per request j of prompt L^P and
L^D output tokens (the prefill yields the first; decode k reads L^P + k tokens of KV):

    T*_R(j) = ⌈L^P / t*_lcm⌉·base + per_prefill_token·L^P
              + (L^D − 1)·(base / t*_col + per_decode)
              + per_context_token·Σ_{k=1}^{L^D−1} (L^P + k)

— its prefill chunks alone, and its share of decode batches of t*_col. RAD's decode
batches never hold more than t*_col requests, and its prefill chunks are never larger
than t*_lcm, so each request costs RAD at least T*_R(j): the bound is tight for RAD (and
for RAD only: a scheduler with larger batches shares `base` more widely). T^max is a
request of maximum lengths served alone (t*_col = 1), which bounds what a partly filled
batch costs per request in it, as in App. C.2.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairpool.sched.errors import require_count, require_positive
from fairpool.sched.registry import make_policy
from fairpool.sched.requests import Request
from fairpool.sim.engine import SimEngine, StepTime


def request_time(step: StepTime, prompt: int, output: int, chunk: int, decode_batch: int) -> float:
    """T*_R(j): the engine time one request takes in RAD's batch shape (module docstring)."""
    require_count("prompt", prompt, minimum=1)
    require_count("output", output, minimum=1)
    require_count("chunk", chunk, minimum=1)
    require_count("decode_batch", decode_batch, minimum=1)
    decodes = output - 1
    context = decodes * prompt + decodes * (decodes + 1) // 2
    return (
        math.ceil(prompt / chunk) * step.base
        + step.per_prefill_token * prompt
        + decodes * (step.base / decode_batch + step.per_decode)
        + step.per_context_token * context
    )


def budget_request_time(step: StepTime, prompt: int, output: int, budget: int) -> float:
    """The least engine time one request can take under any scheduler whose steps hold at
    most `budget` tokens (Sarathi-Serve's τ): each of its L^P + L^D − 1 tokens shares a
    step's `base` with at most `budget` − 1 others. Theorem 1's argument, for our model."""
    require_count("budget", budget, minimum=1)
    shared = request_time(step, prompt, output, chunk=prompt, decode_batch=1) - step.base * output
    return shared + step.base * (prompt + output - 1) / budget


def mean_time(
    lengths: Iterable[tuple[int, int, float]], time: Callable[[int, int], float]
) -> float:
    """E[time(L^P, L^D)]: `lengths` is the joint distribution, (prompt, output, probability).
    T̄^R is `mean_time(lengths, lambda p, o: request_time(step, p, o, chunk, t_col))`."""
    pairs = list(lengths)
    total = sum(probability for _, _, probability in pairs)
    require_positive("lengths", total)
    return sum(p * time(prompt, output) for prompt, output, p in pairs) / total


def min_cycle_requests(decode_batch: int, t_max: float, t_bar: float, epsilon: float) -> int:
    """The smallest n with n > (t*_col − 1)·T^max / (ε·T̄^R) (Theorem 2)."""
    require_count("decode_batch", decode_batch, minimum=1)
    require_positive("t_max", t_max)
    require_positive("t_bar", t_bar)
    require_positive("epsilon", epsilon)
    return math.floor((decode_batch - 1) * t_max / (epsilon * t_bar)) + 1


@dataclass(frozen=True)
class Arrival:
    """An open-loop request: when it arrives, its prompt's token ids and its output."""

    time: float
    request: Request
    tokens: Sequence[int]
    output_tokens: int


def pending_at(engine: SimEngine, arrivals: Sequence[Arrival], times: Sequence[float]) -> list[int]:
    """Serve `arrivals` (sorted by time) and return Q(t), the requests arrived and not
    finished, at the end of the first step that ends at or after each of `times`."""
    samples: list[int] = []
    submitted = 0
    for sample in times:
        while True:
            while submitted < len(arrivals) and arrivals[submitted].time <= engine.now:
                arrival = arrivals[submitted]
                engine.submit(arrival.request, arrival.tokens, arrival.output_tokens)
                submitted += 1
            if engine.now >= sample:
                break
            if engine.idle() or engine.stalled:  # nothing runs until the next arrival
                upcoming = arrivals[submitted].time if submitted < len(arrivals) else sample
                engine.now = min(max(upcoming, engine.now), sample)
                continue
            engine.step()
        samples.append(submitted - len(engine.completions))
    return samples


@dataclass(frozen=True)
class StabilityExperiment:
    """Theorem 2 on one node (r = 1), as the tests and `make reproduce` run it: Poisson
    arrivals with prompts drawn uniformly from `prompts` (multiples of t*_lcm, Assumption
    3) and outputs from `outputs`, RAD with tiles giving t*_lcm = `chunk` and t*_col =
    `decode_batch` and n from the theorem for `epsilon`, against Sarathi-Serve with the
    same per-step token budget. Memory holds t*_col requests at maximum lengths
    (Assumption 4)."""

    step: StepTime = field(default_factory=StepTime)
    prompts: tuple[int, ...] = (16, 32, 48, 64)
    outputs: tuple[int, ...] = tuple(range(1, 25))
    chunk: int = 16
    decode_batch: int = 4
    epsilon: float = 0.3
    memory_tokens: int = 10_000

    @property
    def lengths(self) -> list[tuple[int, int, float]]:
        return [(prompt, output, 1.0) for prompt in self.prompts for output in self.outputs]

    @property
    def t_bar(self) -> float:
        """T̄^R: the mean engine time of a request in RAD's batch shape."""
        return mean_time(
            self.lengths, lambda p, o: request_time(self.step, p, o, self.chunk, self.decode_batch)
        )

    @property
    def t_max(self) -> float:
        return request_time(self.step, max(self.prompts), max(self.outputs), self.chunk, 1)

    @property
    def rad_capacity(self) -> float:
        """r / T̄^R, requests/s."""
        return 1 / self.t_bar

    @property
    def sarathi_capacity(self) -> float:
        """What no scheduler with steps of at most `chunk` tokens can exceed (Theorem 1's
        argument), requests/s."""
        return 1 / mean_time(
            self.lengths, lambda p, o: budget_request_time(self.step, p, o, self.chunk)
        )

    @property
    def cycle(self) -> int:
        """The n Theorem 2 asks for."""
        return min_cycle_requests(self.decode_batch, self.t_max, self.t_bar, self.epsilon)

    def policy_params(self, policy: str) -> dict[str, Any]:
        if policy == "rad":
            tiles = {"tile_rows": self.chunk, "tile_cols": self.decode_batch}
            return {**tiles, "tile_red": self.chunk, "cycle_requests": self.cycle}
        return {"token_budget": self.chunk}

    def arrivals(self, rate: float, horizon: float, seed: int) -> list[Arrival]:
        """A Poisson process of `rate` over [0, horizon) with i.i.d. lengths; prompts that
        share nothing (no prefix hits to blur the work per request)."""
        rng = random.Random(seed)
        arrivals: list[Arrival] = []
        time = rng.expovariate(rate)
        while time < horizon:
            prompt, output = rng.choice(self.prompts), rng.choice(self.outputs)
            index = len(arrivals)
            request = Request(f"r{index}", "a", prompt, output, arrival=time)
            tokens = list(range(index * 100_000, index * 100_000 + prompt))
            arrivals.append(Arrival(time, request, tokens, output))
            time += rng.expovariate(rate)
        return arrivals

    def queue(
        self, policy: str, load: float, horizon: float, seed: int, samples: int
    ) -> tuple[list[int], int]:
        """Q(t) at `samples` equally spaced times of a run at `load` × RAD's capacity, and
        the number of arrivals."""
        engine = SimEngine(
            make_policy(policy, **self.policy_params(policy)),
            memory_tokens=self.memory_tokens,
            step_time=self.step,
        )
        arrivals = self.arrivals(load * self.rad_capacity, horizon, seed)
        times = [horizon * (k + 1) / samples for k in range(samples)]
        return pending_at(engine, arrivals, times), len(arrivals)
