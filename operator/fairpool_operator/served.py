"""What the gateway reports of each tenant's service: read from the gateway's admin port.

The admin API's `/metrics` holds, per tenant and pool, the tokens the engines reported
(`fairpool_gateway_tokens_total{kind="prompt"|"cached"|"completion"}`) and the service
charged (`fairpool_gateway_service_total`), counted since that gateway replica started. The
operator sums them over pools: served tokens are prompt plus completion tokens. The admin
API wants the gateway's admin token (`FAIRPOOL_GATEWAY_ADMIN_TOKEN_FILE`, the chart mounts
it), sent as a bearer token and read afresh for each poll, so a rotated token is followed.
"""

from __future__ import annotations

import logging
import re
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("fairpool.operator")

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Served:
    tokens: int
    service: float


def parse_served(text: str) -> dict[str, Served]:
    """Per tenant, from the Prometheus text exposition of the gateway's admin `/metrics`."""
    tokens: dict[str, float] = defaultdict(float)
    service: dict[str, float] = defaultdict(float)
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
        if name == "fairpool_gateway_service_total":
            service[tenant] += value
        elif labels.get("kind") in ("prompt", "completion"):
            tokens[tenant] += value
    return {
        tenant: Served(int(tokens.get(tenant, 0.0)), round(service.get(tenant, 0.0), 3))
        for tenant in sorted(set(tokens) | set(service))
    }


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
