"""Routers: which worker of a pool gets a request."""

from fairpool.sched.routers.base import (
    PrefixRouter,
    RouteDecision,
    Router,
    RouteRequest,
    WorkerState,
)
from fairpool.sched.routers.cache_aware import CacheAware
from fairpool.sched.routers.d2lpm import D2LPM
from fairpool.sched.routers.jffc import JFFC, ChainProfile
from fairpool.sched.routers.simple import LeastLoad, RoundRobin

__all__ = [
    "D2LPM",
    "JFFC",
    "CacheAware",
    "ChainProfile",
    "LeastLoad",
    "PrefixRouter",
    "RoundRobin",
    "RouteDecision",
    "RouteRequest",
    "Router",
    "WorkerState",
]
