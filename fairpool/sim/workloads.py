"""Workload generators: the papers' evaluation workloads as traces (`list[TraceRequest]`).

Every generator takes `duration` (requests arrive in [0, duration) seconds) and `seed`,
plus its own parameters whose defaults come from the papers, and returns requests sorted
by arrival. The same arguments always give the same trace; each tenant draws from its own
random stream, so changing one tenant's parameters leaves the others' arrivals alone.
Arrival times are rounded to microseconds, the trace format's precision, so a trace
survives `write_trace`/`read_trace` unchanged.

Segment names always start with the tenant (`c0/doc3`), so tenants never share a prefix;
inside a tenant a name is reused exactly where the workload shares tokens. Where a paper
leaves a number out, the default is our choice and the docstring says so.

Sources: [VTC] Sheng et al., *Fairness in Serving Large Language Models* (OSDI'24) and
its artifact; [DLPM] Cao et al., *Locality-aware Fair Scheduling in LLM Serving*;
[KV] Jaillet et al., *Online Scheduling for LLM Inference with KV Cache Constraints* (v1);
[RAD] Bari et al., *Optimal Scheduling Algorithms for LLM Inference: Theory and Practice*.

`generate(name, duration, seed, **params)` runs one by name and checks the parameters.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from fairpool.sched.errors import (
    ConfigError,
    require_count,
    require_non_negative,
    require_number,
    require_positive,
)
from fairpool.sched.requests import SLO
from fairpool.sim.trace import Segment, TraceRequest

Workload = Callable[..., list[TraceRequest]]

# The weights of [VTC] Fig. 16. A trace carries no weights: give these to the scheduler
# (the tenants file) when replaying `vtc_weighted`.
VTC_WEIGHTED_WEIGHTS: dict[str, float] = {"c1": 1.0, "c2": 2.0, "c3": 3.0, "c4": 4.0}

_Z90 = 1.2815515655446004  # standard normal 90th percentile


# --- random streams, arrival processes and length distributions ------------------------


def stream(seed: int, *labels: object) -> random.Random:
    """An independent random stream for one purpose (e.g. one tenant's arrivals)."""
    return random.Random(":".join(str(part) for part in (seed, *labels)))


def uniform_arrivals(
    rate: float, start: float, end: float, rng: random.Random | None = None
) -> list[float]:
    """Evenly spaced arrivals at `rate`/s in [start, end). With `rng`, the first one comes
    at a random phase within the first gap, as in the [VTC] artifact."""
    gap = 1.0 / rate
    first = start + (rng.random() * gap if rng is not None else 0.0)
    count = max(0, math.ceil((end - first) / gap)) + 1
    return [time for time in (first + index * gap for index in range(count)) if time < end]


def gamma_arrivals(
    rate: float, start: float, end: float, rng: random.Random, cv: float = 1.0
) -> list[float]:
    """A renewal process with Gamma gaps of mean 1/rate and coefficient of variation `cv`
    (the S-LoRA/[VTC]/[DLPM] arrival model); cv = 1 is Poisson, cv < 1 is more regular."""
    shape, scale = 1.0 / (cv * cv), cv * cv / rate
    times = []
    time = start + rng.gammavariate(shape, scale)
    while time < end:
        times.append(time)
        time += rng.gammavariate(shape, scale)
    return times


def poisson_arrivals(rate: float, start: float, end: float, rng: random.Random) -> list[float]:
    return gamma_arrivals(rate, start, end, rng, cv=1.0)


def on_off(times: Iterable[float], on: float, off: float, start: float = 0.0) -> list[float]:
    """The arrivals that fall in ON windows [start + k(on+off), start + k(on+off) + on)."""
    period = on + off
    return [time for time in times if (time - start) % period < on]


def lognormal_length(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    """A heavy-tailed length in [1, cap]: lognormal with the given median and sigma."""
    return max(1, min(cap, round(rng.lognormvariate(math.log(median), sigma))))


def sigma_for_mean(median: float, mean: float) -> float:
    """The lognormal sigma whose mean is `mean` when its median is `median`."""
    return math.sqrt(2.0 * math.log(mean / median))


def sigma_for_p90(median: float, p90: float) -> float:
    """The lognormal sigma whose 90th percentile is `p90` when its median is `median`."""
    return math.log(p90 / median) / _Z90


# --- parameter checks (each names the parameter) ---------------------------------------


def _check_common(duration: object, seed: object) -> float:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("seed", f"must be an integer, got {seed!r}")
    return require_positive("duration", duration)


def _positive_list(parameter: str, values: object) -> list[float]:
    if not isinstance(values, list | tuple) or not values:
        raise ConfigError(parameter, f"must be a non-empty list of numbers, got {values!r}")
    return [require_positive(f"{parameter}[{index}]", value) for index, value in enumerate(values)]


def _fraction(parameter: str, value: object) -> float:
    number = require_number(parameter, value)
    if not 0.0 <= number <= 1.0:
        raise ConfigError(parameter, f"must be between 0 and 1, got {value!r}")
    return number


def _choice(parameter: str, value: object, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(parameter, f"must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


# --- building requests --------------------------------------------------------------------


def _request(
    time: float,
    tenant: str,
    segments: Iterable[Segment],
    output_tokens: int,
    max_tokens: int | None = None,
    slo: SLO | None = None,
    output_segment: str | None = None,
) -> TraceRequest:
    output_tokens = max(1, output_tokens)
    return TraceRequest(
        round(time, 6),
        tenant,
        tuple(segments),
        output_tokens,
        max(output_tokens, max_tokens or 0),
        slo,
        output_segment,
    )


def _finish(requests: Iterable[TraceRequest], duration: float) -> list[TraceRequest]:
    """Keep arrivals in [0, duration), sorted by time (ties keep their build order)."""
    return sorted(
        (request for request in requests if request.t < duration),
        key=lambda request: request.t,
    )


def _plain(tenant: str, times: Iterable[float], prompt: int, output: int) -> list[TraceRequest]:
    """Requests whose prompts share nothing: one unnamed segment each."""
    return [_request(time, tenant, [(None, prompt)], output) for time in times]


def _uniform_clients(
    duration: float,
    seed: int,
    rates: Sequence[float],
    prompt_tokens: int,
    output_tokens: int,
    period: float | None = None,
) -> list[TraceRequest]:
    """[VTC]'s synthetic clients c1, c2, ...: evenly spaced arrivals at `rates` (per s);
    with `period`, client 1 is ON and OFF for `period` seconds in turn, ON first."""
    requests = []
    for index, rate in enumerate(rates, start=1):
        times = uniform_arrivals(rate, 0.0, duration, stream(seed, "uniform", index))
        if period is not None and index == 1:
            times = on_off(times, period, period)
        requests += _plain(f"c{index}", times, prompt_tokens, output_tokens)
    return _finish(requests, duration)


def _vtc(
    duration: float,
    seed: int,
    rpm: Sequence[float],
    prompt_tokens: int,
    output_tokens: int,
    period: float | None = None,
) -> list[TraceRequest]:
    span = _check_common(duration, seed)
    rates = [rate / 60.0 for rate in _positive_list("rpm", rpm)]
    prompt = require_count("prompt_tokens", prompt_tokens, minimum=1)
    output = require_count("output_tokens", output_tokens, minimum=1)
    on = None if period is None else require_positive("period", period)
    return _uniform_clients(span, seed, rates, prompt, output, on)


# --- [VTC] synthetic workloads (paper §5 and App. B; rates from its artifact) -----------


def vtc_overload(
    duration: float = 360.0,
    seed: int = 0,
    rpm: Sequence[float] = (90.0, 180.0),
    prompt_tokens: int = 256,
    output_tokens: int = 256,
) -> list[TraceRequest]:
    """[VTC] §5, Fig. 3 (also Tables 4-5): two clients, both over their share.

    c1 and c2 send evenly spaced requests at 90 and 180 requests/min (`rpm`), 256 prompt
    and 256 output tokens, for 6 minutes. A fair scheduler serves them equally; FCFS
    serves them 1:2."""
    return _vtc(duration, seed, rpm, prompt_tokens, output_tokens)


def vtc_proportional(
    duration: float = 600.0,
    seed: int = 0,
    rpm: Sequence[float] = (15.0, 30.0, 90.0),
    prompt_tokens: int = 256,
    output_tokens: int = 256,
) -> list[TraceRequest]:
    """[VTC] §5, Fig. 4: three clients at 15, 30 and 90 requests/min, 10 minutes.

    The two small clients are under their share and should be served as they ask (1:2);
    c3 takes what is left."""
    return _vtc(duration, seed, rpm, prompt_tokens, output_tokens)


def vtc_on_off(
    duration: float = 600.0,
    seed: int = 0,
    rpm: Sequence[float] = (30.0, 120.0),
    period: float = 60.0,
    prompt_tokens: int = 256,
    output_tokens: int = 256,
) -> list[TraceRequest]:
    """[VTC] §5, Fig. 5: c1 at 30 requests/min, ON for 60 s then OFF for 60 s, under
    its share; c2 at 120 requests/min throughout, taking everything while c1 is OFF."""
    return _vtc(duration, seed, rpm, prompt_tokens, output_tokens, period)


def vtc_on_off_overload(
    duration: float = 600.0,
    seed: int = 0,
    rpm: Sequence[float] = (120.0, 180.0),
    period: float = 60.0,
    prompt_tokens: int = 256,
    output_tokens: int = 256,
) -> list[TraceRequest]:
    """[VTC] §5, Fig. 6: like `vtc_on_off`, but c1 sends 120 requests/min while ON
    (its backlog lasts through OFF) and c2 180 requests/min; both should get equal
    service throughout."""
    return _vtc(duration, seed, rpm, prompt_tokens, output_tokens, period)


def vtc_short_long(
    duration: float = 600.0,
    seed: int = 0,
    rates: Sequence[float] = (8.0, 1.5),
    short_tokens: int = 64,
    long_tokens: int = 256,
    cv: float = 1.0,
) -> list[TraceRequest]:
    """[VTC] §5, Fig. 7: Poisson arrivals (Gamma, `cv` = 1) with different lengths.

    c1 sends 8 requests/s of 64 prompt / 64 output tokens, c2 1.5 requests/s of 256 / 256
    (`rates` in requests/s), for 10 minutes."""
    span = _check_common(duration, seed)
    per_s = _positive_list("rates", rates)
    if len(per_s) != 2:
        raise ConfigError("rates", f"must list 2 rates (short, long), got {rates!r}")
    lengths = (
        require_count("short_tokens", short_tokens, minimum=1),
        require_count("long_tokens", long_tokens, minimum=1),
    )
    spread = require_positive("cv", cv)
    requests = []
    for index, (rate, length) in enumerate(zip(per_s, lengths, strict=True), start=1):
        times = gamma_arrivals(rate, 0.0, span, stream(seed, "gamma", index), spread)
        requests += _plain(f"c{index}", times, length, length)
    return _finish(requests, span)


def vtc_distribution_shift(
    duration: float = 900.0,
    seed: int = 0,
    period: float = 60.0,
    prompt_tokens: int = 256,
    output_tokens: int = 256,
) -> list[TraceRequest]:
    """[VTC] §5, Fig. 10: three equal phases (5 minutes each in the paper).

    Phase 1: c1 at 30 requests/min, ON/OFF every `period` s, and c2 at 120/min (as in
    Fig. 5). Phase 2: both at 60/min, both over their share. Phase 3: c1 at 30/min, c2 at
    90/min. A scheduler that remembers phase 1 (LCF) over-serves c1 in phase 2."""
    span = _check_common(duration, seed)
    prompt = require_count("prompt_tokens", prompt_tokens, minimum=1)
    output = require_count("output_tokens", output_tokens, minimum=1)
    on = require_positive("period", period)
    phases = ((30.0, 120.0), (60.0, 60.0), (30.0, 90.0))
    third = span / 3.0
    requests = []
    for phase, rpm in enumerate(phases):
        start, end = phase * third, (phase + 1) * third
        for index, rate in enumerate(rpm, start=1):
            rng = stream(seed, "shift", phase, index)
            times = uniform_arrivals(rate / 60.0, start, end, rng)
            if phase == 0 and index == 1:
                times = on_off(times, on, on, start)
            requests += _plain(f"c{index}", times, prompt, output)
    return _finish(requests, span)


def vtc_weighted(
    duration: float = 360.0,
    seed: int = 0,
    rates: Sequence[float] = (0.8, 0.8, 1.2, 1.6),
    prompt_tokens: int = 256,
    output_tokens: int = 256,
) -> list[TraceRequest]:
    """[VTC] §4.3 and Fig. 16 (weighted VTC): four clients at 0.8, 0.8, 1.2 and 1.6
    requests/s, 256 / 256 tokens, 6 minutes, all over their share.

    The paper's weights 1, 2, 3, 4 for c1..c4 are not part of a trace: put them in the
    tenants file given to the scheduler (`VTC_WEIGHTED_WEIGHTS`). Weighted VTC then serves
    about 1:2:3:4, plain VTC equally."""
    span = _check_common(duration, seed)
    per_s = _positive_list("rates", rates)
    prompt = require_count("prompt_tokens", prompt_tokens, minimum=1)
    output = require_count("output_tokens", output_tokens, minimum=1)
    return _uniform_clients(span, seed, per_s, prompt, output)


# --- [DLPM] workloads (paper §6-7: Tables 2-3, Figs. 6-12) -----------------------------
#
# The paper's synthetic arrivals are a Gamma process whose CV it does not give: `cv`
# defaults to 1 (Poisson). It gives neither the number of clients nor absolute rates:
# the defaults below (4 clients, c0 misbehaving as in Fig. 9) are ours. A program's later
# steps depend on earlier outputs, which a trace cannot express: they arrive `level_gap`
# seconds after the step they depend on, and programs still running at `duration` are cut.

_MISBEHAVE = ("S1", "S2", "none")


def _program_clients(
    clients: object, rate: object, cv: object, misbehave: object
) -> tuple[int, float, float, str]:
    return (
        require_count("clients", clients, minimum=1),
        require_positive("rate", rate),
        require_positive("cv", cv),
        _choice("misbehave", misbehave, _MISBEHAVE),
    )


def _tree(
    tenant: str,
    tree: int,
    start: float,
    question_tokens: int,
    branching: int,
    height: int,
    thought_tokens: int,
    max_tokens: int,
    level_gap: float,
    closed_loop: bool = False,
) -> list[TraceRequest]:
    """One tree of thoughts: `branching` requests per node, `height` levels below the
    question, Σ_{k=1..height} branching^k requests. A request's prompt is the question and
    the thoughts on its path; its output becomes the named segment its children append.
    With `closed_loop`, a child also waits for its parent to finish (`after`)."""
    base = f"{tenant}/tree{tree}"
    requests = []
    level: list[tuple[str, tuple[Segment, ...]]] = [("", ((f"{base}/q", question_tokens),))]
    for depth in range(height):
        time = start + depth * level_gap
        deeper = []
        for path, prompt in level:
            parent = f"{base}/{path}" if closed_loop and path else None
            for branch in range(branching):
                node = f"{path}.{branch}" if path else str(branch)
                thought = f"{base}/{node}"
                request = _request(time, tenant, prompt, thought_tokens, max_tokens, None, thought)
                requests.append(replace(request, after=parent))
                deeper.append((node, (*prompt, (thought, thought_tokens))))
        level = deeper
    return requests


def _judge(
    tenant: str,
    program: int,
    start: float,
    article_tokens: int,
    dimensions: int,
    instruction_tokens: int,
    output_tokens: int,
    level_gap: float,
) -> list[TraceRequest]:
    """One LLM-as-a-judge program (SGLang branch-solve-merge): one request per evaluation
    dimension on the shared article, then a merge reading the article and every verdict."""
    article: Segment = (f"{tenant}/article{program}", article_tokens)
    verdicts = [(f"{tenant}/article{program}/v{d}", output_tokens) for d in range(dimensions)]
    requests = [
        _request(start, tenant, [article, (f"{tenant}/dim{d}", instruction_tokens)], output_tokens)
        for d in range(dimensions)
    ]
    requests.append(_request(start + level_gap, tenant, [article, *verdicts], output_tokens))
    return requests


def _chat(
    tenant: str,
    conversation: int,
    start: float,
    turns: int,
    think_time: float,
    rng: random.Random,
) -> list[TraceRequest]:
    """One multi-turn chat. Turn k's prompt is the whole history plus the new user message,
    all one growing segment name: each turn's prompt extends the previous one. Message
    and reply lengths are lognormal (sigma 1) with Chatbot Arena's means, 56 and 142
    ([DLPM] Table 2), capped at 1024."""
    name = f"{tenant}/conv{conversation}"
    sigma = 1.0
    requests = []
    history = 0
    for turn in range(turns):
        history += lognormal_length(rng, 56 * math.exp(-sigma * sigma / 2), sigma, 1024)
        reply = lognormal_length(rng, 142 * math.exp(-sigma * sigma / 2), sigma, 1024)
        requests.append(_request(start + turn * think_time, tenant, [(name, history)], reply))
        history += reply
    return requests


def dlpm_shared_prefix(
    duration: float = 600.0,
    seed: int = 0,
    clients: int = 4,
    rate: float = 0.5,
    misbehave: str = "S1",
    rate_factor: float = 4.0,
    prefix_factor: float = 2.0,
    document_tokens: int = 21_400,
    question_tokens: int = 50,
    output_tokens: int = 15,
    questions_per_document: int = 8,
    cv: float = 1.0,
) -> list[TraceRequest]:
    """[DLPM] Long-Context QA (LooGLE; Table 2, Fig. 6): every client c0..c{n-1} asks
    questions about its own long documents, `questions_per_document` in a row per document.

    Prompt: the document (a name shared by its questions) then a unique question; about
    21,450 tokens in all and 15 output tokens (Table 2). Each client sends `rate`
    requests/s (Gamma arrivals). `misbehave` (Table 3): "S1", c0 sends `rate_factor` times
    as many requests (the paper gives no factor; 4 is ours); "S2", c0's documents are
    `prefix_factor` (2) times longer; "none", all alike. Per-document question counts and
    the rate are not given in the paper."""
    span = _check_common(duration, seed)
    count, per_client, spread, mode = _program_clients(clients, rate, cv, misbehave)
    heavy_rate = require_positive("rate_factor", rate_factor)
    heavy_prefix = require_positive("prefix_factor", prefix_factor)
    document = require_count("document_tokens", document_tokens, minimum=1)
    question = require_count("question_tokens", question_tokens, minimum=1)
    output = require_count("output_tokens", output_tokens, minimum=1)
    per_document = require_count("questions_per_document", questions_per_document, minimum=1)
    requests = []
    for index in range(count):
        tenant = f"c{index}"
        heavy = index == 0
        client_rate = per_client * (heavy_rate if heavy and mode == "S1" else 1.0)
        length = max(1, round(document * (heavy_prefix if heavy and mode == "S2" else 1.0)))
        times = gamma_arrivals(client_rate, 0.0, span, stream(seed, "qa", tenant), spread)
        for number, time in enumerate(times):
            doc: Segment = (f"{tenant}/doc{number // per_document}", length)
            requests.append(_request(time, tenant, [doc, (None, question)], output))
    return _finish(requests, span)


def dlpm_tree_of_thoughts(
    duration: float = 600.0,
    seed: int = 0,
    clients: int = 4,
    rate: float = 0.05,
    misbehave: str = "S1",
    branching: int = 2,
    heavy_branching: int = 4,
    prefix_factor: float = 10.0,
    height: int = 4,
    question_tokens: int = 90,
    thought_tokens: int = 200,
    max_tokens: int = 256,
    level_gap: float = 5.0,
    cv: float = 1.0,
    closed_loop: bool = False,
) -> list[TraceRequest]:
    """[DLPM] Tree-of-Thoughts (GSM8K, height 4; Table 2, Fig. 6, Fig. 9): each client
    starts `rate` trees/s; every request's prompt is the question plus the whole path of
    thoughts above it, so each branch shares its full path prefix.

    `misbehave` (Table 3): "S1", c0's trees have `heavy_branching` (4) branches, 340
    requests per tree against 30 for 2 branches; "S2", c0's questions are `prefix_factor`
    (10) times longer (Fig. 9 does this with 3 branches). The question (90) and thought
    (200) lengths are ours, chosen so a 2-branch tree's mean prompt is the paper's 546
    tokens with outputs up to 256. Level k arrives (k-1)·`level_gap` after the tree; with
    `closed_loop`, each request also waits for its parent to finish (the trace's `after`),
    as a ToT program can expand a thought only once it is generated."""
    span = _check_common(duration, seed)
    count, tree_rate, spread, mode = _program_clients(clients, rate, cv, misbehave)
    normal = require_count("branching", branching, minimum=1)
    wide = require_count("heavy_branching", heavy_branching, minimum=1)
    long_factor = require_positive("prefix_factor", prefix_factor)
    levels = require_count("height", height, minimum=1)
    question = require_count("question_tokens", question_tokens, minimum=1)
    thought = require_count("thought_tokens", thought_tokens, minimum=1)
    cap = require_count("max_tokens", max_tokens, minimum=thought)
    gap = require_non_negative("level_gap", level_gap)
    if not isinstance(closed_loop, bool):
        raise ConfigError("closed_loop", f"must be true or false, got {closed_loop!r}")
    requests = []
    for index in range(count):
        tenant = f"c{index}"
        heavy = index == 0
        fan = wide if heavy and mode == "S1" else normal
        length = max(1, round(question * (long_factor if heavy and mode == "S2" else 1.0)))
        times = gamma_arrivals(tree_rate, 0.0, span, stream(seed, "tot", tenant), spread)
        for tree, time in enumerate(times):
            requests += _tree(
                tenant, tree, time, length, fan, levels, thought, cap, gap, closed_loop
            )
    return _finish(requests, span)


def dlpm_judge(
    duration: float = 600.0,
    seed: int = 0,
    clients: int = 4,
    rate: float = 0.1,
    misbehave: str = "S1",
    dimensions: int = 2,
    heavy_dimensions: int = 16,
    extra_prefix_tokens: int = 600,
    article_tokens: int = 2701,
    instruction_tokens: int = 32,
    output_tokens: int = 256,
    level_gap: float = 5.0,
    cv: float = 1.0,
) -> list[TraceRequest]:
    """[DLPM] LLM-as-a-Judge (Table 2, Fig. 6): each client starts `rate` programs/s; a
    program judges one 2,701-token article along `dimensions` dimensions (one request
    each, 256 output tokens), then merges the verdicts in one more request.

    `misbehave` (Table 3): "S1", c0 judges 16 dimensions instead of 2; "S2", c0's articles
    carry `extra_prefix_tokens` (600) more tokens. The instruction length and rate are ours."""
    span = _check_common(duration, seed)
    count, program_rate, spread, mode = _program_clients(clients, rate, cv, misbehave)
    normal = require_count("dimensions", dimensions, minimum=1)
    many = require_count("heavy_dimensions", heavy_dimensions, minimum=1)
    extra = require_count("extra_prefix_tokens", extra_prefix_tokens, minimum=0)
    article = require_count("article_tokens", article_tokens, minimum=1)
    instruction = require_count("instruction_tokens", instruction_tokens, minimum=1)
    output = require_count("output_tokens", output_tokens, minimum=1)
    gap = require_non_negative("level_gap", level_gap)
    requests = []
    for index in range(count):
        tenant = f"c{index}"
        heavy = index == 0
        fan = many if heavy and mode == "S1" else normal
        length = article + (extra if heavy and mode == "S2" else 0)
        times = gamma_arrivals(program_rate, 0.0, span, stream(seed, "judge", tenant), spread)
        for program, time in enumerate(times):
            requests += _judge(tenant, program, time, length, fan, instruction, output, gap)
    return _finish(requests, span)


def dlpm_mixed(
    duration: float = 600.0,
    seed: int = 0,
    conversation_rate: float = 0.1,
    turns: int = 4,
    think_time: float = 15.0,
    program_rate: float = 0.05,
    branching: int = 2,
    dimensions: int = 2,
    level_gap: float = 5.0,
) -> list[TraceRequest]:
    """[DLPM] Fig. 12: a workload mix on one engine, four clients.

    `chat0` and `chat1` hold multi-turn conversations (Chatbot Arena-like; each starts
    `conversation_rate`/s, Poisson, with `turns` turns `think_time` s apart; the history is
    one growing segment). `tot` runs Tree-of-Thoughts programs and `judge` LLM-as-a-judge
    programs, `program_rate`/s each, with the Table 2 lengths. Which programs the paper's
    two program clients ran, and all rates, are not given: these are ours."""
    span = _check_common(duration, seed)
    chat_rate = require_positive("conversation_rate", conversation_rate)
    count = require_count("turns", turns, minimum=1)
    pause = require_non_negative("think_time", think_time)
    rate = require_positive("program_rate", program_rate)
    fan = require_count("branching", branching, minimum=1)
    judged = require_count("dimensions", dimensions, minimum=1)
    gap = require_non_negative("level_gap", level_gap)
    requests = []
    for tenant in ("chat0", "chat1"):
        rng = stream(seed, "chat", tenant)
        for number, time in enumerate(poisson_arrivals(chat_rate, 0.0, span, rng)):
            requests += _chat(tenant, number, time, count, pause, rng)
    trees = poisson_arrivals(rate, 0.0, span, stream(seed, "mixed", "tot"))
    for tree, time in enumerate(trees):
        requests += _tree("tot", tree, time, 90, fan, 4, 200, 256, gap)
    programs = poisson_arrivals(rate, 0.0, span, stream(seed, "mixed", "judge"))
    for program, time in enumerate(programs):
        requests += _judge("judge", program, time, 2701, judged, 32, 256, gap)
    return _finish(requests, span)


def dlpm_client_scaling(
    duration: float = 300.0,
    seed: int = 0,
    clients: int = 5,
    total_rate: float = 4.0,
    prefix_tokens: int = 1024,
    question_tokens: int = 64,
    output_tokens: int = 128,
    cv: float = 1.0,
) -> list[TraceRequest]:
    """[DLPM] Fig. 11: `clients` clients (5 to 50 in the paper) share a constant
    `total_rate` (requests/s, Gamma arrivals); each has its own system prompt of
    `prefix_tokens`, shared by all its requests and by no one else's, then a unique
    question. More clients means more distinct prefixes competing for the cache. The
    paper gives no rate or lengths: these defaults are ours."""
    span = _check_common(duration, seed)
    count = require_count("clients", clients, minimum=1)
    rate = require_positive("total_rate", total_rate) / count
    prefix = require_count("prefix_tokens", prefix_tokens, minimum=1)
    question = require_count("question_tokens", question_tokens, minimum=1)
    output = require_count("output_tokens", output_tokens, minimum=1)
    spread = require_positive("cv", cv)
    requests = []
    for index in range(count):
        tenant = f"c{index}"
        segments: list[Segment] = [(f"{tenant}/system", prefix), (None, question)]
        times = gamma_arrivals(rate, 0.0, span, stream(seed, "scaling", tenant), spread)
        requests += [_request(time, tenant, segments, output) for time in times]
    return _finish(requests, span)


# --- [KV] and [RAD] workloads ---------------------------------------------------------------


def lmsys_like(
    duration: float = 200.0,
    seed: int = 0,
    rate: float = 50.0,
    tenants: int = 1,
    max_prompt_tokens: int = 2048,
    max_output_tokens: int = 2048,
    hang_up: float = 0.0,
    patience: float = 10.0,
) -> list[TraceRequest]:
    """[KV] numerical experiments, Fig. 6 (length histograms): LMSYS-Chat-1M-like single questions.

    Poisson arrivals at `rate`/s: 50 is the paper's high-demand case, 10 its low-demand
    case (10,000 prompts in the paper, i.e. 200 s at 50/s). The paper's lengths are word
    counts, prompt mean 40.62 and median 11, output mean 85.32 and median 45; we draw
    lognormals with those medians and means (sigma about 1.62 and 1.13), capped, and use
    them as token counts as the paper does. Each request goes to one of `tenants`
    tenants u0, u1, ... at random (the paper has a single queue).

    Chat users give up: a fraction `hang_up` of the requests (none by default; the paper
    has no hang-ups) have a client that leaves after an exponential time of mean
    `patience` seconds (our choice), streamed, as chat answers are. These are drawn from a
    stream of their own, so the requests are the same whatever `hang_up` is."""
    span = _check_common(duration, seed)
    per_s = require_positive("rate", rate)
    count = require_count("tenants", tenants, minimum=1)
    prompt_cap = require_count("max_prompt_tokens", max_prompt_tokens, minimum=1)
    output_cap = require_count("max_output_tokens", max_output_tokens, minimum=1)
    leaving = _fraction("hang_up", hang_up)
    mean_wait = require_positive("patience", patience)
    rng, impatience = stream(seed, "lmsys"), stream(seed, "lmsys", "hang-up")
    prompt_sigma, output_sigma = sigma_for_mean(11, 40.62), sigma_for_mean(45, 85.32)
    requests = []
    for time in poisson_arrivals(per_s, 0.0, span, rng):
        tenant = f"u{rng.randrange(count)}"
        prompt = lognormal_length(rng, 11, prompt_sigma, prompt_cap)
        output = lognormal_length(rng, 45, output_sigma, output_cap)
        request = _request(time, tenant, [(None, prompt)], output)
        if impatience.random() < leaving:
            cancel_after = round(impatience.expovariate(1.0 / mean_wait), 6)
            request = replace(request, cancel_after=cancel_after)
        requests.append(request)
    return _finish(requests, span)


def slo_tiers(
    duration: float = 600.0,
    seed: int = 0,
    rate: float = 1.0,
    paying_fraction: float = 0.05,
    paying_tbt: float = 0.1,
    free_tbt: float = 0.5,
    max_total_tokens: int = 8192,
) -> list[TraceRequest]:
    """[RAD] §7 and App. F.3, Table 1, Figs. 6, 9, 10: two service tiers.

    Poisson arrivals at `rate`/s (the paper sweeps up to 1.6). Each request independently
    belongs to tenant `paying` with probability `paying_fraction` (5% in the main runs,
    50% and 95% in App. F.3), with a TBT SLO of 0.1 s, else to `free` with 0.5 s. Lengths
    follow openchat_shareGPT4 (Table 1): lognormals fitted to the medians and P90s, prompt
    1730 / 5696 and output 415 / 834 (the table's output std of 101 cannot match those
    quantiles), redrawn until prompt + output fits `max_total_tokens`."""
    span = _check_common(duration, seed)
    per_s = require_positive("rate", rate)
    share = _fraction("paying_fraction", paying_fraction)
    tiers = {
        "paying": SLO(tbt=require_positive("paying_tbt", paying_tbt)),
        "free": SLO(tbt=require_positive("free_tbt", free_tbt)),
    }
    cap = require_count("max_total_tokens", max_total_tokens, minimum=2)
    rng = stream(seed, "slo")
    prompt_sigma, output_sigma = sigma_for_p90(1730, 5696), sigma_for_p90(415, 834)
    requests = []
    for time in poisson_arrivals(per_s, 0.0, span, rng):
        tenant = "paying" if rng.random() < share else "free"
        while True:
            prompt = lognormal_length(rng, 1730, prompt_sigma, cap)
            output = lognormal_length(rng, 415, output_sigma, cap)
            if prompt + output <= cap:
                break
        requests.append(_request(time, tenant, [(None, prompt)], output, slo=tiers[tenant]))
    return _finish(requests, span)


# --- registry ----------------------------------------------------------------------------------

WORKLOADS: dict[str, Workload] = {
    workload.__name__: workload
    for workload in (
        vtc_overload,
        vtc_proportional,
        vtc_on_off,
        vtc_on_off_overload,
        vtc_short_long,
        vtc_distribution_shift,
        vtc_weighted,
        dlpm_shared_prefix,
        dlpm_tree_of_thoughts,
        dlpm_judge,
        dlpm_mixed,
        dlpm_client_scaling,
        lmsys_like,
        slo_tiers,
    )
}


def workload_parameters(name: str) -> dict[str, object]:
    """A workload's own parameters (besides duration and seed) and their defaults."""
    workload = _lookup(name)
    return {
        parameter.name: parameter.default
        for parameter in inspect.signature(workload).parameters.values()
        if parameter.name not in ("duration", "seed")
    }


def generate(name: str, duration: float, seed: int = 0, **params: object) -> list[TraceRequest]:
    """The named workload's requests; unknown names or parameters raise ConfigError."""
    workload = _lookup(name)
    _check_common(duration, seed)
    known = workload_parameters(name)
    for parameter in params:
        if parameter not in known:
            listed = ", ".join(known) or "none"
            raise ConfigError(
                parameter, f"not a parameter of workload {name!r}; its parameters: {listed}"
            )
    return workload(duration=duration, seed=seed, **params)


def _lookup(name: object) -> Workload:
    if not isinstance(name, str) or name not in WORKLOADS:
        known = ", ".join(WORKLOADS)
        raise ConfigError("workload", f"unknown workload {name!r}; known: {known}")
    return WORKLOADS[name]
