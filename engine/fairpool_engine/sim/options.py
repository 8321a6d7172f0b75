"""The options of `fairpool engine-sim`, validated, and their command-line form.

This module imports nothing beyond the core library, so `fairpool --help` does not need
the engine's dependencies.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fairpool.sched.errors import ConfigError, require_count, require_positive
from fairpool.sim.profiles import get_profile
from fairpool_engine.live import CHECK_INTERVAL

DEFAULT_PROFILE = "llama3-8b-h100"  # paged KV, as vLLM's


@dataclass(frozen=True)
class SimOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "sim"
    max_model_len: int = 8192
    profile: str = DEFAULT_PROFILE
    memory_tokens: int | None = None
    policy: str | None = None
    scheduler_config: str | None = None
    speedup: float = 1.0
    seed: int = 0
    eos_after: tuple[int, int] | None = None
    embedding_dim: int = 768
    error_rate: float = 0.0
    hang_rate: float = 0.0
    crash_rate: float = 0.0
    access_log: bool = True
    reload_interval: float = CHECK_INTERVAL  # not on the command line: tests shorten it

    def __post_init__(self) -> None:
        require_count("--port", self.port)
        if self.port > 65535:
            raise ConfigError("--port", f"must be <= 65535, got {self.port}")
        if not self.model:
            raise ConfigError("--model", "must not be empty")
        require_count("--max-model-len", self.max_model_len, minimum=1)
        profile = get_profile(self.profile)
        if self.memory_tokens is not None:
            require_count("--memory-tokens", self.memory_tokens, minimum=1)
        memory = self.memory_tokens or profile.memory_tokens
        blocks = -(-self.max_model_len // profile.block_size) * profile.block_size
        if blocks > memory:
            raise ConfigError(
                "--max-model-len",
                f"{self.max_model_len} tokens do not fit the KV memory of {memory} tokens "
                "(raise --memory-tokens or lower --max-model-len)",
            )
        require_positive("--speedup", self.speedup)
        require_count("--embedding-dim", self.embedding_dim, minimum=1)
        require_positive("reload_interval", self.reload_interval)
        if self.eos_after is not None:
            low, high = self.eos_after
            require_count("--eos-after", low, minimum=1)
            if high < low:
                raise ConfigError("--eos-after", f"MAX must be >= MIN, got {low}:{high}")
        for name in ("error_rate", "hang_rate", "crash_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ConfigError(_flag(name), f"must be in [0, 1], got {rate}")
        if self.error_rate + self.hang_rate + self.crash_rate > 1.0:
            raise ConfigError("--error-rate", "--error-rate + --hang-rate + --crash-rate > 1")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SimOptions()
    add = parser.add_argument
    add("--host", default=defaults.host, help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, default=defaults.port, help="port (default 8000)")
    add("--model", default=defaults.model, help="served model name (default sim)")
    add("--max-model-len", type=int, default=defaults.max_model_len, help="context (8192)")
    add("--profile", default=defaults.profile, help=f"engine profile ({DEFAULT_PROFILE})")
    add("--memory-tokens", type=int, help="KV memory in tokens (default: the profile's)")
    add("--policy", help="scheduling policy, overriding the scheduler configuration's")
    add(
        "--scheduler-config",
        metavar="FILE",
        help="scheduler configuration, reloaded when it changes "
        "(default: $FAIRPOOL_SCHEDULER_CONFIG, else policy dlpm)",
    )
    add("--speedup", type=float, default=1.0, help="model seconds per wall second (1)")
    add("--seed", type=int, default=0, help="seeds output text and failure injection (0)")
    add(
        "--eos-after",
        metavar="MIN[:MAX]",
        type=_eos_range,
        help="outputs end (finish_reason stop) after MIN..MAX tokens, unless the request "
        "sets ignore_eos (default: every output runs to max_tokens)",
    )
    add(
        "--embedding-dim",
        type=int,
        default=defaults.embedding_dim,
        help="length of the vectors /v1/embeddings returns (768)",
    )
    add("--error-rate", type=float, default=0.0, help="fraction answered 500 (test only)")
    add("--hang-rate", type=float, default=0.0, help="fraction never answered (test only)")
    add("--crash-rate", type=float, default=0.0, help="fraction cut mid-stream (test only)")
    add(
        "--disable-uvicorn-access-log",
        action="store_true",
        help="no log line per request (as vLLM's option)",
    )


def from_args(args: argparse.Namespace) -> SimOptions:
    return SimOptions(
        host=args.host,
        port=args.port,
        model=args.model,
        max_model_len=args.max_model_len,
        profile=args.profile,
        memory_tokens=args.memory_tokens,
        policy=args.policy,
        scheduler_config=args.scheduler_config,
        speedup=args.speedup,
        seed=args.seed,
        eos_after=args.eos_after,
        embedding_dim=args.embedding_dim,
        error_rate=args.error_rate,
        hang_rate=args.hang_rate,
        crash_rate=args.crash_rate,
        access_log=not args.disable_uvicorn_access_log,
    )


def _eos_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN or MIN:MAX, got {text!r}") from None
