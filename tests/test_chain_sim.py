"""The chain simulator (seed 003's system model), its baselines, and the reproduction at toy
scale: queueing theory it must agree with, invariants it must keep, orderings it must show."""

from __future__ import annotations

import math
import random

import pytest

from fairpool.placement.bounds import chain_bounds
from fairpool.placement.model import Chain, ChainProblem, Placement, Server
from fairpool.sched.errors import ConfigError
from fairpool.sim.chain_baselines import (
    PlacementGraph,
    bprr_design_concurrency,
    bprr_placement,
    petals_layers,
    petals_placement,
    validate_placement,
    whole_model_chains,
)
from fairpool.sim.chains import (
    ChainDispatch,
    ChainJob,
    CommCharge,
    Dispatcher,
    SimulationError,
    comm_seconds,
    make_route,
    poisson_jobs,
    simulate,
)
from fairpool_reproduce import chains as rc

pytestmark = pytest.mark.unit

GB = 10**9


def erlang_c_response(rate: float, mu: float, servers: int) -> float:
    """M/M/c mean response time from the textbook Erlang C formula."""
    offered = rate / mu
    rho = offered / servers
    head = sum(offered**k / math.factorial(k) for k in range(servers))
    tail = offered**servers / math.factorial(servers) / (1 - rho)
    waiting_probability = tail / (head + tail)
    return 1 / mu + waiting_probability / (servers * mu - rate)


