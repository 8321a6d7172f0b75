"""The gateway's hard per-tenant limits: sliding windows, Retry-After, settling, memory."""

from __future__ import annotations

import pytest

from fairpool.api.tenant_quota import TenantLimits
from fairpool.front.limits import Rejection, TenantLimiter
from fairpool.sched.limits import SlidingWindow

pytestmark = pytest.mark.unit


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def limits(**values: int | None) -> TenantLimits:
    return TenantLimits(**values)


def refusal(limiter: TenantLimiter, tenant: str, rules: TenantLimits, tokens: int) -> Rejection:
    with pytest.raises(Rejection) as refused:
        limiter.admit(tenant, rules, tokens)
    return refused.value


def test_rpm_refuses_the_next_request_until_the_oldest_leaves_the_window():
    clock = FakeClock()
    limiter = TenantLimiter(clock)
    rules = limits(requests_per_minute=3)
    for offset in (0.0, 10.0, 20.0):
        clock.now = 1000.0 + offset
        limiter.admit("a", rules, 10)
    clock.now = 1030.0
    refused = refusal(limiter, "a", rules, 10)
    assert refused.reason == "requests_per_minute"
    assert refused.retry_after == pytest.approx(30.0)  # the request at 1000 leaves at 1060
    assert "3 requests per minute" in refused.message
    clock.now = 1060.0 - 1e-6
    assert refusal(limiter, "a", rules, 10).retry_after == pytest.approx(1e-6)
    clock.now = 1060.0
    limiter.admit("a", rules, 10)
    assert limiter.state("a")["requests"] == 3
    limiter.admit("b", rules, 10)  # other tenants have their own window


def test_tpm_waits_until_enough_tokens_leave_and_settle_replaces_the_estimate():
    clock = FakeClock()
    limiter = TenantLimiter(clock)
    rules = limits(tokens_per_minute=1000)
    first = limiter.admit("a", rules, 600)
    clock.now += 5
    limiter.admit("a", rules, 300)
    clock.now += 5
    refused = refusal(limiter, "a", rules, 200)  # 900 + 200 > 1000: the 600 must leave
    assert refused.reason == "tokens_per_minute"
    assert refused.retry_after == pytest.approx(50.0)
    assert "1000 tokens per minute" in refused.message
    limiter.settle(first, actual_tokens=100)  # the engine reported far fewer tokens
    assert limiter.state("a")["tokens"] == 400
    limiter.admit("a", rules, 200)
    assert limiter.state("a")["tokens"] == 600
    limiter.settle(first, actual_tokens=5000)  # settling twice changes nothing
    assert limiter.state("a")["tokens"] == 600


def test_tpm_retry_after_counts_several_departures():
    clock = FakeClock()
    limiter = TenantLimiter(clock)
    rules = limits(tokens_per_minute=100)
    for _ in range(4):
        limiter.admit("a", rules, 25)
        clock.now += 1
    # 100 counted (entries at 1000..1003); 60 more fit once three entries have left (1062).
    assert refusal(limiter, "a", rules, 60).retry_after == pytest.approx(1062.0 - clock.now)


def test_a_request_larger_than_the_tpm_limit_on_its_own_is_told_so():
    limiter = TenantLimiter(FakeClock())
    refused = refusal(limiter, "a", limits(tokens_per_minute=1000), 1001)
    assert refused.reason == "tokens_per_minute"
    assert refused.retry_after == 60.0
    assert "on their own" in refused.message
    assert limiter.state("a") == {"requests": 0.0, "tokens": 0.0, "concurrent": 0.0}


def test_concurrency_is_released_by_settle():
    limiter = TenantLimiter(FakeClock())
    rules = limits(concurrent=2)
    first = limiter.admit("a", rules, 1)
    limiter.admit("a", rules, 1)
    refused = refusal(limiter, "a", rules, 1)
    assert (refused.reason, refused.retry_after) == ("concurrent", 1.0)
    assert "2 concurrent" in refused.message
    limiter.settle(first)
    limiter.settle(first)  # idempotent: does not free a second slot
    limiter.admit("a", rules, 1)
    refusal(limiter, "a", rules, 1)
    assert limiter.state("a")["concurrent"] == 2


def test_refused_requests_are_counted_nowhere():
    clock = FakeClock()
    limiter = TenantLimiter(clock)
    rules = limits(requests_per_minute=10, tokens_per_minute=100, concurrent=1)
    limiter.admit("a", rules, 50)
    for _ in range(20):
        refusal(limiter, "a", rules, 10)  # concurrency refuses
    assert limiter.state("a") == {"requests": 1.0, "tokens": 50.0, "concurrent": 1.0}
    refusal(limiter, "b", limits(tokens_per_minute=10), 11)
    assert "b" not in limiter.tenants()


def test_several_broken_limits_report_the_longest_retry_after():
    clock = FakeClock()
    limiter = TenantLimiter(clock)
    limiter.admit("a", limits(), 10)
    clock.now += 15
    refused = refusal(limiter, "a", limits(requests_per_minute=1, concurrent=1), 10)
    assert (refused.reason, refused.retry_after) == ("requests_per_minute", pytest.approx(45.0))


def test_limits_passed_in_apply_at_once():
    clock = FakeClock()
    limiter = TenantLimiter(clock)
    for _ in range(5):
        limiter.admit("a", limits(requests_per_minute=10), 1)
        clock.now += 1
    assert refusal(limiter, "a", limits(requests_per_minute=5), 1).retry_after == pytest.approx(55)
    # Lowered below what is already counted: wait until enough have left, not just the oldest.
    assert refusal(limiter, "a", limits(requests_per_minute=3), 1).retry_after == pytest.approx(57)
    limiter.admit("a", limits(requests_per_minute=6), 1)
    limiter.admit("a", limits(), 1)  # unlimited now


def test_idle_tenants_are_forgotten():
    clock = FakeClock()
    limiter = TenantLimiter(clock)
    rules = limits(requests_per_minute=100)
    held = limiter.admit("busy", rules, 1)
    for index in range(1000):
        limiter.settle(limiter.admit(f"t{index}", rules, 1))
    assert len(limiter.tenants()) == 1001
    clock.now += 60
    late = limiter.admit("late", rules, 1)
    assert sorted(limiter.tenants()) == ["busy", "late"]  # busy still has a request running
    limiter.settle(held)
    assert limiter.tenants() == ["late"]  # its window was already empty
    limiter.settle(late)
    assert limiter.tenants() == ["late"]  # its request still counts in the window
    clock.now += 60
    assert limiter.tenants() == []


def test_state_of_an_unknown_tenant_is_zero():
    assert TenantLimiter(FakeClock()).state("x") == {
        "requests": 0.0,
        "tokens": 0.0,
        "concurrent": 0.0,
    }


def test_rejection_requires_a_positive_retry_after():
    with pytest.raises(ValueError):
        Rejection("concurrent", 0.0, "x")


def test_sliding_window_amends_only_entries_still_in_it():
    window = SlidingWindow(60)
    entry = window.add(0.0, 10)
    window.add(30.0, 5)
    window.amend(entry, 4, now=59.0)
    assert window.total(59.0) == 9
    window.amend(entry, 100, now=60.0)  # it has left: nothing to change
    assert window.total(60.0) == 5
    assert window.time_until_fits(60.0, 6, 10) == pytest.approx(30.0)
    assert window.time_until_fits(60.0, 5, 10) == 0.0
    assert window.time_until_fits(60.0, 11, 10) is None
