"""Policies and routers by name, as configuration files and the command line name them.

A policy name may carry `+memsafe` to add memory-safe admission (seed 002) to its order,
e.g. `dlpm+memsafe`. Unknown names and unknown or bad parameters raise `ConfigError`
naming the parameter.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from fairpool.sched.batch import mixes_phases as batch_mixes_phases
from fairpool.sched.cost import CostModel, TenantWeights
from fairpool.sched.errors import ConfigError
from fairpool.sched.policies import (
    DLPM,
    FCFS,
    LPM,
    MCSF,
    RAD,
    SLAI,
    VTC,
    AlphaProtection,
    Sarathi,
)
from fairpool.sched.policy import LocalPolicy
from fairpool.sched.routers import D2LPM, JFFC, CacheAware, LeastLoad, RoundRobin, Router

POLICIES: dict[str, type[LocalPolicy]] = {
    cls.name: cls for cls in (FCFS, LPM, VTC, DLPM, MCSF, SLAI, Sarathi, AlphaProtection, RAD)
}
ROUTERS: dict[str, type[Router]] = {
    cls.name: cls for cls in (RoundRobin, LeastLoad, CacheAware, D2LPM, JFFC)
}
MEMORY_SAFE_SUFFIX = "+memsafe"
T = TypeVar("T")


def make_policy(
    name: str,
    cost: CostModel | None = None,
    weights: Mapping[str, float] | TenantWeights | None = None,
    **params: Any,
) -> LocalPolicy:
    """A local policy by registry name, e.g. `make_policy("dlpm", quantum=1024)`."""
    base, memory_safe = _split_modifier(name)
    cls: type[LocalPolicy] = _lookup("policy", base, POLICIES)
    options: dict[str, Any] = {"cost": cost, "weights": _weights(weights), **params}
    if memory_safe:
        options["memory_safe"] = True
    return _construct("policy", cls, options)


def make_router(
    name: str,
    workers: Iterable[str] = (),
    cost: CostModel | None = None,
    weights: Mapping[str, float] | TenantWeights | None = None,
    **params: Any,
) -> Router:
    """A router by registry name, e.g. `make_router("d2lpm", ["w0", "w1"], worker_quantum=4096)`."""
    cls: type[Router] = _lookup("router", name, ROUTERS)
    options: dict[str, Any] = {"workers": workers, **params}
    accepted = inspect.signature(cls.__init__).parameters
    if "cost" in accepted:
        options["cost"] = cost
    if "weights" in accepted:
        options["weights"] = _weights(weights)
    return _construct("router", cls, options)


def policy_parameters(name: str) -> set[str]:
    """The parameters a policy accepts (beyond cost and weights)."""
    base, _ = _split_modifier(name)
    return _accepted_parameters(_lookup("policy", base, POLICIES)) - {"cost", "weights"}


def router_parameters(name: str) -> set[str]:
    """The options router `name` takes besides its workers, cost and weights."""
    return _accepted_parameters(_lookup("router", name, ROUTERS)) - {"workers", "cost", "weights"}


def weighs_tenants(name: str) -> bool:
    """Whether policy `name` (a `+memsafe` variant too) keeps tenants' weights among the
    requests in an engine's queue."""
    base, _ = _split_modifier(name)
    policy: type[LocalPolicy] = _lookup("policy", base, POLICIES)
    return policy.weighs_tenants


def mixes_phases(name: str) -> bool:
    """Whether policy `name` (a `+memsafe` variant too) lets a batch hold prefill chunks
    and decodes together, as vLLM's batches always do; False for RAD, whose batches are
    one or the other (`fairpool.sched.batch.mixes_phases`)."""
    base, _ = _split_modifier(name)
    return batch_mixes_phases(_lookup("policy", base, POLICIES))


def policy_names() -> list[str]:
    return [*POLICIES, *(f"{name}{MEMORY_SAFE_SUFFIX}" for name in POLICIES if name != "mcsf")]


def _split_modifier(name: str) -> tuple[str, bool]:
    if not isinstance(name, str):
        raise ConfigError("policy", f"must be a name, got {name!r}")
    if name.endswith(MEMORY_SAFE_SUFFIX):
        return name.removesuffix(MEMORY_SAFE_SUFFIX), True
    return name, False


def _lookup(kind: str, name: str, table: Mapping[str, Any]) -> Any:
    if name not in table:
        known = ", ".join(sorted(table))
        raise ConfigError(kind, f"unknown {kind} {name!r}; known: {known}")
    return table[name]


def _weights(weights: Mapping[str, float] | TenantWeights | None) -> TenantWeights | None:
    if weights is None or isinstance(weights, TenantWeights):
        return weights
    return TenantWeights(weights)


def _construct(kind: str, cls: type[T], options: dict[str, Any]) -> T:
    accepted = _accepted_parameters(cls)
    for parameter in options:
        if parameter not in accepted:
            known = ", ".join(sorted(accepted))
            name = getattr(cls, "name", cls.__name__)
            raise ConfigError(parameter, f"not a parameter of {kind} {name!r}; known: {known}")
    return cls(**{key: value for key, value in options.items() if value is not None})


def _accepted_parameters(cls: type) -> set[str]:
    """Parameters of cls.__init__, following **options up to the base class."""
    accepted: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters
        accepted |= {
            name
            for name, parameter in parameters.items()
            if parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)
        }
        if not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
            break
    accepted.discard("self")
    return accepted
