"""The operator's planner (digest §6.3): node groups in, vLLM pipeline engines out.

Worked example of digest §6.5, footnote 11's τ^p, partitions that vLLM 0.32 accepts, the
plan's JSON shape, and errors that name the field.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.placement import (
    ModelProfile,
    NodeGroup,
    PlanPolicy,
    PoolPlan,
    Workload,
    check_partition,
    plan_chains,
)
from fairpool.placement.profile import layer_seconds
from fairpool.sched.errors import ConfigError

pytestmark = pytest.mark.unit

GB = 10**9
GIB = 2**30

#: Digest §6.5: L = 80, s_m = 1.71 GB, s_c = 4 KiB/token/layer × 8192 (≈ 0.0336 GB).
EXAMPLE_MODEL = ModelProfile(
    layers=80, layer_bytes=1_710_000_000, kv_bytes_per_token_per_layer=4096, max_model_len=8192
)
EXAMPLE_GROUPS = [
    NodeGroup("h100", 4, 68 * GB, memory_utilization=1.0, layer_seconds=0.146),
    NodeGroup("l40s", 4, 38 * GB, memory_utilization=1.0, layer_seconds=0.40),
    NodeGroup("a10g", 8, 18 * GB, memory_utilization=1.0, layer_seconds=0.70),
]


def example_plan(arrival_rate: float, **policy: object) -> PoolPlan:
    workload = Workload(arrival_rate, mean_input_tokens=2000, mean_output_tokens=200)
    return plan_chains(EXAMPLE_MODEL, EXAMPLE_GROUPS, workload, PlanPolicy(**policy))  # type: ignore[arg-type]


def test_digest_worked_example_without_rebalancing() -> None:
    """Digest §6.5 reproduces exactly with the exact partitions of GBP-CR's chains:
    λ = 1 → c* = 22, one chain of three H100, "27,27,26", c_k = 24, T = 11.83 s;
    λ = 2 → c* = 46, four H100, "20,20,20,20", c_k = 50, T = 11.88 s; the rest idle."""
    plan = example_plan(1.0, rebalance=False)
    assert plan.capacity_param == 22
    (chain,) = plan.chains
    assert chain.nodes == ("h100-0", "h100-1", "h100-2")
    assert chain.groups == ("h100", "h100", "h100")
    assert chain.partition_string == "27,27,26"
    assert chain.capacity == 24
    assert chain.service_seconds == pytest.approx(11.83)
    assert plan.bounds.lower == pytest.approx(11.83, abs=0.005)
    assert plan.bounds.upper == pytest.approx(plan.bounds.lower)
    assert len(plan.idle_nodes) == 13 and "h100-3" in plan.idle_nodes

    plan = example_plan(2.0, rebalance=False)
    assert plan.capacity_param == 46
    (chain,) = plan.chains
    assert chain.nodes == ("h100-0", "h100-1", "h100-2", "h100-3")
    assert (chain.partition_string, chain.capacity) == ("20,20,20,20", 50)
    assert chain.service_seconds == pytest.approx(11.88)
    assert all(node.startswith(("l40s", "a10g")) for node in plan.idle_nodes)

    assert example_plan(1.0, rebalance=False, tuning="surrogate").capacity_param == 19


def test_digest_worked_example_with_rebalancing_and_the_score_tolerance() -> None:
    """With REBALANCE (the default) the H100 chain gets its best split "27,27,26" (c_k = 24)
    whatever c is, so a small c no longer costs the fast chain capacity; it only makes
    GBP-CR build more chains (it stops at λ/(ρ̄c)), and extra, slower chains can only lower
    Theorem 3.7's lower bound (it assumes jobs sit on the fastest chains). With no score
    tolerance the lower bound therefore picks c = 3 with three chains (15 nodes): 11.8306 s
    against 11.8313 s for the H100 chain alone, while the upper bound rises to 25.5 s. The
    planner's default tolerance (1 %) counts those as a tie and takes the plan with the
    fewest nodes: the digest's chain, three H100, the rest idle."""
    plan = example_plan(1.0)
    (chain,) = plan.chains
    assert (chain.partition_string, chain.capacity) == ("27,27,26", 24)
    assert chain.nodes == ("h100-0", "h100-1", "h100-2")
    assert plan.bounds.upper == pytest.approx(11.83, abs=0.005)
    assert len(plan.idle_nodes) == 13

    literal = example_plan(1.0, score_tolerance=0.0)
    assert literal.capacity_param == 3
    assert len(literal.chains) == 3
    assert (literal.chains[0].partition_string, literal.chains[0].capacity) == ("27,27,26", 24)
    assert literal.bounds.lower == pytest.approx(11.8306, abs=1e-4)
    assert literal.bounds.upper == pytest.approx(25.47, abs=0.01)
    assert any("fastest 1 chain(s) alone (3 nodes)" in line for line in literal.explanation)
    assert any("rebalanced from 37,37,6 (capacity 3)" in line for line in literal.explanation)
    assert len(example_plan(1.0, tuning="upperBound").chains) == 1


