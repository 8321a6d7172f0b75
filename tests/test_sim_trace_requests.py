"""What a trace request may ask beyond its tokens, in the simulated fleet: a client that hangs
up (`cancel_after`, `stream`), a band below its tenant's (`band`), another request it waits
for (`after`: a tree of thoughts' child sent when its parent finishes), and the output it
reserves at the front (the pool's `maxModelLen`) — each settled or refused by the core's
rule, as the gateway does (`fairpool.front.charges`, `fairpool.sched.tree.flow`)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.api.inference_pool import Saturation
from fairpool.front import CLIENT_CLOSED, FrontListener, Settlement
from fairpool.sched import TenantWeights
from fairpool.sched.errors import ConfigError
from fairpool.sched.tree import BAND_NAMES, Shares
from fairpool.sim.engine import StepTime
from fairpool.sim.fleet import ClosedLoop, Fleet, FleetConfig
from fairpool.sim.run import SimulationOptions, fleet_config
from fairpool.sim.trace import TraceError, TraceRequest, read_trace, write_trace
from fairpool.sim.workloads import generate
from fairpool_cli.main import main

pytestmark = pytest.mark.unit

FAST = StepTime(base=0.01, per_prefill_token=0.0001, per_decode=0.0002)


class Settlements(FrontListener):
    def __init__(self) -> None:
        self.seen: dict[str, Settlement] = {}

    def settled(self, settlement: Settlement) -> None:
        self.seen[settlement.request.request_id] = settlement


def fleet_with(settlements: Settlements, **settings: object) -> Fleet:
    config = FleetConfig(memory_tokens=4000, token_budget=512, step_time=FAST, **settings)  # type: ignore[arg-type]
    fleet = Fleet(config)
    for front in fleet.fronts:
        front.listeners.append(settlements)
    return fleet


def request(t: float, tenant: str = "a", output: int = 100, **fields: object) -> TraceRequest:
    return TraceRequest(t, tenant, ((None, 50),), output, output, **fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------- hang-ups


def test_a_hang_up_is_charged_by_the_core_rule():
    """One engine decoding one token a step (about 10 ms): a client leaving after 0.3 s is
    mid-answer. Streamed, it is charged the tokens its stream delivered; not streamed,
    its whole output reservation; still queued behind the cap, nothing."""
    settlements = Settlements()
    fleet = fleet_with(settlements, saturation=Saturation(maxOutstanding=2))
    trace = [
        request(0.0, cancel_after=0.3),
        request(0.0, cancel_after=0.3, stream=False),
        request(0.0, cancel_after=0.1),  # the cap holds it at the front
    ]
    summary = fleet.run(trace).summary()
    streamed, whole, queued = (settlements.seen[f"q{index}"] for index in range(3))
    assert {s.status for s in (streamed, whole, queued)} == {CLIENT_CLOSED}
    assert 0 < streamed.completion_tokens < 100
    assert whole.completion_tokens == 100  # max_tokens: its reservation
    assert queued.worker is None and queued.service == 0
    assert summary["tenants"]["a"]["hung_up"] == 3 == summary["hung_up"]
    assert summary["tenants"]["a"]["finished"] == 0


def test_the_reservation_is_capped_by_the_pools_context():
    """With `maxModelLen`, a request reserves at most what the context leaves after its
    prompt (the gateway's rule): a hung-up answer not streamed is charged that."""
    settlements = Settlements()
    fleet = fleet_with(settlements, max_model_len=120)
    fleet.run([request(0.0, output=100, cancel_after=0.2, stream=False)])
    settled = settlements.seen["q0"]
    assert settled.request.output_limit == 70  # 120 − the 50-token prompt
    assert settled.completion_tokens == 70


def test_the_pools_max_model_len_reaches_the_fleet(tmp_path: Path):
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "apiVersion: fairpool.io/v1alpha1\nkind: InferencePool\nmetadata: {name: p}\n"
        "spec: {model: {name: m, maxModelLen: 2048}, engine: {kind: sim}}\n"
    )
    assert fleet_config(SimulationOptions(pool=str(pool))).max_model_len == 2048
    assert fleet_config(SimulationOptions()).max_model_len is None


