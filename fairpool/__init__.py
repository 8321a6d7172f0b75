"""fairpool: fair, locality-aware, multi-tenant LLM serving.

The core library decides; it has no network or Kubernetes code. `fairpool.sched` holds
the cost function, the radix tree, the local policies and the routers that the
simulator, the engines and the gateway all share.
"""

__version__ = "0.1.0"
