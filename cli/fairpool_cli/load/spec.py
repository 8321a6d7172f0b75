"""What a load run sends: the endpoint, the tenants and how each sends, the prompts, the
bounds. Every check names the command-line flag a value comes from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fairpool.sched.cost import CostModel
from fairpool.sched.errors import (
    ConfigError,
    require_count,
    require_non_negative,
    require_positive,
)
from fairpool.sim.trace import TraceRequest

SHAPES = ("shared-prefix", "documents", "multi-turn", "random")
APIS = ("chat", "completions", "responses", "embeddings")
DEFAULT_DURATION = 60.0


def check_url(url: str) -> str:
    """The base URL of an OpenAI API (`http://127.0.0.1:8080/v1`), without a trailing
    slash; a URL with no path gets `/v1`. Only http and https are accepted."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ConfigError("--url", f"must be an http:// or https:// URL, got {url!r}")
    if not parts.hostname:
        raise ConfigError("--url", f"has no host: {url!r}")
    if parts.query or parts.fragment:
        raise ConfigError("--url", f"must not have a query or fragment: {url!r}")
    path = parts.path.rstrip("/") or "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True)
class TenantSpec:
    """One tenant: its key (None: no Authorization header), its weight, and either a
    Poisson rate (open loop) or a number of requests kept in flight (closed loop).
    Prompt and output sizes, when given, override the run's."""

    name: str
    key: str | None = None
    weight: float = 1.0
    rate: float | None = None
    concurrency: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None

    def __post_init__(self) -> None:
        where = f"--tenant {self.name}"
        if not self.name or ":" in self.name or "," in self.name:
            raise ConfigError("--tenant", f"a name without ':' or ',', got {self.name!r}")
        require_positive(f"{where}: weight", self.weight)
        if self.rate is not None and self.concurrency is not None:
            raise ConfigError(where, "give rate or concurrency, not both")
        if self.rate is not None:
            require_positive(f"{where}: rate", self.rate)
        for part in ("concurrency", "prompt_tokens", "output_tokens"):
            value = getattr(self, part)
            if value is not None:
                require_count(f"{where}: {part.replace('_', '-')}", value, minimum=1)

    @property
    def open_loop(self) -> bool:
        return self.rate is not None

    def to_json(self) -> dict[str, Any]:
        """Everything but the key itself."""
        return {
            "name": self.name,
            "has_key": self.key is not None,
            "weight": self.weight,
            "rate": self.rate,
            "concurrency": self.concurrency,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }


@dataclass(frozen=True)
class PromptShape:
    """How prompts look. `prompt_tokens` is the long part (a system prompt, a document,
    a conversation's opening, or the whole prompt of `random`); `question_tokens` the
    short unique part. Sizes are in words: one token each in the simulated engine."""

    name: str = "shared-prefix"
    prompt_tokens: int = 512
    question_tokens: int = 32
    output_tokens: int = 64
    documents: int = 4
    turns: int = 6

    def __post_init__(self) -> None:
        if self.name not in SHAPES:
            raise ConfigError("--shape", f"unknown shape {self.name!r}; known: {', '.join(SHAPES)}")
        for part in ("prompt_tokens", "question_tokens", "output_tokens", "documents", "turns"):
            require_count(f"--{part.replace('_', '-')}", getattr(self, part), minimum=1)


@dataclass(frozen=True)
class LoadSpec:
    """A whole run. With a `trace`, the trace's requests replace the tenants' arrivals and
    the shape (its tenants must all be among `tenants`). At least one bound applies:
    `duration` (seconds; requests still in flight then are cancelled), `requests` (in
    total), or the trace's end."""

    url: str
    tenants: tuple[TenantSpec, ...]
    model: str | None = None
    api: str = "chat"
    shape: PromptShape = field(default_factory=PromptShape)
    trace: tuple[TraceRequest, ...] = ()
    duration: float | None = DEFAULT_DURATION
    requests: int | None = None
    seed: int = 0
    tag_tenants: bool = False
    ignore_eos: bool = False
    cost: CostModel = field(default_factory=CostModel)
    timeout: float = 300.0
    warmup: float = 0.0
    sample_interval: float = 0.25

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", check_url(self.url))
        if self.api not in APIS:
            raise ConfigError("--api", f"must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.duration is not None:
            require_positive("--duration", self.duration)
        if self.requests is not None:
            require_count("--requests", self.requests, minimum=1)
        if self.duration is None and self.requests is None and not self.trace:
            raise ConfigError("--duration", "a run needs a bound: --duration or --requests")
        require_positive("--timeout", self.timeout)
        require_non_negative("--warmup", self.warmup)
        if self.duration is not None and self.warmup >= self.duration:
            raise ConfigError("--warmup", f"must be shorter than --duration ({self.duration:g})")
        require_positive("sample_interval", self.sample_interval)
        self._check_tenants()

    def _check_tenants(self) -> None:
        if not self.tenants:
            raise ConfigError(
                "--tenant", "no tenants: give --tenant, --tenants-file or --keys-from"
            )
        names = [tenant.name for tenant in self.tenants]
        for name in names:
            if names.count(name) > 1:
                raise ConfigError(f"--tenant {name}", "given twice")
        if self.trace:
            missing = sorted({request.tenant for request in self.trace} - set(names))
            if missing:
                raise ConfigError("--trace", f"tenant {missing[0]!r} is not among the tenants")
            return
        for tenant in self.tenants:
            if tenant.rate is None and tenant.concurrency is None:
                raise ConfigError(
                    f"--tenant {tenant.name}", "give rate=R (requests/s) or concurrency=N"
                )

    def tenant(self, name: str) -> TenantSpec:
        return next(tenant for tenant in self.tenants if tenant.name == name)

    def to_json(self) -> dict[str, Any]:
        """The configuration, for the JSON report (keys left out)."""
        return {
            "url": self.url,
            "model": self.model,
            "api": self.api,
            "shape": None if self.trace else vars(self.shape),
            "trace_requests": len(self.trace) or None,
            "duration_s": self.duration,
            "requests": self.requests,
            "seed": self.seed,
            "tag_tenants": self.tag_tenants,
            "ignore_eos": self.ignore_eos,
            "warmup_s": self.warmup,
            "cost": {
                "extend_weight": self.cost.extend_weight,
                "output_weight": self.cost.output_weight,
            },
            "tenants": [tenant.to_json() for tenant in self.tenants],
        }
