"""A small fake of vLLM 0.32's V1 scheduler, for fast tests of fairpool's plugin.

`installed()` puts fake modules under vLLM's own module paths (`vllm.v1.request`,
`vllm.v1.core.sched.scheduler`, …; `LAYOUT` lists each name) into `sys.modules`, imports
`fairpool_engine.vllm.{compat, request_queue, scheduler}` against them, and restores
everything on exit, so the plugin's code runs unchanged and the fast tier needs no vLLM.
`FakeEngine` (`fake_vllm.engine`) is EngineCore's loop around the plugin: it adds
requests, steps (`schedule` → a model runner → `update_from_output`) and aborts.
`tests/real_vllm/test_fake_vllm_matches.py` checks the names and signatures against the
real vLLM.

What it models, as vLLM 0.32 does it: the scheduling step (running requests first within
a token budget and `max_num_seqs`, chunked prefill, preemption of the most recently
admitted request back to `waiting.prepend_request` when KV blocks run out, no admission
in a step that preempted, waiting requests admitted through
`peek_request`/`_get_local_prefix_cache_hit`/`allocate_slots`/`pop_request` until the
first that does not fit, blocked requests skipped and given back with
`prepend_requests`, `kv_holding_waiting` drained first); the paged KV cache with prefix
caching (chained block hashes salted by `cache_salt`, blocks cached at allocation, LRU
reuse of freed blocks that pops their hashes from `cached_block_hash_to_block`, hits
capped at the prompt length − 1, `reset_prefix_cache` replacing the map); finishing at
`max_tokens` or the context length in `update_from_output`, pooling requests finishing
with their pooler output, `finish_requests` for aborts, `_free_request` for both.

What it does not model: async scheduling (output placeholders: `AsyncScheduler` is the
same class here), speculative decoding, structured-output grammars (beyond a blocked
status), LoRA, multimodal encoders, KV connectors and their external hits, the priority
policy's heap, EOS and stop strings, watermark and `full_sequence_must_fit`, hybrid or
sliding-window KV layouts (`HybridKVCacheCoordinator` only stands for them: same caching,
but not the layout the plugin follows), logprobs, stats and KV events. Token ids come
from the test, and the model runner samples one made-up token per request and step.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass

from fake_vllm import kv_cache, request, scheduler

VERSION = "0.32.0"

#: The fake's modules: vLLM's module path → the names the fake provides there.
LAYOUT: dict[str, dict[str, object]] = {
    "vllm.logger": {"init_logger": logging.getLogger},
    "vllm.sampling_params": {"SamplingParams": request.SamplingParams},
    "vllm.pooling_params": {"PoolingParams": request.PoolingParams},
    "vllm.config": {
        name: getattr(scheduler, name)
        for name in ("VllmConfig", "SchedulerConfig", "CacheConfig", "ModelConfig")
    },
    "vllm.v1.request": {"Request": request.Request, "RequestStatus": request.RequestStatus},
    "vllm.v1.core.kv_cache_utils": {
        name: getattr(kv_cache, name)
        for name in ("KVCacheBlock", "make_block_hash_with_group_id", "get_request_block_hasher")
    },
    "vllm.v1.core.block_pool": {
        "BlockHashToBlockMap": kv_cache.BlockHashToBlockMap,
        "BlockPool": kv_cache.BlockPool,
    },
    "vllm.v1.core.single_type_kv_cache_manager": {
        "FullAttentionManager": kv_cache.FullAttentionManager
    },
    "vllm.v1.core.kv_cache_coordinator": {
        "UnitaryKVCacheCoordinator": kv_cache.UnitaryKVCacheCoordinator,
        "HybridKVCacheCoordinator": kv_cache.HybridKVCacheCoordinator,
    },
    "vllm.v1.core.kv_cache_manager": {
        "KVCacheManager": kv_cache.KVCacheManager,
        "KVCacheBlocks": kv_cache.KVCacheBlocks,
    },
    "vllm.v1.core.sched.request_queue": {
        name: getattr(scheduler, name)
        for name in ("RequestQueue", "FCFSRequestQueue", "SchedulingPolicy", "create_request_queue")
    },
    "vllm.v1.core.sched.output": {
        name: getattr(scheduler, name)
        for name in ("SchedulerOutput", "NewRequestData", "CachedRequestData")
    },
    "vllm.v1.core.sched.scheduler": {"Scheduler": scheduler.Scheduler},
    "vllm.v1.core.sched.async_scheduler": {"AsyncScheduler": scheduler.AsyncScheduler},
    "vllm.v1.outputs": {"ModelRunnerOutput": scheduler.ModelRunnerOutput},
    "vllm.v1.engine": {
        "EngineCoreOutput": scheduler.EngineCoreOutput,
        "EngineCoreOutputs": scheduler.EngineCoreOutputs,
    },
}
#: What is the fake's own rather than vLLM's, which the real-vLLM check skips: counters
#: for tests, the fake's choice of KV-cache coordinator, and internal helpers whose
#: signatures differ from vLLM's (nothing in the plugin calls them).
FAKE_ONLY = frozenset(
    {
        "Scheduler.num_preemptions",
        "KVCacheManager.__init__",
        "KVCacheManager.lookups",
        "KVCacheManager._manager",
        "VllmConfig.kv_cache_coordinator",
        "UnitaryKVCacheCoordinator.__init__",
        "FullAttentionManager.__init__",
        "FullAttentionManager.find_longest_cache_hit",
        "FullAttentionManager.get_num_blocks_to_allocate",
        "FullAttentionManager.allocate",
        "FullAttentionManager.cache_blocks",
        "FullAttentionManager.free",
    }
)
PACKAGES = ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched")
#: The plugin's modules that import vLLM, imported afresh against the fake.
PLUGIN_MODULES = (
    "fairpool_engine.vllm.compat",
    "fairpool_engine.vllm.request_queue",
    "fairpool_engine.vllm.scheduler",
)


@dataclass(frozen=True)
class Plugin:
    """fairpool's plugin modules, imported against the fake."""

    compat: types.ModuleType
    request_queue: types.ModuleType
    scheduler: types.ModuleType


@contextlib.contextmanager
def installed(version: str = VERSION) -> Iterator[Plugin]:
    """The fake as `vllm` (reporting `version`) and the plugin imported against it."""
    names = [*PACKAGES, *LAYOUT, *PLUGIN_MODULES]
    saved = {name: sys.modules.get(name) for name in names}
    parent = importlib.import_module("fairpool_engine.vllm")
    saved_attributes = {
        name: parent.__dict__.get(name.rpartition(".")[2]) for name in PLUGIN_MODULES
    }
    try:
        for name in PLUGIN_MODULES:
            sys.modules.pop(name, None)
        for name in (*PACKAGES, *LAYOUT):
            module = types.ModuleType(name, "fairpool's fake of vLLM (tests/fake_vllm)")
            if name in PACKAGES:
                module.__path__ = []
            module.__dict__.update(LAYOUT.get(name, {}))
            sys.modules[name] = module
        for name in (*PACKAGES, *LAYOUT):
            package, _, leaf = name.rpartition(".")
            if package:
                setattr(sys.modules[package], leaf, sys.modules[name])
        sys.modules["vllm"].__version__ = version  # type: ignore[attr-defined]
        yield Plugin(*(importlib.import_module(name) for name in PLUGIN_MODULES))
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        for name, attribute in saved_attributes.items():
            leaf = name.rpartition(".")[2]
            if attribute is None:
                parent.__dict__.pop(leaf, None)
            else:
                setattr(parent, leaf, attribute)
