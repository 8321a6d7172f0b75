"""A tenant's latency targets at the gateway (`slo.ttftSeconds`, `slo.tbtSeconds`): an
answer that misses one is counted, by band, and nothing else changes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.api.tenant_quota import ServiceLevel
from fairpool.front import FrontRequest, Outcome, PoolFront, TenantLimiter, Usage
from fairpool.sched import CostModel
from fairpool.sched.tree import Shares
from fairpool_gateway.metrics import GatewayMetrics, RequestLedger

pytestmark = pytest.mark.unit

SLO = ServiceLevel.model_validate({"class": "interactive", "ttftSeconds": 0.5, "tbtSeconds": 0.1})


def misses(metrics: GatewayMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(
        f"fairpool_gateway_{name}_total", {"tenant": "chat", "pool": "main", "band": "interactive"}
    )
    return value or 0.0


@settings(max_examples=60, deadline=None)
@given(
    ttft=st.floats(0.0, 2.0),
    tokens=st.integers(1, 50),
    decoding=st.floats(0.0, 10.0),
    streamed=st.booleans(),
)
def test_an_answer_is_counted_once_per_target_it_misses(ttft, tokens, decoding, streamed):
    now = [0.0]
    front = PoolFront.build(
        "main",
        "least_load",
        CostModel(),
        Shares({"chat": 1.0}, tenant_bands={"chat": "interactive"}),
        TenantLimiter(clock=lambda: now[0]),
        workers=["w0"],
        clock=lambda: now[0],
    )
    metrics = GatewayMetrics()
    front.listeners = [RequestLedger(metrics, lambda tenant: SLO if tenant == "chat" else None)]
    flight = front.arrive(FrontRequest("r1", "chat", "hello", 10, tokens))
    now[0] = ttft + decoding
    first = ttft if streamed else None
    flight.settle(Outcome(200, Usage(10, 0, tokens), first_token_at=first))
    late = streamed and ttft > 0.5
    slow = streamed and tokens > 1 and decoding / (tokens - 1) > 0.1
    assert misses(metrics, "ttft_deadline_misses") == (1.0 if late else 0.0)
    assert misses(metrics, "tbt_target_misses") == (1.0 if slow else 0.0)
