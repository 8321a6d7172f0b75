"""The baselines seed 003 compares against: PETALS, BPRR and "JFFC only".

T. Sun, T. He, I-H. Hou, "Serving Chain-structured Jobs with Large Memory Footprints with
Application to Large Foundation Model Serving" (arXiv:2604.14993), §4.1.3 and §4.2.3. The
paper describes the baselines in one sentence each; the details follow the systems they name
and the authors' released simulator (`TingyangSunJeff/load_balance_llm_simulator`,
`src/tests/test_overall_comparison_v4.m`), read only to settle what the paper leaves open.
Every choice of ours is marked **choice** below.

- **PETALS** (Borzunov et al., "Distributed Inference and Fine-tuning of Large Language Models
  Over The Internet", NeurIPS'23; code `bigscience-workshop/petals`):
  servers join one at a time in random order. A server takes as many layers as its memory holds
  with PETALS's fixed per-layer attention cache (`server/server.py` `_choose_num_blocks`:
  (memory − autograd reserve)/(layer + cache per layer), the cache sized for 4096 tokens), then
  the window of layers where the swarm's throughput is lowest (`server/block_selection.py`). A
  server's throughput is forward rate / ((m + 1)/2) (`server/throughput.py`), forward rate ∝
  1/τ^p_j here (**choice**; network rate ignored). The window rule is the sum of per-layer
  throughputs, as in the authors' simulator (`window_rule="sum"`), or PETALS's own
  lexicographic minimum of the sorted window (`"sorted"`). The authors' simulator caps the
  low-end (MIG 2g) servers at 4 layers; `max_layers` takes such caps.
  Routing (`client/routing/sequence_manager.py` `_build_inference_graph`, mode min_latency):
  per request, Dijkstra with edge cost RTT/2 + 18 ms overhead + per-token compute of the layers
  computed there, plus a 10 s `alloc_delay` where the server lacks cache for all the layers it
  hosts (PETALS's pessimistic `_has_cache_for`). Per-token compute is τ^p_j/l_out per layer
  (**choice**: PETALS uses the server's measured inference rate). RTTs are the orchestrator's
  (hub and spoke, as the paper's τ^c), and the router sees the true free cache now
  (**choice**: PETALS's view is stale by the DHT announce period; ours favours PETALS).
  At run time a server's cache is m_j × (cache per layer): ⌊m_j·cache/s_c⌋ slots.
- **BPRR** (T. Sun, T. He, B. Ji, P. Parag, "Optimizing resource allocation for
  geographically-distributed inference by large language models", Performance Evaluation 170
  (2025) 102527; the seed's reference [29]): placement CG-BP with
  design concurrency |R|: m_j = min(⌊M_j/(s_m + s_c|R|)⌋, L), servers in increasing amortized
  time t_j/m_j, each put where a layer is still under |R| concurrent sessions and the summed
  amortized time is largest (phase 1), or, once every layer is served |R| times, where the
  sorted per-layer capacities are lexicographically smallest (phase 2). Unlike GBP-CR it places
  every server. At run time jobs take cache from all the memory left, ⌊(M_j − s_m m_j)/s_c⌋.
  Routing WS-RR: per request, the shortest path with edge cost τ^c_j + τ^p_j m_ij + t^W_j,
  t^W_j the time until enough of j's cache frees, estimated from the running jobs' expected
  ends (start + T of their route: the router does not know job sizes). Waits add up along the
  path as in the authors' simulator; jobs committed to a route and still waiting are not in the
  estimate (**choice**). |R| by `bprr_design_concurrency`: Little's law, mean + one standard
  deviation of the jobs in service, as the authors' simulator does (**choice** of T̂ below).
- **JFFC only** (§4.2.3): the whole model on every server that holds it, capacity
  ⌊(M_j − s_m L)/(s_c L)⌋, JFFC across these single-server chains.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence

from fairpool.placement.gca import Link, feasible_links, shortest_path
from fairpool.placement.model import Chain, ChainProblem, Placement
from fairpool.sched.errors import ConfigError, require_count, require_non_negative
from fairpool.sim.chains import ChainJob, Route, SlotLedger, make_route

#: PETALS's serialization overhead per hop and its penalty for a server short of cache
#: (`sequence_manager.py` `_build_inference_graph`: overhead_delay=0.018, alloc_delay=10).
PETALS_OVERHEAD_SECONDS = 0.018
PETALS_ALLOC_DELAY_SECONDS = 10.0
#: PETALS reserves 2 GiB for autograd on a BLOOM-176B server (hidden size 14336), scaled by
#: the model's hidden size (`server.py` `_choose_num_blocks`).
PETALS_AUTOGRAD_GIB_AT_14336 = 2


# --------------------------------------------------------------------------- placements


def hosted_layers(problem: ChainProblem, placement: Placement) -> list[int]:
    """m_j for every server index (0 where it hosts nothing)."""
    return [placement.layers.get(j, 0) for j in range(len(problem.servers))]


def validate_placement(problem: ChainProblem, placement: Placement) -> None:
    """Contiguous ranges inside 1..L, every layer hosted somewhere, layers within memory."""
    covered = [False] * (problem.layers + 2)
    for j, count in placement.layers.items():
        if not 0 <= j < len(problem.servers):
            raise ConfigError("placement", f"unknown server index {j}")
        first = placement.first_layer.get(j)
        if first is None or count < 1:
            raise ConfigError("placement", f"server {j} has no first layer or no layers")
        if first < 1 or first + count - 1 > problem.layers:
            raise ConfigError("placement", f"server {j} hosts {first}..{first + count - 1}")
        if count * problem.layer_bytes > problem.servers[j].memory:
            raise ConfigError("placement", f"server {j}'s {count} layers exceed its memory")
        for layer in range(first, first + count):
            covered[layer] = True
    missing = [layer for layer in range(1, problem.layers + 1) if not covered[layer]]
    if missing:
        raise ConfigError("placement", f"layers {missing[:5]}… are hosted nowhere")


def petals_layers(
    problem: ChainProblem,
    server: int,
    cache_bytes_per_layer: int,
    reserve_bytes: int = 0,
    max_layers: int | None = None,
) -> int:
    """PETALS's block count: ⌊(M − autograd reserve)/(s_m + cache per layer)⌋, at most L."""
    memory = problem.servers[server].memory - reserve_bytes
    count = max(memory // (problem.layer_bytes + cache_bytes_per_layer), 0)
    count = min(count, problem.layers)
    return count if max_layers is None else min(count, max_layers)


def petals_throughput(problem: ChainProblem, server: int, layers: int) -> float:
    """What a PETALS server announces: forward rate / ((m + 1)/2) (`throughput.py`)."""
    return (1.0 / problem.servers[server].layer_seconds) / ((layers + 1) / 2)


def _window_start(loads: Sequence[float], width: int, rule: str) -> int:
    """0-based start of the least-served window of `width` layers."""
    starts = range(len(loads) - width + 1)
    if rule == "sum":
        return min(starts, key=lambda s: (sum(loads[s : s + width]), s))
    return min(starts, key=lambda s: (sorted(loads[s : s + width]), s))


def petals_placement(
    problem: ChainProblem,
    rng: random.Random,
    cache_bytes_per_layer: int,
    reserve_bytes: int = 0,
    max_layers: Mapping[int, int] | None = None,
    window_rule: str = "sum",
) -> Placement:
    """PETALS's greedy block selection as servers join in random order (see the module
    docstring); `max_layers` caps chosen servers (the authors' simulator caps MIG 2g at 4)."""
    require_count("cache_bytes_per_layer", cache_bytes_per_layer)
    require_count("reserve_bytes", reserve_bytes)
    if window_rule not in ("sum", "sorted"):
        raise ConfigError("window_rule", f"must be 'sum' or 'sorted', got {window_rule!r}")
    order = list(range(len(problem.servers)))
    rng.shuffle(order)
    loads = [0.0] * problem.layers
    first: dict[int, int] = {}
    layers: dict[int, int] = {}
    for j in order:
        cap = None if max_layers is None else max_layers.get(j)
        count = petals_layers(problem, j, cache_bytes_per_layer, reserve_bytes, cap)
        if count < 1:
            continue
        start = _window_start(loads, count, window_rule)
        first[j], layers[j] = start + 1, count
        throughput = petals_throughput(problem, j, count)
        for layer in range(start, start + count):
            loads[layer] += throughput
    spare = tuple(j for j in range(len(problem.servers)) if j not in layers)
    placement = Placement(first, layers, chains=(), spare=spare)
    validate_placement(problem, placement)
    return placement


def petals_slots(
    problem: ChainProblem, placement: Placement, cache_bytes_per_layer: int
) -> list[int]:
    """A PETALS server's cache, m_j × (cache per layer), in slots of s_c."""
    return [
        m * cache_bytes_per_layer // problem.slot_bytes for m in hosted_layers(problem, placement)
    ]


def amortized_seconds(problem: ChainProblem, server: int, layers: int) -> float:
    """t_j/m_j = (τ^c_j + τ^p_j m_j)/m_j, eq. (12)."""
    s = problem.servers[server]
    return (s.comm_seconds + s.layer_seconds * layers) / layers


def bprr_placement(problem: ChainProblem, design_concurrency: int) -> Placement:
    """CG-BP, BPRR's placement for |R| = `design_concurrency` concurrent sessions (see the
    module docstring). Ties go to the lower server index and the leftmost window."""
    concurrency = require_count("design_concurrency", design_concurrency, minimum=1)
    count = {j: problem.layers_at(server, concurrency) for j, server in enumerate(problem.servers)}
    usable = [j for j in count if count[j] >= 1]
    if not usable:
        raise ConfigError("servers", f"no server holds a layer at |R| = {concurrency}")
    per_layer = {j: amortized_seconds(problem, j, count[j]) for j in usable}
    # A virtual server slower than all: what an unserved layer costs per session.
    virtual = max(per_layer.values()) + 1.0
    served = [0] * problem.layers  # C_b: sessions each layer can hold so far
    cost = [concurrency * virtual] * problem.layers  # T_b: amortized time of layer b
    first: dict[int, int] = {}
    for j in sorted(usable, key=lambda j: (per_layer[j], j)):
        width = count[j]
        sessions = (problem.servers[j].memory - problem.layer_bytes * width) // (
            problem.slot_bytes * width
        )
        starts = range(problem.layers - width + 1)
        if min(served) < concurrency:
            candidates = [s for s in starts if min(served[s : s + width]) < concurrency]
            start = max(candidates, key=lambda s: (sum(cost[s : s + width]), -s))
        else:
            start = min(starts, key=lambda s: (sorted(served[s : s + width]), s))
        first[j] = start + 1
        for b in range(start, start + width):
            cost[b] -= (virtual - per_layer[j]) * min(max(concurrency - served[b], 0), sessions)
            served[b] += sessions
    layers = {j: count[j] for j in first}
    spare = tuple(j for j in range(len(problem.servers)) if j not in layers)
    placement = Placement(first, layers, chains=(), spare=spare)
    validate_placement(problem, placement)
    return placement


