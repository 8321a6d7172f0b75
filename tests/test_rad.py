"""RAD (seed 004, §4.2, Algorithm 1): its batch shape, its parameters, `fairpool sim
--policy rad`, Theorem 2 in the simulator against Sarathi-Serve, and the vLLM plugin's
refusal. Virtual time and counted events only."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import pytest
from fake_vllm import Plugin, installed
from fake_vllm.engine import FakeEngine
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.sched import ConfigError, Request, make_policy
from fairpool.sched.policies import RAD
from fairpool.sim.engine import SimEngine
from fairpool.sim.stability import StabilityExperiment, budget_request_time, request_time
from fairpool_cli.main import main
from fairpool_engine.live import LiveScheduler
from fairpool_engine.vllm import launch

pytestmark = pytest.mark.unit

EXPERIMENT = StabilityExperiment()  # t*_lcm = 16, t*_col = 4, the default step time
STEP, CHUNK, COLS = EXPERIMENT.step, EXPERIMENT.chunk, EXPERIMENT.decode_batch
TILES = {"tile_rows": CHUNK, "tile_cols": COLS, "tile_red": CHUNK}
LENGTHS = EXPERIMENT.lengths
T_BAR, T_MAX = EXPERIMENT.t_bar, EXPERIMENT.t_max
RAD_CAPACITY, SARATHI_CAPACITY = EXPERIMENT.rad_capacity, EXPERIMENT.sarathi_capacity


def rad(**params: object) -> RAD:
    policy = make_policy("rad", **{**TILES, **params})
    assert isinstance(policy, RAD)
    return policy


# ---------------------------------------------------------------- batch shape


@settings(max_examples=30)
@given(
    jobs=st.lists(
        st.tuples(st.floats(0, 2), st.integers(1, 70), st.integers(1, 12)), min_size=1, max_size=25
    ),
    cycle=st.integers(1, 8),
)
def test_every_batch_is_decodes_or_one_prefill_chunk_and_cycles_start_at_most_n(jobs, cycle):
    """Algorithm 1: a batch decodes every decode-phase request, or prefills one request's
    next chunk of at most t*_lcm tokens; at most t*_col requests are active; a decode
    batch while requests wait and fewer than t*_col decode means n have started."""
    policy = rad(cycle_requests=cycle)
    engine = SimEngine(policy, memory_tokens=100_000, step_time=STEP)
    arrivals = sorted(jobs)
    starts = submitted = 0
    for _ in range(10_000):
        while arrivals and arrivals[0][0] <= engine.now:
            _, prompt, output = arrivals.pop(0)
            submitted += 1
            tokens = list(range(100 * submitted, 100 * submitted + prompt))
            engine.submit(Request(f"r{submitted}", "a", prompt, output), tokens, output)
        if engine.idle():
            if not arrivals:
                break
            engine.now = arrivals[0][0]
            continue
        decoding = [r for r in engine.running if r.decoding]
        waiting = policy.waiting_count
        plan = engine.step()
        assert not (plan.decodes and plan.prefills)
        if plan.prefills:
            ((_, chunk),) = plan.prefills
            assert chunk <= CHUNK
            starts += len(plan.admitted)
        else:
            assert plan.decodes == decoding
            if waiting and len(decoding) < COLS:
                assert policy.requests_in_cycle == cycle
        assert len(engine.running) <= COLS
        if not engine.running:
            assert starts <= cycle  # one cycle ended: it started at most n
            starts = 0
    assert len(engine.completions) == len(jobs)


def test_a_prompt_is_prefilled_alone_in_lcm_chunks_then_decoded_with_the_others():
    policy = rad()
    engine = SimEngine(policy, memory_tokens=10_000, step_time=STEP)
    for index, prompt in enumerate((40, 20)):
        tokens = list(range(100 * index, 100 * index + prompt))
        engine.submit(Request(f"r{index}", "a", prompt, 3), tokens, 3)
    shapes = []
    while not engine.idle():
        plan = engine.step()
        prefills = [f"{running.request_id}:{chunk}" for running, chunk in plan.prefills]
        shapes.append(" ".join(prefills) or f"decode {len(plan.decodes)}")
    # r0 in chunks of 16, then r1 (fewer than t*_col decode), then both decode to the end.
    assert shapes == ["r0:16", "r0:16", "r0:8", "r1:16", "r1:4", "decode 2", "decode 2"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cycle_requests": 0}, "cycle_requests"),
        ({"tile_cols": 0}, "tile_cols"),
        ({"tile_rows": 1.5}, "tile_rows"),
        ({"tile_red": "32"}, "tile_red"),
        ({"quantum": 5}, "quantum"),
    ],
)
def test_bad_parameters_are_errors_naming_the_field(params, field):
    with pytest.raises(ConfigError) as error:
        make_policy("rad", **params)
    assert error.value.parameter == field


def test_defaults_are_the_papers_a100_tiles():
    policy = make_policy("rad")
    assert isinstance(policy, RAD)
    assert (policy.tile_rows, policy.tile_cols, policy.tile_red) == (256, 128, 32)
    assert policy.prefill_chunk == policy.token_budget == 256


# ---------------------------------------------------------------- fairpool sim


def test_sim_command_runs_rad_with_its_parameters(tmp_path, capsys):
    """A trace runs until every request finished; RAD's parameters come from the flags."""
    trace, out = tmp_path / "t.jsonl", tmp_path / "out.json"
    lines = [
        json.dumps({"t": index * 0.05, "tenant": "ab"[index % 2],
                    "segments": [[None, 64 + 16 * index]], "output_tokens": 1 + index % 7})
        for index in range(30)
    ]  # fmt: skip
    trace.write_text("\n".join(lines) + "\n")
    argv = ["sim", "--trace", str(trace), "--policy", "rad", "--json", str(out)]
    argv += ["--policy-param", "cycle_requests=8", "--policy-param", "tile_cols=4"]
    assert main(argv) == 0
    summary = json.loads(out.read_text())
    assert [summary["tenants"][t]["finished"] for t in "ab"] == [15, 15]
    assert "policy rad" in " ".join(capsys.readouterr().out.split())  # however it wraps


