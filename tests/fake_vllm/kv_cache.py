"""Fake `vllm.v1.core.{kv_cache_utils, block_pool, single_type_kv_cache_manager,
kv_cache_coordinator, kv_cache_manager}`: a paged KV cache with vLLM's prefix cache.

The parts fairpool's plugin depends on behave as in vLLM 0.32: blocks are cached (their
hash inserted in `BlockPool.cached_block_hash_to_block`) when they are allocated for
tokens being computed; freed blocks stay cached in an LRU free queue (unhashed ones are
reused first); reusing a cached free block pops its hash from the map; a hit is the run
of leading full blocks found in the map, capped at the prompt length − 1;
`reset_prefix_cache` replaces the map by a new object.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fake_vllm.request import Request


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    return block_hash + group_id.to_bytes(4, "big", signed=False)


NONE_HASH = b"\0" * 32  # the parent of a request's first block


def get_request_block_hasher(
    hash_block_size: int, caching_hash_fn: Callable[[Any], bytes]
) -> Callable[[Request], list[bytes]]:
    """The hashes of a request's full blocks not hashed yet: each block's hash covers its
    parent's hash, its tokens and (first block only) the cache salt, as in vLLM."""

    def hasher(request: Request) -> list[bytes]:
        hashes: list[bytes] = []
        start = len(request.block_hashes) * hash_block_size
        parent = request.block_hashes[-1] if request.block_hashes else NONE_HASH
        tokens = request.all_token_ids
        while start + hash_block_size <= len(tokens):
            extra = (request.cache_salt,) if start == 0 and request.cache_salt else None
            parent = caching_hash_fn((parent, tokens[start : start + hash_block_size], extra))
            hashes.append(parent)
            start += hash_block_size
        return hashes

    return hasher


def sha256(value: Any) -> bytes:
    """A stand-in for vLLM's `sha256_cbor` (it hashes a deterministic encoding)."""
    return hashlib.sha256(repr(value).encode()).digest()


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    is_null: bool = False


class BlockHashToBlockMap:
    def __init__(self) -> None:
        self._cache: dict[bytes, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if isinstance(blocks, dict):
            return next(iter(blocks.values()))
        return blocks

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif isinstance(blocks, KVCacheBlock):
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.pop(key, None)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            if blocks.block_id == block_id:
                return blocks
            self._cache[key] = blocks
            return None
        block = blocks.pop(block_id, None)
        if blocks:
            self._cache[key] = blocks
        return block

    def __len__(self) -> int:
        return len(self._cache)


class BlockPool:
    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.blocks = [KVCacheBlock(block_id) for block_id in range(num_gpu_blocks)]
        # Free blocks in eviction order (first out first).
        self.free_block_queue: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (block.block_id, block) for block in self.blocks
        )
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popitem(last=False)[1]
        self.null_block.is_null = True

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: list[int]
    ) -> list[KVCacheBlock] | None:
        found = []
        for group_id in kv_cache_group_ids:
            key = make_block_hash_with_group_id(block_hash, group_id)
            block = self.cached_block_hash_to_block.get_one_block(key)
            if block is None:
                return None
            found.append(block)
        return found

    def cache_full_blocks(
        self, request: Request, blocks: list[KVCacheBlock], num_cached_blocks: int,
        num_full_blocks: int, block_size: int, kv_cache_group_id: int,
    ) -> None:  # fmt: skip
        for index in range(num_cached_blocks, num_full_blocks):
            block = blocks[index]
            if block.block_hash is not None:
                continue
            key = make_block_hash_with_group_id(request.block_hashes[index], kv_cache_group_id)
            block.block_hash = key
            self.cached_block_hash_to_block.insert(key, block)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        new = [self.free_block_queue.popitem(last=False)[1] for _ in range(num_blocks)]
        for block in new:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            block.ref_cnt += 1
        return new

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        if block.block_hash is None:
            return False
        self.cached_block_hash_to_block.pop(block.block_hash, block.block_id)
        block.block_hash = None
        return True

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                del self.free_block_queue[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        first, last = [], []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                (first if block.block_hash is None else last).append(block)
        for block in reversed(first):
            self.free_block_queue[block.block_id] = block
            self.free_block_queue.move_to_end(block.block_id, last=False)
        for block in last:
            self.free_block_queue[block.block_id] = block

    def reset_prefix_cache(self) -> bool:
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:  # the null block
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.block_hash = None
        return True

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def get_usage(self) -> float:
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)


