"""What schedulers see of requests and engines.

A local policy sees waiting requests (`Request`) and, through `EngineView`, the engine's
running requests, prefix-cache hits and KV memory. Each place that runs a policy — the
simulator, the simulated engine, the vLLM plugin — provides its own `EngineView`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fairpool.sched.errors import ConfigError, require_count, require_non_negative, require_positive


@dataclass(frozen=True)
class SLO:
    """Latency targets of a request, in seconds (None: no target)."""

    ttft: float | None = None
    tbt: float | None = None

    def __post_init__(self) -> None:
        if self.ttft is not None:
            require_positive("slo.ttft", self.ttft)
        if self.tbt is not None:
            require_positive("slo.tbt", self.tbt)


@dataclass(frozen=True)
class Request:
    """A request as a scheduler sees it: who sent it, how long, and what it may produce."""

    request_id: str
    tenant: str
    prompt_tokens: int
    max_tokens: int
    arrival: float = 0.0
    slo: SLO | None = None
    # Prompt token ids, where the caller has them (prefix matching in engines and routers).
    tokens: Sequence[int] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ConfigError("request_id", f"must be a non-empty string, got {self.request_id!r}")
        if not isinstance(self.tenant, str) or not self.tenant:
            raise ConfigError("tenant", f"must be a non-empty string, got {self.tenant!r}")
        require_count("prompt_tokens", self.prompt_tokens, minimum=0)
        require_count("max_tokens", self.max_tokens, minimum=1)
        require_non_negative("arrival", self.arrival)


@dataclass
class Running:
    """A request the engine is serving: its prompt may still be prefilling in chunks."""

    request: Request
    output_tokens: int = 0
    prefill_remaining: int = 0
    # End time of the last batch that advanced it (SLAI's e_{i-1,j}).
    last_step_end: float = 0.0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def tenant(self) -> str:
        return self.request.tenant

    @property
    def held_tokens(self) -> int:
        """KV tokens this request holds now (the prompt is reserved whole at admission)."""
        return self.request.prompt_tokens + self.output_tokens

    @property
    def decoding(self) -> bool:
        return self.prefill_remaining == 0


class EngineView(Protocol):
    """The engine state a local policy may read while choosing what to admit."""

    @property
    def now(self) -> float: ...

    @property
    def memory_tokens(self) -> int:
        """M: KV-cache capacity for requests, in tokens."""
        ...

    @property
    def block_size(self) -> int:
        """Tokens per KV block: memory is allocated a block at a time (vLLM: 16)."""
        ...

    @property
    def running(self) -> Sequence[Running]: ...

    @property
    def mean_batch_time(self) -> float:
        """Running mean of batch (iteration) durations so far, in seconds."""
        ...

    @property
    def memory_utilization(self) -> float:
        """Fraction of KV memory in use, 0..1."""
        ...

    def cached_tokens(self, request: Request) -> int:
        """Prompt tokens of `request` the prefix cache would serve right now."""
        ...

    def hit_epoch(self, tenant: str) -> int | None:
        """A number that stays the same as long as every `cached_tokens` answer for
        `tenant`'s waiting requests does, so policies may reuse what they derived from
        those hits; None if answers may change at any time."""
        ...


@dataclass
class EngineSnapshot:
    """A plain `EngineView`: a fixed state, with prefix hits from a table."""

    memory_tokens: int
    running: list[Running] = field(default_factory=list)
    now: float = 0.0
    mean_batch_time: float = 0.0
    memory_utilization: float = 0.0
    hits: dict[str, int] = field(default_factory=dict)
    block_size: int = 1

    def __post_init__(self) -> None:
        require_count("memory_tokens", self.memory_tokens, minimum=1)
        require_count("block_size", self.block_size, minimum=1)

    def cached_tokens(self, request: Request) -> int:
        return min(self.hits.get(request.request_id, 0), request.prompt_tokens)

    def hit_epoch(self, tenant: str) -> int | None:
        return None  # `hits` is a plain table anyone may change