@pytest.mark.parametrize(
    ("param", "named"),
    [
        ("cycle_requests=0", "--policy-param cycle_requests"),
        ("tile_cols=x", "--policy-param tile_cols"),
        ("bogus=1", "--policy-param bogus"),
    ],
)
def test_sim_command_names_a_bad_policy_parameter(capsys, param, named):
    argv = ["sim", "--workload", "lmsys_like", "--duration", "1", "--policy", "rad"]
    assert main([*argv, "--policy-param", param]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


# ---------------------------------------------------------------- Theorem 2


EPSILON = EXPERIMENT.epsilon
CYCLE = EXPERIMENT.cycle  # the n Theorem 2 asks for


def grows(pending: list[int], rate: float, capacity: float, horizon: float) -> bool:
    """Linear growth: Q rises from each quarter of the run to the next, and ends above half
    of (λ − capacity)·t — what one node's work bound (Theorem 1's argument) forces."""
    quarters = [pending[len(pending) * k // 4 - 1] for k in range(1, 5)]
    rising = all(later > earlier for earlier, later in itertools.pairwise(quarters))
    return rising and pending[-1] >= 0.5 * (rate - capacity) * horizon


@settings(max_examples=4)
@given(seed=st.integers(0, 2**32 - 1))
def test_theorem_2_rad_is_stable_below_its_capacity_and_grows_above(seed):
    """Below λ = (1 − ε)·r/T̄^R, with n from Theorem 2, RAD's queue keeps coming back to
    (almost) empty — a regenerative process — and stays a vanishing fraction of arrivals.
    Above r/T̄^R it grows linearly. Sarathi-Serve at the same loads: in our linear step
    model (no tiling staircase) its larger batches share the per-step cost more widely,
    so the theorem bounds it only above its own work bound (budget τ = t*_lcm)."""
    horizon, samples = 300.0, 60
    pending, arrived = EXPERIMENT.queue("rad", 1 - EPSILON, horizon, seed, samples)
    quarter = samples // 4
    assert all(min(pending[k : k + quarter]) <= COLS for k in range(0, samples, quarter))
    assert max(pending) <= 0.05 * arrived
    above = 1.3
    pending, _ = EXPERIMENT.queue("rad", above, horizon / 2, seed, samples)
    assert grows(pending, above * RAD_CAPACITY, RAD_CAPACITY, horizon / 2)
    beyond = 1.25 * SARATHI_CAPACITY / RAD_CAPACITY
    pending, _ = EXPERIMENT.queue("sarathi", beyond, horizon / 2, seed, samples)
    assert grows(pending, beyond * RAD_CAPACITY, SARATHI_CAPACITY, horizon / 2)


def test_theorem_2s_cycle_length_and_the_work_bounds():
    """n > (t*_col − 1)·T^max/(ε·T̄^R), and RAD's per-request work at least a budget-τ
    scheduler's when τ ≥ t*_col decodes fit in a step."""
    assert CYCLE > (COLS - 1) * T_MAX / (EPSILON * T_BAR) >= CYCLE - 1
    for prompt, output, _ in LENGTHS:
        assert request_time(STEP, prompt, output, CHUNK, COLS) >= budget_request_time(
            STEP, prompt, output, CHUNK
        )
    assert request_time(STEP, 32, 3, 16, 4) == pytest.approx(
        2 * STEP.base + 32 * STEP.per_prefill_token + 2 * (STEP.base / 4 + STEP.per_decode)
    )


# ---------------------------------------------------------------- engines


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Plugin]:
    for name in ("FAIRPOOL_SCHEDULER_CONFIG", "FAIRPOOL_SCHEDULER_POLICY"):
        monkeypatch.delenv(name, raising=False)
    with installed() as loaded:
        yield loaded


def test_the_vllm_plugin_refuses_rad_at_start_naming_the_policy(plugin, monkeypatch):
    monkeypatch.setenv("FAIRPOOL_SCHEDULER_POLICY", "rad")
    with pytest.raises(ConfigError) as error:
        FakeEngine(plugin)
    assert error.value.parameter == "policy" and "rad" in error.value.problem


def test_a_queue_only_engine_keeps_its_policy_when_the_file_switches_to_rad(tmp_path):
    config = tmp_path / "scheduler.json"
    config.write_text('{"policy": "fcfs"}')
    live = LiveScheduler(config, check_interval=0.0, queue_only=True)
    replacement = tmp_path / "new.json"
    replacement.write_text('{"policy": "rad", "tenants": {"a": 2}}')
    replacement.replace(config)
    assert not live.maybe_reload()
    assert live.config.policy_name == "fcfs" and "rad" in (live.last_error or "")
    assert LiveScheduler(config).config.policy_name == "rad"  # the simulated engine runs it


def test_fairpool_engine_refuses_rad_before_vllm_starts(monkeypatch):
    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("vLLM was started")

    monkeypatch.setattr(launch.subprocess, "Popen", no_child)
    with pytest.raises(ConfigError) as error:
        launch.run("model", [], None, "rad+memsafe")
    assert error.value.parameter == "policy"
