"""One continuous-batching step: which decodes and prefill chunks run, and who is admitted.

The same function forms every step of the simulator and of the simulated engine, so a
policy behaves the same in both. The shape is vLLM's and Sarathi-Serve's (running work
first, then new admissions under a token budget, chunked prefill), with SLAI's two hooks:
decodes the policy defers run after prefills, only if the budget leaves room
(Bari et al. §6, steps 1-4). A policy whose batches never mix phases (RAD, Bari et al.
§4.2, Algorithm 1: `mixes_phases = False`) has its deferred decodes run only in a step
with no prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fairpool.sched.errors import require_count
from fairpool.sched.policy import LocalPolicy
from fairpool.sched.requests import EngineView, Request, Running


class BatchingEngine(EngineView, Protocol):
    def try_admit(self, request: Request, cached_tokens: int) -> Running | None:
        """Allocate KV memory and start `request`; None if it does not fit now."""
        ...


@dataclass
class BatchPlan:
    decodes: list[Running] = field(default_factory=list)
    prefills: list[tuple[Running, int]] = field(default_factory=list)  # (request, chunk)
    admitted: list[Running] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return len(self.decodes) + sum(chunk for _, chunk in self.prefills)


def mixes_phases(policy: LocalPolicy | type[LocalPolicy]) -> bool:
    """Whether a step of `policy` may hold prefill chunks and decodes together: every
    policy's may unless it sets `mixes_phases = False`."""
    return bool(getattr(policy, "mixes_phases", True))


def form_batch(
    policy: LocalPolicy, engine: BatchingEngine, token_budget: int, max_decodes: int | None = None
) -> BatchPlan:
    """Plan one step. The policy's own limits (SLAI's τ and β) override the engine's."""
    budget = policy.token_budget or require_count("token_budget", token_budget, minimum=1)
    decode_cap = policy.max_decodes or max_decodes
    plan = BatchPlan()
    due, deferred = policy.split_decodes(engine)

    def add_decodes(candidates: list[Running]) -> None:
        room = budget - plan.tokens  # a decode is one token
        if decode_cap is not None:
            room = min(room, decode_cap - len(plan.decodes))
        plan.decodes.extend(candidates[: max(room, 0)])

    add_decodes(due)
    for running in engine.running:
        if running.prefill_remaining and plan.tokens < budget:
            plan.prefills.append((running, min(running.prefill_remaining, budget - plan.tokens)))
    while plan.tokens < budget:
        request = policy.next_request(engine)
        if request is None:
            break
        cached = engine.cached_tokens(request)
        started = engine.try_admit(request, cached)
        if started is None:
            break  # head-of-line: the pass stops at the first request that does not fit
        policy.admit(request.request_id, cached)
        plan.admitted.append(started)
        if started.prefill_remaining:
            plan.prefills.append((started, min(started.prefill_remaining, budget - plan.tokens)))
    if not plan.prefills or mixes_phases(policy):
        add_decodes(deferred)
    return plan
