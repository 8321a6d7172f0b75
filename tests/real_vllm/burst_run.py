"""Child process of `test_vllm_plugin.py`: one flooding tenant and one light tenant with
twice its weight, through a real in-process vLLM engine with the fair scheduler, arrivals
in the order the test sets (not the order a busy machine hands them over in); prints the
tenants in the order they were admitted, as JSON.

Run as `python burst_run.py MODEL_DIR POLICY` (vLLM's CPU build; POLICY `vtc` or `fcfs`).
"""

from __future__ import annotations

import json
import sys

from in_process import fair_engine
from vllm import SamplingParams

FLOOD = 32
LIGHT = 8
WEIGHTS = {"flood": 1.0, "light": 2.0}


def main(model: str, policy: str) -> None:
    fields = {"policy": policy, "tenants": WEIGHTS, "cost": {"outputWeight": 2}}
    engine, scheduler = fair_engine(
        model,
        fields if policy != "fcfs" else {"policy": "fcfs"},
        max_num_seqs=2,
        kv_cache_memory_bytes=64 << 20,
    )

    def add(tenant: str, index: int) -> None:
        params = SamplingParams(
            max_tokens=64, ignore_eos=True, temperature=0, extra_args={"fairpool_tenant": tenant}
        )
        prompt = f"request {index} from {tenant}: def handler(event, context): return"
        engine.add_request(f"{tenant}-{index}", prompt, params)

    admitted: list[str] = []
    check_charged = scheduler._check_charged_hits

    def record_admissions(output: object) -> None:
        for new in output.scheduled_new_reqs:  # type: ignore[attr-defined]
            admitted.append(new.req_id.split("-")[0])
        check_charged(output)

    scheduler._check_charged_hits = record_admissions  # type: ignore[method-assign]
    for index in range(FLOOD):
        add("flood", index)
    while len(admitted) < 2:  # the flood holds the engine; then the light tenant arrives
        engine.step()
    for index in range(LIGHT):
        add("light", index)
    while engine.has_unfinished_requests():
        engine.step()
    print(json.dumps({"admitted": admitted}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
