"""GCA: greedy cache allocation over every chain a placement allows.

Sun, He, Hou 2026, seed 003, §3.1.4, Alg. 2. The servers hosting layers, plus a dummy start
(hosting "layer 0") and a dummy end (hosting "layer L+1"), form a DAG: i → j is a link when
j hosts the layer right after i's last one, a_j ≤ a_i + m_i ≤ a_j + m_j − 1, and a job going
i → j computes m_ij = a_j + m_j − a_i − m_i layers at j and holds that many KV slots there
(eqs. (1)-(3)). GCA repeatedly takes the fastest start → end path, gives it as many
concurrent jobs as the residual slots allow, and subtracts them. Theorem 3.5: these chains
with these capacities are all JFFS ever needs.

Pitfall fixed here (digest §3.3): the paper's lines 10-12 drop only the links of the new
chain, so another link into an exhausted server can survive and give a later chain
capacity 0. We keep the invariant "a link (i, j) is usable iff j's residual slots ≥ m_ij"
for every link, which yields the paper's stated outputs (Fig. 2: 3 chains of capacity 5).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from fairpool.placement.model import Chain, ChainProblem, Placement
from fairpool.sched.errors import ConfigError

START = -1  # j_0: a_0 = 0, m_0 = 1


@dataclass(frozen=True)
class Link:
    """i → j in ℰ_{a,m}: j computes `processed` = m_ij layers for a job coming from i."""

    source: int
    target: int  # a server index, or END
    processed: int


def residual_slots(problem: ChainProblem, placement: Placement) -> dict[int, int]:
    """M̃_j = ⌊(M_j − s_m·m_j)/s_c⌋, the cache slots left after the weights (eq. 3)."""
    slots = {}
    for index, hosted in placement.layers.items():
        first = placement.first_layer[index]
        if hosted < 1 or first < 1 or first + hosted - 1 > problem.layers:
            raise ConfigError("placement", f"server {index} hosts layers outside 1..L")
        room = problem.servers[index].memory - problem.layer_bytes * hosted
        if room < 0:
            raise ConfigError("placement", f"server {index} cannot hold its {hosted} layers")
        slots[index] = room // problem.slot_bytes
    return slots


def feasible_links(problem: ChainProblem, placement: Placement) -> dict[int, list[Link]]:
    """ℰ_{a,m} with the dummies, as out-links per node (§2.1)."""
    end = len(problem.servers)
    # (first layer, layers) of every node; the dummies host layer 0 and layer L+1.
    span = {
        index: (placement.first_layer[index], hosted) for index, hosted in placement.layers.items()
    }
    span[START] = (0, 1)
    span[end] = (problem.layers + 1, 1)
    links: dict[int, list[Link]] = {node: [] for node in span}
    for source, (source_first, source_layers) in span.items():
        after = source_first + source_layers  # the layer right after the source's last
        for target, (target_first, target_layers) in span.items():
            if target != source and target_first <= after <= target_first + target_layers - 1:
                processed = target_first + target_layers - after
                links[source].append(Link(source, target, processed))
    return links


def gca(problem: ChainProblem, placement: Placement) -> list[Chain]:
    """Alg. 2 of Sun, He, Hou 2026, seed 003 (§3.1.4), with the invariant fix above.

    Dijkstra (link cost τ^c_j + τ^p_j·m_ij ≥ 0; 0 into the dummy end) over the usable links;
    each chain gets c_k = min ⌊M_j/m_ij⌋ ≥ 1 along its path. Ties between equally fast paths
    go to the one Dijkstra settles first (lower node index first)."""
    residual = residual_slots(problem, placement)
    links = feasible_links(problem, placement)
    chains: list[Chain] = []
    while (path := _fastest_path(problem, links, residual)) is not None:
        capacity = min(residual[link.target] // link.processed for link in path[:-1])
        for link in path[:-1]:
            residual[link.target] -= link.processed * capacity
        chains.append(
            Chain(
                servers=tuple(link.target for link in path[:-1]),
                processed=tuple(link.processed for link in path[:-1]),
                capacity=capacity,
                service_seconds=_path_seconds(problem, path),
            )
        )
    return chains


def _link_seconds(problem: ChainProblem, link: Link) -> float:
    if link.target == len(problem.servers):
        return 0.0
    server = problem.servers[link.target]
    return server.comm_seconds + server.layer_seconds * link.processed


def _path_seconds(problem: ChainProblem, path: list[Link]) -> float:
    """T_k = Σ_{(i,j)∈k} (τ^c_j + τ^p_j·m_ij), eq. (2)."""
    return sum(_link_seconds(problem, link) for link in path)


def _fastest_path(
    problem: ChainProblem, links: dict[int, list[Link]], residual: dict[int, int]
) -> list[Link] | None:
    """Shortest start → end path over the links whose target still has m_ij free slots."""
    end = len(problem.servers)

    def seconds(link: Link) -> float | None:
        if link.target != end and residual[link.target] < link.processed:
            return None
        return _link_seconds(problem, link)

    return shortest_path(links, end, seconds)


def shortest_path(
    links: dict[int, list[Link]], end: int, cost: Callable[[Link], float | None]
) -> list[Link] | None:
    """Dijkstra from the dummy start to `end` over `links`, a link priced by `cost`
    (≥ 0; None: not usable). Ties go to the node settled first (lower cost, then lower
    index). None when no usable path reaches the end."""
    distance: dict[int, float] = {START: 0.0}
    arrived_by: dict[int, Link] = {}
    settled: set[int] = set()
    frontier: list[tuple[float, int]] = [(0.0, START)]
    while frontier:
        seconds, node = heapq.heappop(frontier)
        if node in settled:
            continue
        settled.add(node)
        if node == end:
            break
        for link in links[node]:
            price = cost(link)
            if price is None:
                continue
            candidate = seconds + price
            if candidate < distance.get(link.target, math.inf):
                distance[link.target] = candidate
                arrived_by[link.target] = link
                heapq.heappush(frontier, (candidate, link.target))
    if end not in settled:
        return None
    path = [arrived_by[end]]
    while path[-1].source != START:
        path.append(arrived_by[path[-1].source])
    return path[::-1]