def test_plan_to_dict_is_the_status_shape() -> None:
    plan = example_plan(1.0, rebalance=False)
    data = plan.to_dict()
    assert set(data) == {
        "capacityParam",
        "predictedResponseSeconds",
        "chains",
        "idleNodes",
        "explanation",
    }
    assert data["capacityParam"] == 22
    assert set(data["predictedResponseSeconds"]) == {"lower", "upper"}
    assert data["chains"][0] == {
        "name": "chain-0",
        "nodes": ["h100-0", "h100-1", "h100-2"],
        "groups": ["h100", "h100", "h100"],
        "layerPartition": "27,27,26",
        "capacity": 24,
        "serviceSeconds": pytest.approx(11.83),
    }
    json.dumps(data)  # JSON-able
    explanation = data["explanation"]
    assert explanation[0].startswith("c = 22: chosen by Theorem 3.7's lower bound")
    assert "c = 21" in explanation[0] and "c = 23" in explanation[0]
    assert any(line.startswith("fastest per layer: h100") for line in explanation)
    assert any("not needed" in line and "a10g-7" in line for line in explanation)
    for topic in ("exact", "share a node", "paged"):
        assert any("vLLM differs" in line and topic in line for line in explanation)


def test_a_model_that_fits_one_gpu_gets_single_stage_chains() -> None:
    """A 7B model (32 layers of 0.4 GB) on 80 GiB H100s: every chain is one node, "32"."""
    model = ModelProfile(32, 404_750_336, 16384, 4096, 262_144_000, 262_144_000)
    groups = [NodeGroup("h100", 4, 80 * GIB, reserve_bytes=4 * GIB, layer_seconds=0.02)]
    for arrival_rate in (0.5, 5.0, 15.0):
        plan = plan_chains(model, groups, Workload(arrival_rate, 2000, 200))
        assert plan.chains and all(chain.partition_string == "32" for chain in plan.chains)
        assert all(len(chain.nodes) == 1 for chain in plan.chains)


def test_footnote_11_layer_seconds() -> None:
    """§4.1.1: 1 + (5/120)·2000 + (1.32/1.02)·19 = 108.9 ms and 175.2 ms for 80 TFLOPS,
    0.51 GB/ms (bandwidth in GB/s here)."""
    model = ModelProfile(70, 1_320_000_000, 1, 1, flops_per_token_per_layer=5e9)
    workload = Workload(0.2, mean_input_tokens=2000, mean_output_tokens=20)
    high = NodeGroup("high", 1, 40 * GB, tflops=120, bandwidth_gbps=1020)
    low = NodeGroup("low", 1, 20 * GB, tflops=80, bandwidth_gbps=510)
    assert layer_seconds(high, model, workload) == pytest.approx(0.1089, abs=5e-5)
    assert layer_seconds(low, model, workload) == pytest.approx(0.1752, abs=5e-5)
    measured = NodeGroup("m", 1, 40 * GB, layer_seconds=0.3, tflops=1, bandwidth_gbps=1)
    assert layer_seconds(measured, model, workload) == 0.3


