"""fairpool_engine: the fair scheduler inside real vLLM, and `fairpool engine-sim`.

Both engines read the same scheduler configuration (`fairpool.api.scheduler_config`),
reload it when the file changes (`live`), and export the same per-tenant metrics
(`tenant_metrics`). Only the `vllm_*` modules import vLLM.
"""