def bprr_design_concurrency(problem: ChainProblem, arrival_rate: float) -> int:
    """|R| as the authors' simulator sets it: mean plus one standard deviation of the number
    of jobs in service by Little's law, λT̂ + √max(λT̂, 1), at most
    ⌊(Σ M_j − s_m(L + J))/(s_c(L + J))⌋ (the bound that simulator cites as BPRR's eq. (19)).

    **choice**: T̂ = L·mean_j τ^p_j + 2·mean_j τ^c_j, a two-server route at the fleet's mean
    speed (the authors' simulator assumes 2-3 servers and a 70/30 mix of fast and slow)."""
    require_non_negative("arrival_rate", arrival_rate)
    servers = problem.servers
    if not servers:
        raise ConfigError("servers", "needs at least one server")
    mean_layer = sum(s.layer_seconds for s in servers) / len(servers)
    mean_comm = sum(s.comm_seconds for s in servers) / len(servers)
    in_service = arrival_rate * (problem.layers * mean_layer + 2 * mean_comm)
    wanted = math.ceil(in_service + math.sqrt(max(in_service, 1.0)))
    spread = problem.layers + len(servers)
    bound = (sum(s.memory for s in servers) - problem.layer_bytes * spread) // (
        problem.slot_bytes * spread
    )
    return max(1, min(wanted, bound))


