"""A real vLLM engine with the fair scheduler, in this process, for the driver scripts of
this directory (`burst_run.py`, `hit_tracking_run.py`): their requests reach the scheduler
in the order they add them, with no API server in between. Import it before vLLM."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")

from vllm import LLM

from fairpool_engine.vllm.scheduler import FairSchedulingMixin


def fair_engine(model: str, scheduler: dict[str, Any], **options: Any) -> tuple[Any, Any]:
    """vLLM's engine over the tiny `model` with fairpool's scheduler configured by
    `scheduler` (the engine's configuration file), and that scheduler. `options` are
    `vllm.LLM`'s, over the tests' common ones."""
    config = Path(tempfile.mkdtemp()) / "scheduler.json"
    config.write_text(json.dumps(scheduler))
    os.environ["FAIRPOOL_SCHEDULER_CONFIG"] = str(config)
    settings: dict[str, Any] = {
        "dtype": "float32", "max_model_len": 1024, "enforce_eager": True, "seed": 0,
        "max_num_batched_tokens": 1024,
        "scheduler_cls": "fairpool_engine.vllm.scheduler.FairScheduler",
    }  # fmt: skip
    engine = LLM(model=model, **{**settings, **options}).llm_engine
    fair = engine.engine_core.engine_core.scheduler
    assert isinstance(fair, FairSchedulingMixin)
    return engine, fair
