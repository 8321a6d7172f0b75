"""RAD, the Resource-Aware Dynamic scheduler.

Bari, Hegde, de Veciana, "Optimal Scheduling Algorithms for LLM Inference: Theory and
Practice", §4.2, Algorithm 1; throughput optimal by Theorem 2 (§4.3, proof in App. C).

RAD works in *cycles* of at most n started requests and never mixes phases in a batch.
Before each batch (Algorithm 1, lines 6-18):

- a *decode batch* — one decode iteration of every decode-phase request, nothing else —
  when t*_col requests are decoding, or nobody waits for a prefill, or n requests have
  started in this cycle. When no request is left decoding the cycle ends (line 9);
- otherwise a *prefill batch*: the first waiting request (FCFS) alone, in chunks of
  t*_lcm = LCM(t*_row, t*_col, t*_red) tokens, one batch per chunk, until its prompt is
  done (lines 11-16); it then decodes with the others (lines 17-18).

So at most t*_col requests are active (Assumption 4 sizes memory for them).

How the paper's model maps onto ours (`fairpool.sched.form_batch`, the engine that runs
it, e.g. `fairpool.sim.engine`):

- A batch is `form_batch`'s step. RAD asks for it through the hooks every policy has:
  `split_decodes` gives the decode set of a decode batch, `next_request` the one request a
  prefill batch starts, and the step's token budget is t*_lcm, so a prefill batch is one
  chunk of one request. `mixes_phases = False` keeps `form_batch` from topping a prefill
  batch up with decodes; where a prefill batch would be empty (the engine cannot fit the
  request, or memory-safe admission holds it back, which the paper's memory-unbounded
  model never does) the step decodes instead, so decodes keep freeing memory.
- Starting a request is admitting it: `requests_in_cycle` counts admissions. Admission
  is where our engine allocates the prompt's KV, the start of the paper's prefill phase.
- The cycle ends when nothing is active at the start of a step: the paper's line 9 after
  a decode batch empties 𝒟, and also after a prefill batch whose request ended with its
  first token (our engine finishes a request whose output is one token at its prefill;
  the paper would carry it in 𝒟 to the next decode batch).
- The prompt chunked is what the prefix cache does not hold (the paper has no cache) and,
  after a preemption, the prompt with the tokens generated so far: our engine recomputes
  them. With Assumption 4 (memory for t*_col requests at their maximum lengths) nothing is
  ever preempted.
- The tile sizes decide only the batch shape here: our step-time model is linear in the
  tokens of a step (`fairpool.sim.engine.StepTime`), with no tiling staircase, so what
  RAD's shape buys in the simulator is the per-step cost shared by t*_col decodes.
  Theorem 2 still holds there with T̄^R computed for that model
  (`fairpool.sim.stability`).
"""

from __future__ import annotations

import math
from typing import Any

from fairpool.sched.errors import require_count
from fairpool.sched.policies.fcfs import FCFS
from fairpool.sched.policy import Waiting
from fairpool.sched.requests import EngineView, Running


class RAD(FCFS):
    """Cycles of n requests; decode batches of t*_col, prefill batches of one t*_lcm chunk."""

    name = "rad"
    #: A batch is either decodes or one prefill chunk, never both (`form_batch`).
    mixes_phases = False

    def __init__(
        self,
        cycle_requests: int = 1024,
        tile_rows: int = 256,
        tile_cols: int = 128,
        tile_red: int = 32,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        #: n: requests started per cycle (Theorem 2 asks n > (t*_col − 1)·T^max / (ε·T̄^R)).
        self.cycle_requests = require_count("cycle_requests", cycle_requests, minimum=1)
        self.tile_rows = require_count("tile_rows", tile_rows, minimum=1)
        self.tile_cols = require_count("tile_cols", tile_cols, minimum=1)
        self.tile_red = require_count("tile_red", tile_red, minimum=1)
        #: t*_lcm: the prefill chunk, and so the token budget of every step.
        self.prefill_chunk = math.lcm(self.tile_rows, self.tile_cols, self.tile_red)
        self.token_budget = self.prefill_chunk
        self.requests_in_cycle = 0

    def decode_batch(self, view: EngineView) -> bool:
        """Line 6: whether the next batch decodes (True) or prefills (False). A prefill
        under way always continues (lines 12-16): the caller checks that first."""
        decoding = sum(1 for running in view.running if running.decoding)
        if not view.running:
            self.requests_in_cycle = 0  # line 9: 𝒟 is empty, a new cycle starts
        return (
            decoding >= self.tile_cols
            or self.waiting_count == 0
            or self.requests_in_cycle >= self.cycle_requests
        )

    def split_decodes(self, view: EngineView) -> tuple[list[Running], list[Running]]:
        decoding = [running for running in view.running if running.decoding]
        if _prefilling(view) or not self.decode_batch(view):
            return [], decoding  # decoded only if the step has no prefill (mixes_phases)
        return decoding, []

    def _select(self, view: EngineView) -> Waiting | None:
        if _prefilling(view) or self.decode_batch(view):
            return None  # one request's prefill at a time, and none in a decode batch
        return super()._select(view)

    def admit(self, request_id: str, cached_tokens: int = 0) -> float:
        service = super().admit(request_id, cached_tokens)
        self.requests_in_cycle += 1  # line 18 (a started prefill always completes)
        return service


def _prefilling(view: EngineView) -> bool:
    return any(not running.decoding for running in view.running)