def whole_model_chains(problem: ChainProblem) -> tuple[Placement, list[Chain]]:
    """ "JFFC only" (§4.2.3): every server that holds the whole model and at least one job's
    cache is a single-server chain of capacity ⌊(M_j − s_m L)/(s_c L)⌋."""
    first: dict[int, int] = {}
    layers: dict[int, int] = {}
    chains: list[Chain] = []
    L = problem.layers
    for j, server in enumerate(problem.servers):
        capacity = (server.memory - problem.layer_bytes * L) // (problem.slot_bytes * L)
        if capacity < 1:
            continue
        first[j], layers[j] = 1, L
        seconds = server.comm_seconds + server.layer_seconds * L
        chains.append(Chain((j,), (L,), capacity, seconds))
    if not chains:
        raise ConfigError("servers", "no server holds the whole model and one job's cache")
    spare = tuple(j for j in range(len(problem.servers)) if j not in layers)
    chains.sort(key=lambda chain: (chain.service_seconds, chain.servers))
    return Placement(first, layers, chains=tuple(c.servers for c in chains), spare=spare), chains


# --------------------------------------------------------------------------- routing


class PlacementGraph:
    """The "who can follow whom" DAG of a placement (§2.1, GCA's `feasible_links`) and
    shortest routes through it (GCA's `shortest_path`)."""

    def __init__(self, problem: ChainProblem, placement: Placement) -> None:
        validate_placement(problem, placement)
        self.problem = problem
        self.links = feasible_links(problem, placement)
        self.end = len(problem.servers)

    def shortest(
        self, link_cost: Callable[[int, int], float], finish_cost: Callable[[int], float]
    ) -> Route:
        """The cheapest route covering every layer; `link_cost(j, m_ij)` prices entering j
        to compute m_ij layers, `finish_cost(j)` leaving the last server. Ties: lower index."""

        def cost(link: Link) -> float:
            if link.target == self.end:
                return finish_cost(link.source)
            return link_cost(link.target, link.processed)

        path = shortest_path(self.links, self.end, cost)
        if path is None:
            raise ConfigError("placement", "no route covers every layer")
        stages = path[:-1]
        return make_route(
            self.problem, [link.target for link in stages], [link.processed for link in stages]
        )