hang_up_traces = st.lists(
    st.builds(
        request,
        t=st.floats(0.0, 3.0),
        tenant=st.sampled_from(["a", "b", "c"]),
        output=st.integers(1, 120),
        cancel_after=st.one_of(st.none(), st.just(0.0), st.floats(0.0, 2.0)),
        stream=st.booleans(),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None)
@given(
    hang_up_traces,
    st.sampled_from(["vtc", "fcfs", "dlpm"]),
    st.one_of(st.none(), st.integers(1, 4)),
    st.integers(1, 2),
    st.integers(1, 3),
)
def test_hang_ups_settle_every_flight_and_leave_no_ledger_holding_anything(
    trace, policy, cap, replicas, workers
):
    settlements = Settlements()
    fleet = fleet_with(
        settlements,
        policy=policy,
        router="round_robin",
        workers=workers,
        gateway_replicas=replicas,
        saturation=None if cap is None else Saturation(maxOutstanding=cap),
        limits={},
        rpm_limit=None,
    )
    summary = fleet.run(trace).summary()
    tenants = summary["tenants"].values()
    # Every request ended exactly once: answered, refused, or its client hung up.
    assert len(settlements.seen) == len(trace)
    assert sum(t["finished"] + t["rejected"] + t["hung_up"] for t in tenants) == len(trace)
    left_at_once = sum(1 for r in trace if r.cancel_after == 0)
    assert summary["hung_up"] >= left_at_once  # gone before any engine step could take it
    # No ledger holds anything.
    assert not fleet._flights and not fleet._trace
    for front in fleet.fronts:
        assert front.queue.queued() == 0
        assert all(worker.outstanding == 0 for worker in front.router.workers.values())
    limiter = fleet.fronts[0].limiter
    assert all(limiter.state(tenant)["concurrent"] == 0 for tenant in ("a", "b", "c"))
    assert all(engine.idle() and not engine.running for engine in fleet.engines)
    assert all(t["backlogged_s"] <= summary["duration_s"] for t in tenants)


# ---------------------------------------------------------------- bands


def test_requests_in_a_lower_band_run_as_the_tenants_flow_there_with_figures_per_band():
    shares = Shares({"gold": 4.0}, tenant_bands={"gold": "interactive"})
    # Room for six requests at a time (reserve: prompt + max_tokens each): the rest wait.
    config = FleetConfig(memory_tokens=900, admission="reserve", step_time=FAST, weights=shares)
    trace = [request(0.01 * i, "gold", band="batch" if i % 3 == 0 else None) for i in range(30)]
    fleet = Fleet(config)
    summary = fleet.run(trace).summary()
    flows = {c.request.tenant for c in fleet.recorder.completions}
    assert flows == {"gold", "gold@batch"}  # the engines schedule the flows
    gold = summary["tenants"]["gold"]
    assert set(gold["bands"]) == {"interactive", "batch"}
    assert gold["bands"]["batch"]["requests"] == 10 and gold["requests"] == 30
    assert gold["service"] == pytest.approx(sum(b["service"] for b in gold["bands"].values()))
    assert set(summary["bands"]) == {"interactive", "batch"}
    for band in summary["bands"].values():
        assert band["ttft_p50"] is not None and band["ttft_p99"] >= band["ttft_p50"]
    # A batch request waits for the interactive ones (bar batch's minimum share).
    assert gold["bands"]["batch"]["ttft_p50"] > gold["bands"]["interactive"]["ttft_p50"]


@settings(max_examples=30)
@given(
    st.sampled_from(BAND_NAMES),
    st.lists(st.sampled_from([None, *BAND_NAMES]), min_size=1, max_size=6),
)
def test_a_trace_line_asking_a_band_above_its_tenants_is_refused_naming_the_line(
    tenant_band, asked
):
    shares = Shares({}, tenant_bands={"t": tenant_band})
    lines = [
        json.dumps({"t": i, "tenant": "t", "segments": [[None, 5]], "output_tokens": 1, "band": b})
        for i, b in enumerate(asked)
    ]
    above = [
        number
        for number, band in enumerate(asked, start=1)
        if band is not None and BAND_NAMES.index(band) < BAND_NAMES.index(tenant_band)
    ]
    if not above:
        assert [r.band for r in read_trace(io.StringIO("\n".join(lines)), shares)] == asked
        return
    with pytest.raises(TraceError) as refused:
        read_trace(io.StringIO("\n".join(lines)), shares)
    assert refused.value.parameter == f"line {above[0]}: band"
    assert "above the tenant's band" in str(refused.value)


def test_the_fleet_refuses_a_request_or_client_above_its_tenants_band():
    config = FleetConfig(weights=Shares({}, tenant_bands={"t": "batch"}))
    with pytest.raises(ConfigError, match="request 1: band"):
        Fleet(config).run([request(0.0, "t"), request(0.0, "t", band="standard")])
    with pytest.raises(ConfigError, match="--client t: band"):
        Fleet(config).run([], duration=1.0, clients=[ClosedLoop("t", 1, 0, 5, 5, band="standard")])


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


TENANTS = """\
apiVersion: fairpool.io/v1alpha1
kind: TenantQuota
metadata: {name: gold}
spec: {weight: 4, slo: {class: standard}}
"""


def test_the_sim_command_refuses_a_band_above_naming_the_line_and_runs_clients_in_a_band(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    tenants = write(tmp_path / "tenants.yaml", TENANTS)
    trace = write(
        tmp_path / "t.jsonl",
        '{"t": 0, "tenant": "gold", "segments": [[null, 5]], "output_tokens": 2}\n'
        '{"t": 1, "tenant": "gold", "segments": [[null, 5]], "output_tokens": 2, '
        '"band": "interactive"}\n',
    )
    assert main(["sim", "--trace", trace, "--tenants", tenants]) == 2
    assert "line 2: band" in capsys.readouterr().err
    out = tmp_path / "out.json"
    argv = ["sim", "--client", "gold@batch:2:0:8:4", "--client", "gold:2:0:8:4"]
    assert main([*argv, "--tenants", tenants, "--duration", "2", "--json", str(out)]) == 0
    gold = json.loads(out.read_text())["tenants"]["gold"]
    assert set(gold["bands"]) == {"standard", "batch"}
    assert main(["sim", "--client", "gold@interactive:2", "--tenants", tenants, "--duration", "1"])
    assert "--client gold: band" in capsys.readouterr().err


def test_the_new_fields_round_trip_through_a_trace_file(tmp_path: Path):
    requests = [
        request(0.0, band="batch", cancel_after=1.5, stream=False, output_segment="x"),
        request(0.5, after="x"),
    ]
    path = tmp_path / "t.jsonl"
    write_trace(requests, path)
    assert read_trace(path) == requests
    assert '"stream"' not in path.read_text().splitlines()[1]  # defaults stay unwritten


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("band", "gold"),
        ("cancel_after", -1),
        ("cancel_after", "soon"),
        ("stream", "yes"),
        ("after", ""),
        ("after", 5),
    ],
)
def test_bad_new_fields_are_refused_naming_line_and_field(field: str, value: object):
    record = {"t": 0, "tenant": "a", "segments": [[None, 5]], "output_tokens": 1, field: value}
    with pytest.raises(TraceError) as refused:
        read_trace(io.StringIO(json.dumps(record)))
    assert refused.value.parameter == f"line 1: {field}"


