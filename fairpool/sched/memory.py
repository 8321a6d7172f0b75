"""Memory-safe admission: never let KV memory overflow at a future completion time.

Jaillet, Jiang, Podimata, Zhou, "Online Scheduling for LLM Inference with KV Cache
Constraints" (arXiv 2502.07115 v1), §4, Eq. (1) and Algorithm 2 (called MC-SF,
"memory-constrained shortest first", in later versions). A set of running requests plus
candidates is feasible iff, for every future step τ,

    Σ_{j still running at τ} (held_j + τ) ≤ M,

where held_j is the KV tokens request j holds now and it keeps growing by one token per
step until it has produced its predicted output. Memory only peaks when some request
completes, so checking τ at the completion steps suffices (the paper's checkpoint lemma);
unlike the paper's listing we include the candidate's own completion step, without which
the check is wrong (reference digest §A.2).

Counting convention: a request with r tokens still to generate holds held + τ at every
τ ≤ r, including τ = r (the paper's Eq. (1), "Convention E1"): one token more than a
vLLM-style engine stores, so the check errs on the safe side.

Blocks (beyond the paper, which counts tokens): engines allocate KV a block of B tokens at
a time, so a request holding h tokens occupies up to h + B − 1. The check counts that: at
each step, B − 1 more for every request still running. Peaks are still at completion
steps (usage only grows between them), and the bound is safe, so an admitted set never
makes a block-allocating engine preempt either; counted in plain tokens it could (vLLM's
16-token blocks made the "never preempts" policy preempt 11 times in one run).

Output lengths are not known in advance; a predictor gives them (default: the request's
`max_tokens`, which makes the check a guarantee rather than an estimate).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from fairpool.sched.errors import ConfigError, require_count
from fairpool.sched.requests import EngineView, Request, Running

OutputPredictor = Callable[[Request], int]


def predict_max_tokens(request: Request) -> int:
    return request.max_tokens


def projected_peak(demands: Iterable[tuple[int, int]], block_size: int = 1) -> int:
    """Largest future KV usage of requests given as (tokens held now, tokens still to come),
    each rounding its tokens up to whole blocks of `block_size` (counted as B − 1 more).

    Sweeps completion steps from the last to the first, keeping the held tokens and the
    count of requests still running at each: O(n log n).
    """
    ordered = sorted(demands, key=lambda demand: demand[1], reverse=True)
    peak = 0
    held = 0
    count = 0
    index = 0
    while index < len(ordered):
        step = ordered[index][1]
        while index < len(ordered) and ordered[index][1] == step:
            held += ordered[index][0]
            count += 1
            index += 1
        peak = max(peak, held + (step + block_size - 1) * count)
    return peak


def remaining_output(running: Running, predictor: OutputPredictor) -> int:
    return max(predictor(running.request) - running.output_tokens, 0)


def admission_is_memory_safe(
    view: EngineView, candidate: Request, predictor: OutputPredictor = predict_max_tokens
) -> bool:
    """Would admitting `candidate` keep every future completion step within M?"""
    demands = [(r.held_tokens, remaining_output(r, predictor)) for r in view.running]
    demands.append((candidate.prompt_tokens, predictor(candidate)))
    return projected_peak(demands, view.block_size) <= view.memory_tokens


def semi_online_schedule(
    outputs: Sequence[int], prompt: int, memory: int, block_size: int = 1
) -> list[int]:
    """Algorithm 1 of the same paper (§4, "Semi-Online Scheduling and Batching"): every
    request arrives at round 0 with prompt size `prompt` and known output length
    `outputs[i]`; returns the round p_i at which each one starts.

    Each round, the running requests go on, and the waiting ones are admitted in ascending
    output length (ties: lower index), each while the check of Eq. (1) — the same
    `projected_peak` that memory-safe admission (Algorithm 2, the `mcsf` policy) runs —
    still holds; the pass stops at the first that fails. Convention E1: a request started
    at p holds prompt + k at rounds p + k, k = 0..o, and completes at c = p + o, so the
    total end-to-end latency is Σ (p_i + o_i).
    """
    require_count("prompt", prompt)
    require_count("memory", memory, minimum=1)
    require_count("block_size", block_size, minimum=1)
    for index, length in enumerate(outputs):
        require_count(f"outputs[{index}]", length, minimum=1)
        if projected_peak([(prompt, length)], block_size) > memory:
            raise ConfigError(
                f"outputs[{index}]", f"needs more than memory {memory} even when run alone"
            )
    order = sorted(range(len(outputs)), key=lambda index: (outputs[index], index))
    starts: list[int] = [0] * len(outputs)
    running: list[int] = []  # indices started and still holding memory
    waiting = 0  # position in `order` of the next request to admit
    round_ = 0
    while waiting < len(order):
        running = [i for i in running if round_ - starts[i] <= outputs[i]]
        demands = [
            (prompt + round_ - starts[i], outputs[i] - (round_ - starts[i])) for i in running
        ]
        while waiting < len(order):
            candidate = order[waiting]
            if projected_peak([*demands, (prompt, outputs[candidate])], block_size) > memory:
                break
            demands.append((prompt, outputs[candidate]))
            starts[candidate] = round_
            running.append(candidate)
            waiting += 1
        round_ += 1
    return starts
