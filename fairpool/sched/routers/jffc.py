"""Join-the-Fastest-Free-Chain: the load balancer of pipeline pools.

Sun, He, Hou 2026 (seed 003), §3.2.1, Alg. 3. Each worker is a server chain k — one
pipeline-parallel engine — with a capacity c_k (requests it may run at once, from the
KV cache its stages reserve) and a service rate μ_k = 1/T_k. An arrival goes to the fastest
chain with Z_k < c_k; when every chain is full it waits in the central queue (the caller's:
the simulator's FIFO, or the gateway's fair queue), and a completion on chain k lets the
head of that queue in, which then goes to the fastest free chain — chain k, since all
others were full. Jobs never migrate. Lemma 3.6: JFFC is stable for every λ < Σ_k c_k μ_k.

Workers without a profile count as chains of rate 1 with no capacity limit; ties in rate
go to the worker added first (the paper leaves ties open).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fairpool.sched.errors import ConfigError, require_count, require_positive
from fairpool.sched.routers.base import Router, RouteRequest


@dataclass(frozen=True)
class ChainProfile:
    """What the planner predicts of a chain: c_k and μ_k (requests per second)."""

    capacity: int
    service_rate: float

    def __post_init__(self) -> None:
        require_count("capacity", self.capacity, minimum=1)
        require_positive("service_rate", self.service_rate)


class JFFC(Router):
    """Fastest chain with a free slot (seed 003, Alg. 3)."""

    name = "jffc"

    def __init__(
        self,
        workers: Iterable[str] = (),
        chains: Mapping[str, ChainProfile] | None = None,
    ) -> None:
        self.chains: dict[str, ChainProfile] = {}
        self.set_chains(chains or {})
        super().__init__(workers)

    def set_chains(self, chains: Mapping[str, ChainProfile]) -> None:
        for worker, profile in chains.items():
            if not isinstance(profile, ChainProfile):
                raise ConfigError(f"chains[{worker}]", "must be a ChainProfile")
        self.chains = dict(chains)

    def room(self, worker_id: str) -> int | None:
        profile = self.chains.get(worker_id)
        if profile is None:
            return None
        return max(profile.capacity - self._worker(worker_id).outstanding, 0)

    def service_rate(self, worker_id: str) -> float:
        profile = self.chains.get(worker_id)
        return 1.0 if profile is None else profile.service_rate

    def _choose(self, request: RouteRequest, candidates: list[str]) -> str:
        free = [worker for worker in candidates if self.room(worker) != 0]
        if not free:
            raise ConfigError("workers", "every chain is at capacity; queue the request")
        # max() keeps the first of equal keys: the earliest-added chain wins ties.
        return max(free, key=self.service_rate)
