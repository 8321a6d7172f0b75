"""SGLang router's `cache_aware` policy, with its current defaults.

SGLang model gateway, `policies/cache_aware.rs` (reference digest anchors §4):

1. If the pool is imbalanced — max load − min load > `balance_abs_threshold` and
   max load > `balance_rel_threshold` × min load, load being in-flight requests — route to
   the least-loaded worker.
2. Otherwise match the prompt against the approximate tree: if more than
   `cache_threshold` of it is cached somewhere, route to a worker holding the longest
   match (the least loaded of them); else to the least-loaded worker.
3. Either way, insert the prompt under the chosen worker.
"""

from __future__ import annotations

from collections.abc import Iterable

from fairpool.sched.errors import ConfigError, require_non_negative, require_positive
from fairpool.sched.routers.base import DEFAULT_TREE_TOKENS, PrefixRouter, RouteRequest


class CacheAware(PrefixRouter):
    """Prefix match above a threshold, unless load is imbalanced (SGLang's defaults)."""

    name = "cache_aware"

    def __init__(
        self,
        workers: Iterable[str] = (),
        cache_threshold: float = 0.3,
        balance_abs_threshold: float = 64,
        balance_rel_threshold: float = 1.5,
        max_tree_tokens: int = DEFAULT_TREE_TOKENS,
        min_match: int = 0,
        max_tree_nodes: int | None = None,
    ) -> None:
        threshold = require_non_negative("cache_threshold", cache_threshold)
        if threshold > 1:
            raise ConfigError("cache_threshold", f"must be within [0, 1], got {cache_threshold!r}")
        self.cache_threshold = threshold
        self.balance_abs_threshold = require_non_negative(
            "balance_abs_threshold", balance_abs_threshold
        )
        self.balance_rel_threshold = require_positive(
            "balance_rel_threshold", balance_rel_threshold
        )
        super().__init__(workers, max_tree_tokens, min_match, max_tree_nodes)

    def is_imbalanced(self) -> bool:
        loads = [state.outstanding for state in self.workers.values()]
        high, low = max(loads), min(loads)
        return high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low

    def _choose(self, request: RouteRequest, candidates: list[str]) -> str:
        if self.is_imbalanced():
            return self._least_loaded(candidates)
        length, holders = self._longest_match(request)
        eligible = set(candidates)
        holders = [worker for worker in holders if worker in eligible]
        key_length = len(request.key)
        if holders and key_length and length / key_length > self.cache_threshold:
            return self._least_loaded(holders)
        return self._least_loaded(candidates)