class PetalsRouting:
    """PETALS's min-latency routing (see the module docstring)."""

    def __init__(
        self,
        problem: ChainProblem,
        placement: Placement,
        rtt_seconds: Sequence[float],
        output_tokens: int,
        overhead_seconds: float = PETALS_OVERHEAD_SECONDS,
        alloc_delay_seconds: float = PETALS_ALLOC_DELAY_SECONDS,
    ) -> None:
        if len(rtt_seconds) != len(problem.servers):
            raise ConfigError("rtt_seconds", "needs one round-trip time per server")
        for rtt in rtt_seconds:
            require_non_negative("rtt_seconds", rtt)
        self.graph = PlacementGraph(problem, placement)
        self.hosted = hosted_layers(problem, placement)
        self.half_rtt = [rtt / 2 for rtt in rtt_seconds]
        tokens = require_count("output_tokens", output_tokens, minimum=1)
        self.step = [s.layer_seconds / tokens for s in problem.servers]
        self.overhead = require_non_negative("overhead_seconds", overhead_seconds)
        self.alloc_delay = require_non_negative("alloc_delay_seconds", alloc_delay_seconds)

    def choose(self, job: ChainJob, now: float, ledger: SlotLedger) -> Route:
        def link(j: int, layers: int) -> float:
            cost = self.half_rtt[j] + self.overhead + self.step[j] * layers
            if ledger.free(j) < self.hosted[j]:
                cost += self.alloc_delay
            return cost

        return self.graph.shortest(link, lambda j: self.half_rtt[j])


class WaitingShortestPath:
    """BPRR's WS-RR routing (see the module docstring)."""

    def __init__(self, problem: ChainProblem, placement: Placement) -> None:
        self.problem = problem
        self.graph = PlacementGraph(problem, placement)

    def choose(self, job: ChainJob, now: float, ledger: SlotLedger) -> Route:
        servers = self.problem.servers

        def link(j: int, layers: int) -> float:
            return (
                servers[j].comm_seconds
                + servers[j].layer_seconds * layers
                + expected_wait(ledger, j, layers, now)
            )

        return self.graph.shortest(link, lambda j: 0.0)


def expected_wait(ledger: SlotLedger, server: int, slots: int, now: float) -> float:
    """t^W_j: how long until `slots` free at `server`, if every running job there ends when
    its route's mean time T says (start + T; never before now)."""
    free = ledger.free(server)
    if free >= slots:
        return 0.0
    releases = sorted(
        (max(job.start + job.expected_seconds - now, 0.0), job.route.processed[index])
        for job in ledger.holders[server].values()
        if job.start is not None and job.route is not None
        for index, j in enumerate(job.route.servers)
        if j == server
    )
    for wait, freed in releases:
        free += freed
        if free >= slots:
            return wait
    return math.inf
