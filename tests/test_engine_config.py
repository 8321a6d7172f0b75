"""The engines' scheduler configuration: validation, live reload, policy hand-over and
the per-tenant metrics both engines export."""

from __future__ import annotations

import os

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fairpool.api.scheduler_config import (
    BAND_XARG,
    TENANT_XARG,
    check_xargs,
    load_scheduler_config,
    parse_scheduler_config,
    tenant_of,
)
from fairpool.sched import Request, make_policy
from fairpool.sched.errors import ConfigError
from fairpool.sched.requests import EngineSnapshot
from fairpool_engine.live import LiveScheduler
from fairpool_engine.tenant_metrics import TenantMetrics

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def write(path, text: str) -> None:
    path.write_text(text)
    stat = path.stat()  # a new mtime even within the filesystem's timestamp resolution
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_defaults_and_a_full_file(tmp_path):
    assert parse_scheduler_config({}).policy_name == "dlpm"
    path = tmp_path / "scheduler.yaml"
    path.write_text(
        "policy: vtc\nmemorySafe: true\ncost: {extendWeight: 1, outputWeight: 3}\n"
        "defaultWeight: 0.5\ntenants: {acme: 2}\n"
    )
    config = load_scheduler_config(path)
    assert config.policy_name == "vtc+memsafe"
    policy = config.make_policy()
    assert policy.memory_safe and policy.cost.output_weight == 3
    assert policy.weights["acme"] == 2 and policy.weights["nobody"] == 0.5


@pytest.mark.parametrize(
    ("document", "shares"),
    [
        ({}, True),  # dlpm
        ({"policy": "vtc"}, True),
        ({"policy": "fcfs"}, False),
        ({"policy": "vtc", "shareMemory": False}, False),
        ({"policy": "lpm", "shareMemory": True}, True),
    ],
)
def test_memory_is_shared_by_weight_by_the_fair_policies_unless_turned_off(document, shares):
    config = parse_scheduler_config(document)
    assert config.make_policy().shares_memory is shares
    other = parse_scheduler_config({**document, "shareMemory": not shares})
    assert not config.same_policy(other)  # a change builds the policy anew


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"policy": "fifo"}, "policy"),
        ({"shareMemory": "sometimes"}, "shareMemory"),
        ({"tenants": {"a": 0}}, "tenants"),
        ({"quantum": -1}, "quantum"),
        ({"cost": {"outputWeight": "x"}}, "cost.outputWeight"),
        ({"polcy": "vtc"}, "polcy"),
        ({"policy": "vtc", "quantum": 100}, "quantum"),
    ],
)
def test_bad_configs_name_the_field(document, field):
    with pytest.raises(ConfigError) as error:
        parse_scheduler_config(document, "scheduler.yaml")
    assert field in str(error.value)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_scheduler_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_scheduler_config(bad)


def test_tenant_convention_and_xargs_checks():
    assert tenant_of({TENANT_XARG: "acme", "other": 1}) == "acme"
    assert tenant_of(None) == tenant_of({TENANT_XARG: 3}) == "default"
    check_xargs({TENANT_XARG: "acme", "session_id": "s"})  # others' keys pass through
    with pytest.raises(ConfigError, match=r"vllm_xargs\.fairpool_tenant"):
        check_xargs({TENANT_XARG: ""})
    with pytest.raises(ConfigError, match=r"vllm_xargs\.fairpool_weight"):
        check_xargs({"fairpool_weight": 2})


def test_a_weight_change_keeps_the_policy_and_its_state(tmp_path):
    path = tmp_path / "scheduler.yaml"
    write(path, "policy: vtc\ntenants: {a: 1}\n")
    clock = FakeClock()
    live = LiveScheduler(path, clock=clock)
    policy = live.policy
    policy.add(Request("r1", "a", 100, 10))
    write(path, "policy: vtc\ntenants: {a: 4}\n")
    assert not live.maybe_reload()  # checked at most once per interval
    clock.now += 2
    assert live.maybe_reload()
    assert live.policy is policy and policy.weights["a"] == 4
    assert policy.waiting_count == 1


def test_a_policy_change_hands_requests_over(tmp_path):
    path = tmp_path / "scheduler.yaml"
    write(path, "policy: fcfs\n")
    clock = FakeClock()
    live = LiveScheduler(path, clock=clock)
    old = live.policy
    for index, tenant in enumerate("aab"):
        old.add(Request(f"r{index}", tenant, 100, 10))
    view = EngineSnapshot(memory_tokens=10_000)
    old.admit(old.next_request(view).request_id)
    old.record_output("r0", 5)
    old.preempt("r0")  # paid for, back at the front
    old.admit("r1")
    write(path, "policy: dlpm\nquantum: 500\n")
    clock.now += 2
    assert live.maybe_reload()
    new = live.policy
    assert new is not old and new.name == "dlpm"
    assert new.served == old.served
    assert new.running_count == 1 and new.waiting_count == 2
    assert new.admit("r0") == 0  # not charged twice
    new.finish("r1")