def test_usable_memory_is_exact() -> None:
    group = NodeGroup("g", 1, 85_899_345_920, memory_utilization=0.9, reserve_bytes=4 * GIB)
    assert group.usable_bytes == 85_899_345_920 * 9 // 10 - 4 * GIB


def test_long_chains_are_not_deployed() -> None:
    """Eight 10 GB nodes for an 80-layer model of 1 GB layers: a chain needs ≥ 9 stages."""
    model = ModelProfile(80, GB, 1000, 1000)
    plan_groups = [NodeGroup("small", 12, 10 * GB, 1.0, layer_seconds=0.1)]
    with pytest.raises(ConfigError) as error:
        plan_chains(model, plan_groups, Workload(0.01, 100, 10), PlanPolicy(max_stages=8))
    assert error.value.parameter == "workload.arrivalRate"
    plan = plan_chains(model, plan_groups, Workload(0.01, 100, 10), PlanPolicy(max_stages=12))
    assert all(len(chain.nodes) <= 12 for chain in plan.chains)


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(1, 40),
    groups=st.lists(
        st.tuples(st.integers(1, 4), st.integers(4, 60), st.floats(0.05, 1.0)),
        min_size=1,
        max_size=3,
    ),
    arrival_rate=st.floats(0.01, 2.0),
    rebalance=st.booleans(),
    extras=st.integers(0, 2),
)
def test_plans_are_valid_for_vllm(
    layers: int,
    groups: list[tuple[int, int, float]],
    arrival_rate: float,
    rebalance: bool,
    extras: int,
) -> None:
    model = ModelProfile(layers, GB, 1000, 20_000, extras * GB // 2, extras * GB // 4)
    node_groups = [
        NodeGroup(f"g{i}", count, memory * GB, 1.0, layer_seconds=seconds)
        for i, (count, memory, seconds) in enumerate(groups)
    ]
    try:
        plan = plan_chains(
            model, node_groups, Workload(arrival_rate, 100, 10), PlanPolicy(rebalance=rebalance)
        )
    except ConfigError as error:
        assert error.parameter in ("nodeGroups", "workload.arrivalRate")
        return
    names = [f"g{i}-{k}" for i, (count, _, _) in enumerate(groups) for k in range(count)]
    used = [node for chain in plan.chains for node in chain.nodes]
    assert len(used) == len(set(used))
    assert sorted(used + plan.idle_nodes) == sorted(names)
    for chain in plan.chains:
        assert sum(chain.layer_partition) == layers
        assert len(chain.layer_partition) == len(chain.nodes) == len(chain.groups)
        ranges = check_partition(chain.partition_string, len(chain.nodes), layers)
        assert ranges[0][0] == 0 and ranges[-1][1] == layers
        assert chain.capacity >= 1
    assert plan.bounds.lower <= plan.bounds.upper


def test_check_partition_follows_vllm_get_pp_indices() -> None:
    assert check_partition("27,27,26", 3, 80) == [(0, 27), (27, 54), (54, 80)]
    assert check_partition("80", 1, 80) == [(0, 80)]
    assert check_partition(" 27, 27 ,26", 3, 80) == [(0, 27), (27, 54), (54, 80)]  # int()
    assert check_partition("2_7,+27,26", 3, 80) == [(0, 27), (27, 54), (54, 80)]
    for text, size, layers in (
        ("27,27", 3, 80),  # len != pp size
        ("27,27,27", 3, 80),  # sum != num_hidden_layers
        ("27;27;26", 3, 80),  # not ints
        ("27,,53", 3, 80),
        ("", 1, 80),
        ("80,0", 2, 80),  # vLLM would accept an empty stage; we do not
        ("81,-1", 2, 80),
    ):
        with pytest.raises(ConfigError) as error:
            check_partition(text, size, layers)
        assert error.value.parameter == "layerPartition"


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ModelProfile(0, GB, 1, 1), "model.layers"),
        (lambda: ModelProfile(8, 0, 1, 1), "model.layerBytes"),
        (lambda: ModelProfile(8, GB, 1, 0), "model.maxModelLen"),
        (
            lambda: ModelProfile(8, GB, 1, 1, flops_per_token_per_layer=0),
            "model.flopsPerTokenPerLayer",
        ),
        (lambda: NodeGroup("g", 0, GB), "nodeGroups[g].count"),
        (lambda: NodeGroup("g", 1, GB, memory_utilization=1.5), "nodeGroups[g].memoryUtilization"),
        (lambda: NodeGroup("g", 1, GB, reserve_bytes=GB), "nodeGroups[g].reserveBytes"),
        (lambda: NodeGroup("g", 1, GB, tflops=-1), "nodeGroups[g].tflops"),
        (lambda: NodeGroup("g", 1, GB, gpus=0), "nodeGroups[g].gpus"),
        (lambda: NodeGroup("", 1, GB), "nodeGroups[].name"),
        (lambda: Workload(0.0, 10, 10), "workload.arrivalRate"),
        (lambda: Workload(1.0, 10, 0.5), "workload.meanOutputTokens"),
        (lambda: Workload(1.0, 10, 10, target_load=1.0), "workload.targetLoad"),
        (lambda: PlanPolicy(capacity_param=0), "policy.capacityParam"),
        (lambda: PlanPolicy(tuning="fast"), "policy.tuning"),  # type: ignore[arg-type]
        (lambda: PlanPolicy(max_stages=0), "policy.maxStages"),
    ],
)
def test_bad_inputs_name_the_field(build: object, field: str) -> None:
    assert callable(build)
    with pytest.raises(ConfigError) as error:
        build()
    assert error.value.parameter == field


