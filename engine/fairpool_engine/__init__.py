"""fairpool_engine: the fair scheduler inside real vLLM, and `fairpool engine-sim`.

- `fairpool_engine.vllm`: the scheduler plugin vLLM loads with `--scheduler-cls`, and
  the `fairpool engine` launcher around vLLM's server; the only place that imports vLLM.
- `fairpool_engine.sim`: the simulated engine (`fairpool engine-sim`), with vLLM's HTTP
  surface and no vLLM.

Both engines read the same scheduler configuration (`fairpool.api.scheduler_config`),
reload it when the file changes (`live`), and export the same per-tenant metrics
(`tenant_metrics`).
"""
