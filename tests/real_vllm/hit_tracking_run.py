"""Child process of `test_vllm_prefix_hits.py`: drives a real in-process vLLM engine with
the fair scheduler through prefix-cache churn and checks, at every pick, that each hit
the scheduler follows equals a fresh lookup; prints the counts as JSON.

Run as `python hit_tracking_run.py MODEL_DIR` (vLLM's CPU build).
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from in_process import fair_engine
from vllm import SamplingParams

from fairpool.sched.policy import LocalPolicy
from fairpool_engine.vllm import compat

TENANTS = 6
STEPS = 300


def main(model: str) -> None:
    # 2 MiB of KV is 16 blocks of 128 tokens: prefixes are evicted and stored again.
    engine, scheduler = fair_engine(
        model, {"policy": "dlpm", "quantum": 256}, max_num_seqs=4, kv_cache_memory_bytes=2 << 20
    )
    counts: Counter[str] = Counter()

    def check_followed_hits() -> None:
        for request_id, followed in scheduler.view.followed_hits().items():
            request = scheduler.requests[request_id]
            fresh = compat.prefix_lookup(scheduler.kv_cache_manager, request, 128)[0]
            by_vllm = scheduler.kv_cache_manager.get_computed_blocks(request)[1]
            counts["checked"] += 1
            counts["mismatched"] += followed != fresh
            counts["unlike_vllm"] += fresh != by_vllm
            counts["hit_blocks"] += fresh // 128

    next_request = LocalPolicy.next_request

    def checked_next_request(self: LocalPolicy, view: object) -> object:
        check_followed_hits()
        return next_request(self, view)  # type: ignore[arg-type]

    LocalPolicy.next_request = checked_next_request  # type: ignore[method-assign]
    block_map_type = compat.ObservedBlockMap
    insert, pop = block_map_type.insert, block_map_type.pop

    def counted_insert(self: compat.ObservedBlockMap, key: bytes, block: object) -> None:
        counts["stored"] += 1
        insert(self, key, block)

    def counted_pop(self: compat.ObservedBlockMap, key: bytes, block_id: int) -> object:
        counts["dropped"] += 1
        return pop(self, key, block_id)

    block_map_type.insert = counted_insert  # type: ignore[method-assign]
    block_map_type.pop = counted_pop  # type: ignore[method-assign]

    check_charged = scheduler._check_charged_hits

    def checked_charges(output: object) -> None:
        charged = scheduler.waiting.charged_hits
        for new in output.scheduled_new_reqs:  # type: ignore[attr-defined]
            if new.req_id in charged:
                counts["admitted"] += 1
                counts["charged_wrong"] += charged[new.req_id] != new.num_computed_tokens
        check_charged(output)

    scheduler._check_charged_hits = checked_charges  # type: ignore[method-assign]
    # Conversations: each turn's prompt extends the previous one, so a turn admitted
    # lengthens the hit of the next turn waiting behind it.
    added = 0
    for step in range(STEPS):
        while len(scheduler.waiting) < 24:
            tenant = added % TENANTS
            turn = (added // TENANTS) % 4
            prompt = f"tenant {tenant} system rules. " * 30
            turns = (f"turn {t}: question {t} of tenant {tenant}." * 8 for t in range(turn))
            prompt += " ".join(turns)
            prompt += f" request {added}"
            params = SamplingParams(
                max_tokens=8, ignore_eos=True, extra_args={"fairpool_tenant": f"t{tenant}"}
            )
            engine.add_request(str(added), prompt, params)
            added += 1
        engine.step()
        if step == STEPS // 2:
            while engine.has_unfinished_requests():  # drain, then empty the cache
                engine.step()
            counts["reset"] += bool(scheduler.reset_prefix_cache())
    print(json.dumps(dict(counts)))


if __name__ == "__main__":
    main(sys.argv[1])
