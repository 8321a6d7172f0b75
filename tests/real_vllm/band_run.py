"""Child process of `test_vllm_bands.py`: tenant `fast` in band interactive, `bulk` in
batch (the scheduler configuration's `tenantBands`), through a real in-process vLLM
engine with the fair scheduler, arrivals in the order this script sets. Prints JSON.

Run as `python band_run.py MODEL_DIR SCENARIO POLICY` (vLLM's CPU build):

- `admission`: two of 12 bulk requests run (the engine runs two at a time), then 4 fast
  ones arrive behind the 10 queued; prints the tenants in the order they were admitted.
- `preemption`: 8 bulk requests run, then 8 fast ones arrive, on a KV cache of 4,096
  tokens that 16 growing requests overflow; prints, for each preemption, the victim's
  band and the bands of the requests still running, and each request's output length.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from in_process import fair_engine
from vllm import SamplingParams

BANDS = {"fast": "interactive", "bulk": "batch"}


def params(tenant: str, max_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        ignore_eos=True,
        temperature=0,
        extra_args={"fairpool_tenant": tenant},
    )


def prompt(tenant: str, index: int) -> str:
    return f"request {index} from {tenant}: def handler(event, context): return"


def admission(model: str, policy: str) -> dict[str, Any]:
    engine, scheduler = fair_engine(
        model,
        {"policy": policy, "tenantBands": BANDS},
        max_num_seqs=2,
        kv_cache_memory_bytes=64 << 20,
    )
    admitted: list[str] = []
    check_charged = scheduler._check_charged_hits

    def record_admissions(output: Any) -> None:
        admitted.extend(new.req_id.split("-")[0] for new in output.scheduled_new_reqs)
        check_charged(output)

    scheduler._check_charged_hits = record_admissions
    for index in range(12):
        engine.add_request(f"bulk-{index}", prompt("bulk", index), params("bulk", 32))
    while len(admitted) < 2:  # bulk holds the engine, 10 more queued; then fast arrives
        engine.step()
    for index in range(4):
        engine.add_request(f"fast-{index}", prompt("fast", index), params("fast", 32))
    while engine.has_unfinished_requests():
        engine.step()
    return {"admitted": admitted}


def preemption(model: str, policy: str) -> dict[str, Any]:
    # 4 MiB of KV is 4,096 tokens (32 blocks) of the tiny model: 16 requests that grow to
    # 4 blocks each need twice that, so vLLM preempts and recomputes.
    engine, scheduler = fair_engine(
        model,
        {"policy": policy, "tenantBands": BANDS},
        max_num_seqs=16,
        kv_cache_memory_bytes=4 << 20,
    )
    bands = scheduler.live.policy.weights.band_of
    preemptions: list[tuple[str, list[str]]] = []
    preempted = scheduler.preempted

    def record_preemption(request_id: str) -> None:
        still_running = {
            bands(scheduler.policy_requests[request.request_id].tenant)
            for request in scheduler.running
        }  # vLLM takes the victim out of its running list first
        victim = bands(scheduler.policy_requests[request_id].tenant)
        preemptions.append((victim, sorted(still_running)))
        preempted(request_id)

    scheduler.preempted = record_preemption
    for index in range(8):
        engine.add_request(f"bulk-{index}", prompt("bulk", index), params("bulk", 400))
    while len(scheduler.running) < 8:
        engine.step()
    for index in range(8):
        engine.add_request(f"fast-{index}", prompt("fast", index), params("fast", 400))
    produced: dict[str, int] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                produced[output.request_id] = len(output.outputs[0].token_ids)
    return {"preemptions": preemptions, "produced": produced}


if __name__ == "__main__":
    scenario = {"admission": admission, "preemption": preemption}[sys.argv[2]]
    print(json.dumps(scenario(sys.argv[1], sys.argv[3])))
