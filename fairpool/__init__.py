"""fairpool: fair, locality-aware, multi-tenant LLM serving.

The core library decides; it has no network or Kubernetes code. `fairpool.sched` holds
the cost function, the radix tree, the local policies and the routers that the
simulator, the engines and the gateway all share. It imports none of the components
(fairpool_gateway, fairpool_engine, fairpool_operator) nor the programs (fairpool_cli,
fairpool_reproduce): they import it.
"""

__version__ = "0.1.0"