def test_a_bad_update_keeps_the_last_good_config(tmp_path, caplog):
    path = tmp_path / "scheduler.yaml"
    write(path, "policy: vtc\n")
    clock = FakeClock()
    live = LiveScheduler(path, clock=clock)
    write(path, "policy: nonsense\n")
    clock.now += 2
    assert not live.maybe_reload()
    assert live.config.policy == "vtc" and live.reloads["rejected"] == 1
    assert "policy" in (live.last_error or "")
    assert "keeping the last good one" in caplog.text


def test_a_bad_config_at_start_is_refused(tmp_path):
    path = tmp_path / "scheduler.yaml"
    path.write_text("tenants: {a: -1}\n")
    with pytest.raises(ConfigError, match="tenants"):
        LiveScheduler(path)


def test_a_policy_override_holds_across_reloads(tmp_path):
    path = tmp_path / "scheduler.yaml"
    write(path, "policy: dlpm\ntenants: {a: 1}\n")
    clock = FakeClock()
    live = LiveScheduler(path, clock=clock, policy_override="vtc")
    assert live.config.policy == "vtc" and live.config.tenants == {"a": 1}
    write(path, "policy: fcfs\ntenants: {a: 3}\n")
    clock.now += 2
    assert live.maybe_reload()
    assert live.policy.name == "vtc" and live.policy.weights["a"] == 3
    assert LiveScheduler(policy_override="lpm").policy.name == "lpm"
    with pytest.raises(ConfigError, match="--policy"):
        LiveScheduler(policy_override="nonsense")


def test_tenant_metrics_follow_the_policy():
    registry = CollectorRegistry()
    clock = FakeClock()
    metrics = TenantMetrics(registry, clock=clock)
    live = LiveScheduler()
    live.policy.add(Request("r1", "acme", 100, 10))
    live.policy.add(Request("r2", "globex", 50, 10))
    live.policy.admit("r1", cached_tokens=40)
    metrics.export(live, 1000, force=True)
    text = generate_latest(registry).decode()
    service = "fairpool_engine_tenant_service_total"
    assert f'{service}{{band="standard",tenant="acme"}} 60.0' in text
    assert 'fairpool_engine_tenant_requests_waiting{band="standard",tenant="globex"} 1.0' in text
    assert 'fairpool_engine_tenant_requests_running{band="standard",tenant="acme"} 1.0' in text
    assert 'fairpool_engine_tenant_weight{tenant="acme"} 1.0' in text
    assert 'fairpool_engine_scheduler_info{policy="dlpm"} 1.0' in text
    # `auto` Q: the floor until a prompt costs more; 2(U + Q) with U = 100 + 2·1000
    assert 'fairpool_engine_scheduler_quantum{policy="dlpm"} 2048.0' in text
    assert 'fairpool_engine_scheduler_fairness_bound{policy="dlpm"} 8296.0' in text
    live.policy.record_output("r1", 3)
    metrics.export(live, 1000)  # throttled: nothing changes yet
    assert 'tenant="acme"} 60.0' in generate_latest(registry).decode()
    clock.now += 1
    metrics.export(live, 1000)
    assert f'{service}{{band="standard",tenant="acme"}} 66.0' in (
        generate_latest(registry).decode()
    )


