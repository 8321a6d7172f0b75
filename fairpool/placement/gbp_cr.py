"""GBP-CR: greedy block placement with cache reservation.

Sun, He, Hou 2026, seed 003, §3.1.3, Alg. 1, with eqs. (8), (9) and (12). For a required
capacity c every server reserves KV for c concurrent jobs on each layer it hosts, so it holds
m_j(c) = min(⌊M_j/(s_m + s_c·c)⌋, L) layers (eq. 8). Servers are taken fastest per layer
first (t̃_j = t_j/m_j, eq. 12) and cut into disjoint chains that each cover layers 1..L, until
the chains' rates Σ 1/T reach λ/(ρ̄c) (lines 7-9).
"""

from __future__ import annotations

from fairpool.placement.model import ChainProblem, Placement
from fairpool.sched.errors import ConfigError, require_count, require_positive


def required_rate(arrival_rate: float, target_load: float, capacity_param: int) -> float:
    """λ/(ρ̄c): the scaled service rate GBP-CR's chains must reach (problem (10b))."""
    rate = require_positive("arrivalRate", arrival_rate)
    load = require_positive("targetLoad", target_load)
    if load >= 1:
        raise ConfigError("targetLoad", f"must be < 1, got {target_load!r}")
    return rate / (load * capacity_param)


def placement_order(problem: ChainProblem, capacity_param: int) -> list[int]:
    """Servers that can host a layer at this c, by increasing t̃_j(c) (eq. 12), ties by index.

    A server with m_j(c) = 0 cannot host anything at this c and is left out (the paper
    does not say so; its t̃ would be infinite)."""

    def amortized_seconds(index: int) -> tuple[float, int]:
        server = problem.servers[index]
        layers = problem.layers_at(server, capacity_param)
        return (server.comm_seconds + server.layer_seconds * layers) / layers, index

    usable = [
        index
        for index, server in enumerate(problem.servers)
        if problem.layers_at(server, capacity_param) > 0
    ]
    return sorted(usable, key=amortized_seconds)


def gbp_cr(
    problem: ChainProblem, capacity_param: int, arrival_rate: float, target_load: float = 0.7
) -> Placement:
    """Alg. 1 of Sun, He, Hou 2026, seed 003 (§3.1.3), line by line.

    - Line 4 shifts a chain's last server left so that it ends at layer L; it then hosts
      layers the previous server already covers (the overlap the paper allows).
    - Line 5 adds t_j(c) with the server's full m_j(c), also for that shifted last server, so
      the chain's T is pessimistic; it is what K(c) (eq. 13) counts with.
    - Servers after the break (line 10) get no layers. An unfinished last chain keeps its
      layers (GCA may still use them) but is not a chain: its servers are in `spare`.
    """
    c = require_count("capacityParam", capacity_param, minimum=1)
    target = required_rate(arrival_rate, target_load, c)
    total_layers = problem.layers
    first_layer: dict[int, int] = {}
    layers: dict[int, int] = {}
    chains: list[tuple[int, ...]] = []
    chain_seconds: list[float] = []
    current: list[int] = []
    next_layer, seconds, rate, target_met = 1, 0.0, 0.0, False
    for index in placement_order(problem, c):
        server = problem.servers[index]
        hosted = problem.layers_at(server, c)
        first_layer[index] = min(next_layer, total_layers - hosted + 1)
        layers[index] = hosted
        current.append(index)
        seconds += server.comm_seconds + server.layer_seconds * hosted
        next_layer = min(next_layer + hosted - 1, total_layers) + 1
        if next_layer > total_layers:
            chains.append(tuple(current))
            chain_seconds.append(seconds)
            rate += 1.0 / seconds
            if rate >= target:
                target_met = True
                break
            current, next_layer, seconds = [], 1, 0.0
    in_chains = {index for chain in chains for index in chain}
    spare = tuple(index for index in range(len(problem.servers)) if index not in in_chains)
    return Placement(
        first_layer=first_layer,
        layers=layers,
        chains=tuple(chains),
        spare=spare,
        chain_seconds=tuple(chain_seconds),
        target_met=target_met,
    )