def plan_error(
    groups: list[NodeGroup],
    model: ModelProfile = EXAMPLE_MODEL,
    workload: Workload | None = None,
    policy: PlanPolicy | None = None,
) -> str:
    with pytest.raises(ConfigError) as error:
        plan_chains(model, groups, workload or Workload(1.0, 2000, 200), policy)
    return error.value.parameter


def test_planner_errors_name_the_field() -> None:
    speedless = NodeGroup("h100", 4, 68 * GB)
    assert plan_error([speedless]) == "nodeGroups[h100].tflops"
    no_bandwidth = NodeGroup("h100", 4, 68 * GB, tflops=400)
    assert plan_error([no_bandwidth]) == "nodeGroups[h100].bandwidthGbps"
    estimated = NodeGroup("h100", 4, 68 * GB, tflops=400, bandwidth_gbps=2500)
    assert plan_error([estimated]) == "model.flopsPerTokenPerLayer"
    mixed = [EXAMPLE_GROUPS[0], NodeGroup("big", 2, 640 * GB, layer_seconds=0.05, gpus=8)]
    assert plan_error(mixed) == "nodeGroups"
    assert plan_error([]) == "nodeGroups"
    assert plan_error([EXAMPLE_GROUPS[0], EXAMPLE_GROUPS[0]]) == "nodeGroups"
    assert plan_error([NodeGroup("a10g", 2, 18 * GB, 1.0, layer_seconds=0.7)]) == "nodeGroups"
    assert plan_error(EXAMPLE_GROUPS, workload=Workload(100.0, 2000, 200)) == (
        "workload.arrivalRate"
    )
    assert plan_error(EXAMPLE_GROUPS, policy=PlanPolicy(capacity_param=1900)) == (
        "policy.capacityParam"
    )


def test_a_fixed_capacity_param_is_used_as_given() -> None:
    plan = example_plan(1.0, capacity_param=46, rebalance=False)
    assert plan.capacity_param == 46
    assert plan.chains[0].partition_string == "20,20,20,20"
    assert plan.explanation[0] == "c = 46: fixed by policy.capacityParam"
