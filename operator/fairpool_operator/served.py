"""What the gateway reports of each tenant's service: read from the gateway's admin port.

The admin API's `/metrics` holds, per tenant and pool, the tokens the engines reported
(`fairpool_gateway_tokens_total{kind="prompt"|"cached"|"completion"}`) and the service
charged (`fairpool_gateway_service_total`), counted since that gateway replica started. The
operator sums them over pools for each tenant (served tokens are prompt plus completion
tokens), and keeps each pool's numbers too, from which a TenantGroup's share of a pool is
the service of the tenants under it over the service of every tenant there. The admin
API wants the gateway's admin token (`FAIRPOOL_GATEWAY_ADMIN_TOKEN_FILE`, the chart mounts
it), sent as a bearer token and read afresh for each poll, so a rotated token is followed.
"""

from __future__ import annotations

import logging
import re
import urllib.request
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("fairpool.operator")

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Served:
    """A tenant's served tokens and charged service over every pool, and per pool."""

    tokens: int
    service: float
    pools: Mapping[str, Served] = field(default_factory=dict)


def parse_served(text: str) -> dict[str, Served]:
    """Per tenant, from the Prometheus text exposition of the gateway's admin `/metrics`."""
    tokens: dict[str, float] = defaultdict(float)
    service: dict[str, float] = defaultdict(float)
    pool_tokens: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    pool_service: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name = match["name"]
        if name not in ("fairpool_gateway_tokens_total", "fairpool_gateway_service_total"):
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        tenant = labels.get("tenant")
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if tenant is None:
            continue
        pool = labels.get("pool", "")
        if name == "fairpool_gateway_service_total":
            service[tenant] += value
            pool_service[tenant][pool] += value
        elif labels.get("kind") in ("prompt", "completion"):
            tokens[tenant] += value
            pool_tokens[tenant][pool] += value
    found = {}
    for tenant in sorted(set(tokens) | set(service)):
        pools = sorted(set(pool_tokens[tenant]) | set(pool_service[tenant]))
        per_pool = {
            pool: Served(
                int(pool_tokens[tenant].get(pool, 0.0)),
                round(pool_service[tenant].get(pool, 0.0), 3),
            )
            for pool in pools
        }
        found[tenant] = Served(
            int(tokens.get(tenant, 0.0)), round(service.get(tenant, 0.0), 3), per_pool
        )
    return found


def fetch_served(
    admin_url: str, token_file: str | None = None, timeout: float = 5.0
) -> dict[str, Served] | None:
    """The gateway's numbers, or None if they cannot be read now (the last ones stay)."""
    request = urllib.request.Request(f"{admin_url}/metrics")
    try:
        if token_file is not None:
            token = Path(token_file).read_text().strip()
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode("utf-8", "replace")
    except (OSError, ValueError) as error:
        log.info("gateway admin API not readable (%s); keeping the last served numbers", error)
        return None
    return parse_served(text)


def group_pools(
    served: Mapping[str, Served],
    tenant_groups: Mapping[str, str],
    parents: Mapping[str, str | None],
) -> dict[str, list[dict[str, object]]]:
    """For each group with a reported tenant under it (at any depth: `tenant_groups` says
    each tenant's group, `parents` each group's parent, as a tree), a TenantGroup status'
    `pools`: per pool where any tenant was charged, the tokens and service of the group's
    tenants and their share of the service charged there to every tenant."""
    totals: dict[str, float] = defaultdict(float)
    for reported in served.values():
        for pool, in_pool in reported.pools.items():
            totals[pool] += in_pool.service
    under: dict[str, list[str]] = defaultdict(list)  # group → the reported tenants below it
    for tenant, group in tenant_groups.items():
        if tenant not in served:
            continue
        seen: set[str] = set()
        current: str | None = group
        while current is not None and current in parents and current not in seen:
            seen.add(current)
            under[current].append(tenant)
            current = parents[current]
    found: dict[str, list[dict[str, object]]] = {}
    for group, tenants in sorted(under.items()):
        pools: list[dict[str, object]] = []
        for pool, total in sorted(totals.items()):
            if total <= 0:
                continue
            numbers = [
                served[tenant].pools[pool] for tenant in tenants if pool in served[tenant].pools
            ]
            service = sum(number.service for number in numbers)
            pools.append(
                {
                    "pool": pool,
                    "servedTokens": sum(number.tokens for number in numbers),
                    "servedService": round(service, 3),
                    "share": round(min(service / total, 1.0), 4),
                }
            )
        found[group] = pools
    return found