class FullAttentionManager:
    def __init__(self, block_size: int, block_pool: BlockPool, kv_cache_group_id: int = 0) -> None:
        self.block_size = block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.use_eagle = False
        self.dcp_world_size = 1
        self.pcp_world_size = 1
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> list[KVCacheBlock]:
        hit: list[KVCacheBlock] = []
        for block_hash in block_hashes[: max_length // self.block_size]:
            found = self.block_pool.get_cached_block(block_hash, [self.kv_cache_group_id])
            if found is None:
                break
            hit.append(found[0])
        return hit

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> int:
        held = len(self.req_to_blocks.get(request_id, ()))
        needed = -(-num_tokens // self.block_size) - len(new_computed_blocks) - held
        evictable = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        return max(needed, 0) + evictable

    def allocate(
        self, request_id: str, computed: Sequence[KVCacheBlock], num_tokens: int
    ) -> list[KVCacheBlock]:
        blocks = self.req_to_blocks.setdefault(request_id, [])
        self.block_pool.touch(computed)
        blocks.extend(computed)
        needed = -(-num_tokens // self.block_size) - len(blocks)
        new = self.block_pool.get_new_blocks(needed) if needed > 0 else []
        blocks.extend(new)
        return new

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        cached = self.num_cached_block.get(request.request_id, 0)
        full = min(num_tokens // self.block_size, len(request.block_hashes))
        if full > cached:
            blocks = self.req_to_blocks[request.request_id]
            self.block_pool.cache_full_blocks(
                request, blocks, cached, full, self.block_size, self.kv_cache_group_id
            )
            self.num_cached_block[request.request_id] = full

    def free(self, request_id: str) -> None:
        blocks = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(reversed(blocks))  # tail blocks are evicted first
        self.num_cached_block.pop(request_id, None)


class UnitaryKVCacheCoordinator:
    """One full-attention KV-cache group: the layout fairpool follows exactly."""

    def __init__(self, block_pool: BlockPool, block_size: int) -> None:
        self.block_pool = block_pool
        self.single_type_managers = (FullAttentionManager(block_size, block_pool),)


class HybridKVCacheCoordinator(UnitaryKVCacheCoordinator):
    """Stands for vLLM's other layouts (hybrid, EAGLE): caching behaves the same here,
    but fairpool cannot follow the cache's changes and falls back to periodic lookups."""


@dataclass
class KVCacheBlocks:
    blocks: tuple[Sequence[KVCacheBlock], ...] = field(default_factory=lambda: ((),))

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([block.block_id for block in group] for group in self.blocks)


class KVCacheManager:
    def __init__(
        self, num_gpu_blocks: int, block_size: int, max_model_len: int,
        enable_caching: bool = True, coordinator_cls: type = UnitaryKVCacheCoordinator,
    ) -> None:  # fmt: skip
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, block_size)
        self.coordinator = coordinator_cls(self.block_pool, block_size)
        self.empty_kv_cache_blocks = KVCacheBlocks(((),))
        #: Every `get_computed_blocks` call, for tests that count lookups.
        self.lookups = 0

    @property
    def _manager(self) -> FullAttentionManager:
        manager: FullAttentionManager = self.coordinator.single_type_managers[0]
        return manager

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int, int]:
        self.lookups += 1
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        hit = self._manager.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        return KVCacheBlocks((hit,)), len(hit) * self._manager.block_size, 0

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
    ) -> KVCacheBlocks | None:
        computed = new_computed_blocks.blocks[0] if new_computed_blocks is not None else ()
        computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens = min(
            computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len
        )
        manager = self._manager
        needed = manager.get_num_blocks_to_allocate(request.request_id, num_tokens, computed)
        if needed > self.block_pool.get_num_free_blocks():
            return None
        new = manager.allocate(request.request_id, computed, num_tokens)
        if self.enable_caching:
            manager.cache_blocks(request, min(computed_tokens + num_new_tokens, request.num_tokens))
        return KVCacheBlocks((new,))

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks((list(self._manager.req_to_blocks.get(request_id, ())),))

    def free(self, request: Request) -> None:
        self._manager.free(request.request_id)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        pass

    def new_step_starts(self) -> None:
        pass