def single_server_problem(seconds_per_layer: float = 0.1, layers: int = 10) -> ChainProblem:
    return ChainProblem((Server("a", 40 * GB, 0.0, seconds_per_layer),), layers, GB, GB // 10)


def chain_problem(speeds: list[float], layers: int = 4) -> ChainProblem:
    servers = tuple(Server(f"s{j}", 100 * GB, 0.0, speed) for j, speed in enumerate(speeds))
    return ChainProblem(servers, layers, GB, GB // 10)


def whole_chain(problem: ChainProblem, server: int, capacity: int) -> Chain:
    route = make_route(problem, (server,), (problem.layers,))
    return Chain(route.servers, route.processed, capacity, route.service_seconds)


# --------------------------------------------------------------------------- queueing theory


@pytest.mark.parametrize(("capacity", "load"), [(1, 0.6), (3, 0.8)])
def test_one_chain_of_capacity_c_is_an_m_m_c_queue(capacity: int, load: float) -> None:
    problem = single_server_problem()
    chain = whole_chain(problem, 0, capacity)
    dispatch = ChainDispatch(problem, [chain], [10 * capacity], "jffc")
    rate = load * capacity * chain.service_rate
    run = simulate(dispatch, poisson_jobs(rate, 80_000, random.Random(7)), warmup=5_000)
    exact = erlang_c_response(rate, chain.service_rate, capacity)
    assert abs(run.response.mean - exact) < 4 * run.response_stderr
    assert abs(run.response.mean - exact) < 0.05 * exact
    assert abs(run.service.mean - chain.service_seconds) < 0.03 * chain.service_seconds


@pytest.mark.parametrize("load", [0.5, 0.85])
def test_jffc_mean_lies_within_theorem_3_7_bounds(load: float) -> None:
    problem = chain_problem([0.25, 0.5, 1.0])
    chains = [whole_chain(problem, 0, 2), whole_chain(problem, 1, 3), whole_chain(problem, 2, 4)]
    dispatch = ChainDispatch(problem, chains, [100, 100, 100], "jffc")
    rate = load * dispatch.service_rate
    bounds = chain_bounds(rate, chains)
    assert bounds.upper > 1.1 * bounds.lower  # the chains differ enough to tell the bounds apart
    run = simulate(dispatch, poisson_jobs(rate, 60_000, random.Random(11)), warmup=5_000)
    margin = 3 * run.response_stderr
    assert bounds.lower - margin <= run.response.mean <= bounds.upper + margin


def test_jffc_sends_arrivals_to_the_fastest_free_chain() -> None:
    problem = chain_problem([0.25, 1.0])
    fast, slow = whole_chain(problem, 0, 1), whole_chain(problem, 1, 5)
    dispatch = ChainDispatch(problem, [slow, fast], [100, 100], "jffc")
    # Three jobs at once: the first takes the fast chain, the other two the slow one.
    run = simulate(dispatch, [(0.0, 1.0), (0.0, 1.0), (0.0, 1.0)])
    assert run.routes == {(0,): 1, (1,): 2}
    # Spread far apart, every job finds the fast chain free.
    run = simulate(dispatch, [(100.0 * k, 1.0) for k in range(5)])
    assert run.routes == {(0,): 5}


def test_jffc_starts_jobs_in_arrival_order_and_within_capacity() -> None:
    problem = chain_problem([0.25, 0.5])
    chains = [whole_chain(problem, 0, 2), whole_chain(problem, 1, 3)]
    slots = [2 * problem.layers, 3 * problem.layers]
    dispatch = ChainDispatch(problem, chains, slots, "jffc")
    rate = 1.3 * dispatch.service_rate  # overloaded: a long queue forms
    run = simulate(dispatch, poisson_jobs(rate, 3000, random.Random(3)))
    assert run.start_order_fifo
    assert run.peak_slots == tuple(slots)  # full, and never beyond
    assert run.completed == run.arrived == 3000
    assert run.waiting.mean > run.service.mean


def test_chain_capacities_beyond_the_servers_cache_are_refused() -> None:
    problem = chain_problem([0.25])
    with pytest.raises(ConfigError, match="constraint"):
        ChainDispatch(problem, [whole_chain(problem, 0, 3)], [2 * problem.layers], "jffc")


def test_a_dispatcher_that_starts_jobs_without_slots_is_caught() -> None:
    problem = chain_problem([0.25])
    route = make_route(problem, (0,), (problem.layers,))

    class Greedy(Dispatcher):
        def arrive(self, job: ChainJob, now: float) -> list[ChainJob]:
            job.route = route
            return [job]

        def depart(self, job: ChainJob, now: float) -> list[ChainJob]:
            return []

        def queued(self) -> int:
            return 0

    with pytest.raises(SimulationError):
        simulate(Greedy("greedy", [problem.layers]), [(0.0, 1.0), (0.1, 1.0)])


def test_communication_once_or_per_output_token() -> None:
    assert comm_seconds(0.030, 0.018, 20, CommCharge.ONCE) == pytest.approx(0.048)
    assert comm_seconds(0.030, 0.018, 20, "per_token") == pytest.approx(0.96)
    with pytest.raises(ConfigError, match="comm_charge"):
        comm_seconds(0.03, 0.018, 20, "twice")
    with pytest.raises(ConfigError, match="rtt"):
        comm_seconds(-1.0, 0.018, 20, "once")
    with pytest.raises(ConfigError, match="arrival_rate"):
        poisson_jobs(0.0, 10, random.Random(0))


# --------------------------------------------------------------------------- baselines


def bloom_fleets(count: int) -> list[rc.ChainFleet]:
    fleets = []
    for seed in range(count):
        rng = random.Random(seed)
        servers = rng.choice([10, 20, 30])
        fraction = rng.choice([0.1, 0.2, 0.4])
        kinds = rc.mixed_kinds(servers, fraction, rc.HIGH, rc.LOW)
        fleets.append(rc.draw_fleet(rc.BLOOM, kinds, rng, CommCharge.ONCE))
    return fleets


def assert_valid(problem: ChainProblem, placement: Placement, bytes_per_layer: int) -> None:
    validate_placement(problem, placement)
    hosted = [False] * (problem.layers + 1)
    for j, count in placement.layers.items():
        first = placement.first_layer[j]
        assert first >= 1 and first + count - 1 <= problem.layers
        assert count * bytes_per_layer <= problem.servers[j].memory
        for layer in range(first, first + count):
            hosted[layer] = True
    assert all(hosted[1:])


def test_petals_placements_are_valid_and_respect_its_cache_reservation() -> None:
    cache = 2 * rc.BLOOM.hidden_size * 4096 * 2
    checked = 0
    for fleet in bloom_fleets(12):
        problem = fleet.problem
        for rule in ("sum", "sorted"):
            try:
                placement = petals_placement(
                    problem, random.Random(1), cache, 2 * 2**30, None, rule
                )
            except ConfigError:
                continue  # PETALS's greedy windows can leave a layer unhosted
            assert_valid(problem, placement, problem.layer_bytes + cache)
            for j, count in placement.layers.items():
                assert count == petals_layers(problem, j, cache, 2 * 2**30)
            checked += 1
    assert checked >= 12


def test_bprr_and_whole_model_placements_are_valid() -> None:
    for fleet in bloom_fleets(8):
        problem = fleet.problem
        concurrency = bprr_design_concurrency(problem, 0.2)
        placement = bprr_placement(problem, concurrency)
        assert_valid(problem, placement, problem.layer_bytes + problem.slot_bytes * concurrency)
        assert not placement.spare  # CG-BP places every server
    llama = rc.draw_fleet(
        rc.LLAMA, [rc.MIG_3G] * 3 + [rc.MIG_2G] * 6, random.Random(0), CommCharge.ONCE
    )
    placement, chains = whole_model_chains(llama.problem)
    assert_valid(llama.problem, placement, llama.problem.layer_bytes)
    assert len(chains) == 9
    for chain in chains:
        server = llama.problem.servers[chain.servers[0]]
        used = (llama.problem.layer_bytes + llama.problem.slot_bytes * chain.capacity) * 32
        assert used <= server.memory


def test_a_placement_with_a_gap_is_rejected() -> None:
    problem = chain_problem([0.1, 0.1], layers=6)
    with pytest.raises(ConfigError, match="hosted nowhere"):
        validate_placement(problem, Placement({0: 1, 1: 5}, {0: 3, 1: 2}, chains=()))


def test_routes_through_a_placement_cover_every_layer_once() -> None:
    problem = chain_problem([0.1, 0.2, 0.3, 0.1], layers=10)
    # 0 hosts 1-4, 1 hosts 3-7 (overlap), 2 hosts 5-10, 3 hosts 8-10.
    placement = Placement({0: 1, 1: 3, 2: 5, 3: 8}, {0: 4, 1: 5, 2: 6, 3: 3}, chains=())
    graph = PlacementGraph(problem, placement)
    route = graph.shortest(lambda j, layers: problem.servers[j].layer_seconds * layers, lambda j: 0)
    assert sum(route.processed) == 10
    assert route.servers == (0, 1, 3)  # 4 + 3 + 3 layers: the fast servers
    assert route.processed == (4, 3, 3)


# --------------------------------------------------------------------------- every dispatcher


def test_no_dispatcher_ever_holds_more_cache_than_a_server_has() -> None:
    fleet = bloom_fleets(1)[0]
    rate = 0.6  # well above what PETALS's two-session caches carry
    methods = [
        rc.proposed(fleet, rate, 7),
        rc.proposed(fleet, rate, 7, "vllm"),
        rc.petals(fleet, random.Random(2), None),
        rc.bprr(fleet, rate),
    ]
    saturated = 0
    for method in methods:
        run = simulate(method.dispatcher, poisson_jobs(rate, 600, random.Random(5)))
        assert all(peak <= slots for peak, slots in zip(run.peak_slots, run.slots, strict=True))
        assert run.completed == 600
        pairs = zip(run.peak_slots, run.slots, strict=True)
        saturated += any(peak == slots > 0 for peak, slots in pairs)
    assert saturated >= 1  # the check is not vacuous: some server's cache filled up


# --------------------------------------------------------------------------- reproduction


def test_quick_reproduction_orders_proposed_below_petals() -> None:
    grid = rc.overall_comparison(
        seeds=2,
        jobs=300,
        charges=(CommCharge.ONCE,),
        server_counts=(10,),
        fast_fractions=(0.2,),
    )
    cell = grid["charges"]["once"]["cells"][0]
    methods = cell["methods"]
    assert methods["proposed"]["runs"] == 2
    assert methods["proposed"]["response"]["mean"] < methods["petals"]["response"]["mean"]
    assert methods["proposed"]["peak_within_slots"] and methods["petals"]["peak_within_slots"]
    assert rc.reduction(5.0, 10.0) == pytest.approx(0.5)


def test_section_8_replaces_itself_in_results_md() -> None:
    text = "# R\n\n## 7. SLAI\n\nx\n\n## Simulator limits that shape these numbers\n\n- y\n"
    first = rc.replace_section(text, ["## 8. Chains", "", "old", ""])
    assert first.index("## 7.") < first.index("## 8. Chains") < first.index("## Simulator")
    second = rc.replace_section(first, ["## 8. Chains", "", "new"])
    assert "old" not in second and "new" in second
    assert second.count("## 8.") == 1 and second.endswith("- y\n")