def test_weights_alone_still_run_every_request_in_its_tenants_flow():
    fleet = Fleet(FleetConfig(step_time=FAST, weights=TenantWeights({"a": 2.0})))
    fleet.run([request(0.0), request(0.1, "b")])
    assert {c.request.tenant for c in fleet.recorder.completions} == {"a", "b"}


# ---------------------------------------------------------------- dependencies


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    height=st.integers(1, 3),
    level_gap=st.sampled_from([0.0, 0.05, 5.0]),
)
def test_a_closed_loop_tree_sends_each_thought_once_its_parent_finished(
    seed: int, height: int, level_gap: float
):
    """`after`: a request is sent at its own time or when the request generating the
    segment it names finishes, whichever is later, and then runs like any other."""
    trace = generate(
        "dlpm_tree_of_thoughts",
        4.0,
        seed=seed,
        clients=2,
        rate=0.5,
        height=height,
        level_gap=level_gap,
        closed_loop=True,
    )
    recorder = fleet_with(Settlements()).run(trace)
    done = {c.request.request_id: c for c in recorder.completions}
    assert len(done) == len(trace)
    producer = {r.output_segment: f"q{i}" for i, r in enumerate(trace)}
    for index, sent in enumerate(trace):
        child = done[f"q{index}"]
        if sent.after is None:
            assert child.request.arrival == sent.t
            continue
        parent = done[producer[sent.after]]
        assert child.request.arrival == max(sent.t, parent.finished_at)
        assert child.admitted_at >= parent.finished_at


def test_a_request_waiting_for_a_segment_nobody_generates_is_refused():
    with pytest.raises(ConfigError) as refused:
        fleet_with(Settlements()).run([request(0.0), request(0.0, after="nobody")])
    assert refused.value.parameter == "request 1: after"
