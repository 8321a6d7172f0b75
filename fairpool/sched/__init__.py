"""fairpool.sched: one implementation of each scheduling algorithm.

- `cost`: service = w_e·extend + w_q·output, tenant weights.
- `radix`: the prefix tree of engines' caches and the gateway's approximate tree.
- `policies`: what one engine admits next (fcfs, lpm, vtc, dlpm, mcsf, slai; `+memsafe`).
- `memory`: memory-safe admission (seed 002).
- `batch`: one continuous-batching step.
- `routers`: which worker gets a request (round_robin, least_load, cache_aware, d2lpm).
- `registry`: all of the above by name.
"""

from fairpool.sched.batch import BatchPlan, form_batch
from fairpool.sched.cost import CostModel, TenantWeights
from fairpool.sched.errors import ConfigError
from fairpool.sched.policy import LocalPolicy
from fairpool.sched.radix import Match, RadixTree
from fairpool.sched.registry import POLICIES, ROUTERS, make_policy, make_router, policy_names
from fairpool.sched.requests import SLO, EngineSnapshot, EngineView, Request, Running
from fairpool.sched.routers import Router, RouteRequest, WorkerState

__all__ = [
    "POLICIES",
    "ROUTERS",
    "SLO",
    "BatchPlan",
    "ConfigError",
    "CostModel",
    "EngineSnapshot",
    "EngineView",
    "LocalPolicy",
    "Match",
    "RadixTree",
    "Request",
    "RouteRequest",
    "Router",
    "Running",
    "TenantWeights",
    "WorkerState",
    "form_batch",
    "make_policy",
    "make_router",
    "policy_names",
]
