"""Child process of `test_vllm_plugin.py`: one flooding tenant and one light tenant with
twice its weight, through a real in-process vLLM engine with the fair scheduler, arrivals
in the order the test sets (not the order a busy machine hands them over in); prints the
tenants in the order they were admitted, as JSON.

Run as `python burst_run.py MODEL_DIR POLICY` (vLLM's CPU build; POLICY `vtc` or `fcfs`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")

from vllm import LLM, SamplingParams

from fairpool_engine.vllm.scheduler import FairSchedulingMixin

FLOOD = 32
LIGHT = 8
WEIGHTS = {"flood": 1.0, "light": 2.0}


def main(model: str, policy: str) -> None:
    config = Path(tempfile.mkdtemp()) / "scheduler.json"
    fields = {"policy": policy, "tenants": WEIGHTS, "cost": {"outputWeight": 2}}
    config.write_text(json.dumps(fields if policy != "fcfs" else {"policy": "fcfs"}))
    os.environ["FAIRPOOL_SCHEDULER_CONFIG"] = str(config)
    llm = LLM(
        model=model, dtype="float32", max_model_len=1024, enforce_eager=True, seed=0,
        max_num_seqs=2, max_num_batched_tokens=1024, kv_cache_memory_bytes=64 << 20,
        scheduler_cls="fairpool_engine.vllm.scheduler.FairScheduler",
    )  # fmt: skip
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    assert isinstance(scheduler, FairSchedulingMixin)

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
