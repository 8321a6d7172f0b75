"""The chain-composition problem of seed 003 in plain names.

T. Sun, T. He, I-H. Hou, "Serving Chain-structured Jobs with Large Memory Footprints with
Application to Large Foundation Model Serving" (arXiv:2604.14993, MobiHoc '26), §2.1 and
Table 2. The paper's symbols map to these names:

| paper | here |
|---|---|
| server j, M_j | `Server`, `Server.memory` |
| τ^c_j, τ^p_j | `Server.comm_seconds`, `Server.layer_seconds` |
| L, s_m, s_c | `ChainProblem.layers`, `.layer_bytes`, `.slot_bytes` |
| a_j, m_j | `Placement.first_layer[j]` (1-based, as in the paper), `Placement.layers[j]` |
| m_ij | `Chain.processed` (layers each stage computes) |
| c_k, T_k, μ_k | `Chain.capacity`, `Chain.service_seconds`, `Chain.service_rate` |
| c | `capacity_param` (the cache reservation of GBP-CR) |
| λ, ρ̄ | `arrival_rate`, `target_load` |

Memory is in integer bytes (or any integer unit) so that ⌊M/(s_m + s_c c)⌋ is exact; the
paper's own example 3.3/1.1 evaluates to 2.999… in floating point.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fairpool.sched.errors import ConfigError


@dataclass(frozen=True)
class Server:
    """One GPU (or one node running tensor parallelism inside it) that can host a stage."""

    name: str
    memory: int  # M_j: bytes usable for layer weights and KV cache
    comm_seconds: float  # τ^c_j: communication time per request through this server
    layer_seconds: float  # τ^p_j: time to process all of a request's tokens through one layer
    group: str = ""  # the node group it came from, for reports

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("server.name", "must be a non-empty string")
        if self.memory < 0:
            raise ConfigError(f"server {self.name}: memory", "must be ≥ 0")
        if self.comm_seconds < 0:
            raise ConfigError(f"server {self.name}: commSeconds", "must be ≥ 0")
        if self.layer_seconds <= 0:
            raise ConfigError(f"server {self.name}: layerSeconds", "must be > 0")


@dataclass(frozen=True)
class ChainProblem:
    """A model of `layers` identical layers of `layer_bytes` each; every request needs
    `slot_bytes` of KV cache on each layer it passes (one cache slot, sized for the longest
    sequence)."""

    servers: tuple[Server, ...]
    layers: int  # L
    layer_bytes: int  # s_m
    slot_bytes: int  # s_c

    def __post_init__(self) -> None:
        if self.layers < 1:
            raise ConfigError("layers", "must be ≥ 1")
        if self.layer_bytes < 1:
            raise ConfigError("layerBytes", "must be ≥ 1")
        if self.slot_bytes < 1:
            raise ConfigError("slotBytes", "must be ≥ 1")
        names = [server.name for server in self.servers]
        if len(set(names)) != len(names):
            raise ConfigError("servers", "server names must be unique")

    def layers_at(self, server: Server, capacity_param: int) -> int:
        """m_j(c) = min(⌊M_j / (s_m + s_c·c)⌋, L), eq. (8)."""
        return min(
            server.memory // (self.layer_bytes + self.slot_bytes * capacity_param), self.layers
        )

    def max_capacity_param(self) -> int:
        """c_max = ⌊(max_j M_j − s_m)/s_c⌋: the most concurrent jobs any server can hold."""
        if not self.servers:
            return 0
        return max((max(s.memory for s in self.servers) - self.layer_bytes) // self.slot_bytes, 0)


@dataclass(frozen=True)
class Placement:
    """Which contiguous layers each server hosts (servers absent from `layers` host none)."""

    first_layer: dict[int, int]  # a_j, 1-based, by server index
    layers: dict[int, int]  # m_j, by server index
    chains: tuple[tuple[int, ...], ...]  # GBP-CR's complete disjoint chains, servers in order
    spare: tuple[int, ...] = ()  # servers left without a complete chain
    # GBP-CR's T per complete chain (Alg. 1 line 5): Σ t_j(c) over the chain with every server's
    # full m_j(c), a pessimistic service time; the real T_k comes from the layers processed.
    chain_seconds: tuple[float, ...] = ()
    target_met: bool = False  # whether Σ 1/T reached λ/(ρ̄c) (Alg. 1 line 9)


@dataclass(frozen=True)
class Chain:
    """A start-to-end path of servers, the layers each one computes and its capacity."""

    servers: tuple[int, ...]  # server indices, in pipeline order
    processed: tuple[int, ...]  # m_ij: layers computed at each server; sums to L
    capacity: int  # c_k: concurrent requests
    service_seconds: float  # T_k = Σ (τ^c_j + τ^p_j m_ij), eq. (2)

    @property
    def service_rate(self) -> float:
        """μ_k = 1/T_k."""
        return 1.0 / self.service_seconds


@dataclass(frozen=True)
class ResponseBounds:
    """Theorem 3.7's bounds on the mean response time of JFFC (seconds)."""

    lower: float
    upper: float


@dataclass
class Explanation:
    """Why the planner chose what it chose, line by line, for people to read."""

    lines: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        self.lines.append(line)