def test_tenant_metrics_label_each_flow_with_its_band(tmp_path):
    """A tenant's requests in its own band and in a lower one it asked are two series of
    one tenant; a change of the tenant's band moves its flow to the new series, the old
    one's gauges at 0; the weight stays one series per tenant."""
    path = tmp_path / "scheduler.yaml"
    write(path, "policy: vtc\ntenants: {acme: 2}\ntenantBands: {acme: interactive}\n")
    clock = FakeClock()
    live = LiveScheduler(path, clock=clock)
    registry = CollectorRegistry()
    metrics = TenantMetrics(registry)
    policy = live.policy
    policy.add(Request("r1", live.flow_of({TENANT_XARG: "acme"}), 100, 10))
    policy.add(Request("r2", live.flow_of({TENANT_XARG: "acme", BAND_XARG: "batch"}), 50, 10))
    policy.admit("r2")
    metrics.export(live, 1000, force=True)
    text = generate_latest(registry).decode()
    assert 'fairpool_engine_tenant_service_total{band="batch",tenant="acme"} 50.0' in text
    assert 'fairpool_engine_tenant_requests_running{band="batch",tenant="acme"} 1.0' in text
    assert 'fairpool_engine_tenant_requests_waiting{band="interactive",tenant="acme"} 1.0' in text
    assert 'fairpool_engine_tenant_weight{tenant="acme"} 2.0' in text
    assert "acme@" not in text  # flows never leak into the tenant label
    write(path, "policy: vtc\ntenants: {acme: 2}\ntenantBands: {acme: standard}\n")
    clock.now += 2
    assert live.maybe_reload() and live.policy is policy
    metrics.export(live, 1000, force=True)
    text = generate_latest(registry).decode()
    assert 'fairpool_engine_tenant_requests_waiting{band="standard",tenant="acme"} 1.0' in text
    assert 'fairpool_engine_tenant_requests_waiting{band="interactive",tenant="acme"} 0.0' in text


def test_a_request_runs_in_its_flow_under_the_bands_in_force(tmp_path):
    path = tmp_path / "scheduler.yaml"
    write(path, "policy: vtc\ntenantBands: {fast: interactive, bulk: batch}\n")
    clock = FakeClock()
    live = LiveScheduler(path, clock=clock)
    assert live.flow_of({TENANT_XARG: "fast"}) == "fast"
    assert live.flow_of({TENANT_XARG: "fast", BAND_XARG: "batch"}) == "fast@batch"
    assert live.flow_of({TENANT_XARG: "fast", BAND_XARG: "interactive"}) == "fast"
    assert live.flow_of({TENANT_XARG: "bulk", BAND_XARG: "interactive"}) == "bulk"  # not up
    assert live.flow_of({BAND_XARG: "batch"}) == "default@batch"
    assert live.flow_of(None) == "default"
    write(path, "policy: vtc\ntenantBands: {fast: batch}\n")
    clock.now += 2
    assert live.maybe_reload()
    assert live.flow_of({TENANT_XARG: "fast", BAND_XARG: "batch"}) == "fast"


def test_a_change_of_bands_and_groups_keeps_the_policy_and_its_counters(tmp_path):
    """Bands and groups are the fair tree's shape: changing them keeps the running policy
    (its counters, its queue), and the next pick follows the new shape. (A flow that
    changes band competes in the new band's tree, from VTC's lift there.)"""
    path = tmp_path / "scheduler.yaml"
    write(path, "policy: vtc\n")
    clock = FakeClock()
    live = LiveScheduler(path, clock=clock)
    policy = live.policy
    view = EngineSnapshot(memory_tokens=10_000)
    for index, tenant in enumerate(["a", "b", "a", "b"]):
        policy.add(Request(f"r{index}", tenant, 100, 10))
    policy.admit(policy.next_request(view).request_id)
    counters = {tenant: policy.tree.counter(tenant) for tenant in "ab"}
    assert counters == {"a": 100, "b": 0}
    assert policy.next_request(view).tenant == "b"  # a was served: b's turn

    def reload(text: str) -> None:
        write(path, text)
        clock.now += 2
        assert live.maybe_reload()
        assert live.policy is policy and policy.waiting_count == 3

    reload("policy: vtc\ngroups: {org: {weight: 2}}\ntenantGroups: {a: org}\n")
    assert {tenant: policy.tree.counter(tenant) for tenant in "ab"} == counters
    assert policy.weights.path("a") == ("org",)
    reload("policy: vtc\ntenantBands: {a: interactive}\n")
    assert policy.weights.band_of("a") == "interactive"
    assert policy.next_request(view).tenant == "a"  # the higher band first


def test_take_over_requires_an_empty_policy():
    busy = make_policy("fcfs")
    busy.add(Request("r", "a", 1, 1))
    with pytest.raises(ConfigError):
        busy.take_over(make_policy("vtc"))


def test_the_environment_names_the_file_and_a_policy_that_replaces_its_own(tmp_path, monkeypatch):
    path = tmp_path / "scheduler.yaml"
    write(path, "policy: vtc\ntenants: {a: 3}\n")
    monkeypatch.setenv("FAIRPOOL_SCHEDULER_CONFIG", str(path))
    monkeypatch.setenv("FAIRPOOL_SCHEDULER_POLICY", "fcfs")
    live = LiveScheduler.from_environment()
    assert live.config.policy == "fcfs" and live.policy.weights["a"] == 3
