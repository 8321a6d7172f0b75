"""fairpool's scheduler inside real vLLM, and the `fairpool engine` launcher.

The only subpackage that imports vLLM, and only in `compat` (the plugin's one window on
vLLM's scheduler), `scheduler` and `main`; `launch`, `middleware` and `tiny_model` run
without it. This `__init__` imports nothing, so that `import vllm` in these modules,
an absolute import, always means vLLM itself.
"""
