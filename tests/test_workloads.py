"""Workload generators: arrivals, rates, lengths, prefix sharing, and parameter checks."""

from __future__ import annotations

import io
import statistics
from collections import Counter, defaultdict
from dataclasses import replace
from itertools import pairwise

import pytest

from fairpool.sched.errors import ConfigError
from fairpool.sim import workloads
from fairpool.sim.trace import TraceRequest, read_trace, write_trace
from fairpool.sim.workloads import WORKLOADS, generate

pytestmark = pytest.mark.unit

DURATION = 240.0


def by_tenant(requests: list[TraceRequest]) -> dict[str, list[TraceRequest]]:
    groups: dict[str, list[TraceRequest]] = defaultdict(list)
    for request in requests:
        groups[request.tenant].append(request)
    return groups


def counts(requests: list[TraceRequest]) -> Counter[str]:
    return Counter(request.tenant for request in requests)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_workload_is_sorted_in_range_deterministic_and_round_trips(name):
    requests = generate(name, DURATION, seed=1)
    assert requests
    times = [request.t for request in requests]
    assert times == sorted(times)
    assert times[0] >= 0 and times[-1] < DURATION
    assert all(r.max_tokens >= r.output_tokens >= 1 and r.prompt_tokens >= 1 for r in requests)

    assert generate(name, DURATION, seed=1) == requests
    assert generate(name, DURATION, seed=2) != requests

    buffer = io.StringIO()
    write_trace(requests, buffer)
    buffer.seek(0)
    assert read_trace(buffer) == requests


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_tenants_never_share_a_segment_name(name):
    owners: dict[str, set[str]] = defaultdict(set)
    for request in generate(name, DURATION, seed=3):
        for segment, _ in request.segments:
            if segment is not None:
                owners[segment].add(request.tenant)
                assert segment.startswith(f"{request.tenant}/")
    assert all(len(tenants) == 1 for tenants in owners.values())


@pytest.mark.parametrize(
    ("name", "duration", "per_minute"),
    [
        ("vtc_overload", 360.0, {"c1": 90, "c2": 180}),
        ("vtc_proportional", 600.0, {"c1": 15, "c2": 30, "c3": 90}),
        ("vtc_on_off", 600.0, {"c1": 15, "c2": 120}),  # c1 is ON half the time
        ("vtc_on_off_overload", 600.0, {"c1": 60, "c2": 180}),
        ("vtc_weighted", 360.0, {"c1": 48, "c2": 48, "c3": 72, "c4": 96}),
    ],
)
def test_vtc_uniform_clients_send_at_the_paper_rates_with_256_tokens(name, duration, per_minute):
    requests = generate(name, duration)
    sent = counts(requests)
    assert set(sent) == set(per_minute)
    for tenant, rate in per_minute.items():
        assert abs(sent[tenant] - rate * duration / 60) <= 1
    assert all(r.segments == ((None, 256),) and r.output_tokens == 256 for r in requests)


def test_vtc_uniform_arrivals_are_evenly_spaced():
    gaps = {
        tenant: {round(b.t - a.t, 3) for a, b in pairwise(group)}
        for tenant, group in by_tenant(generate("vtc_overload", 120.0, seed=5)).items()
    }
    assert gaps == {"c1": {round(60 / 90, 3)}, "c2": {round(60 / 180, 3)}}


def test_vtc_on_off_client_is_silent_in_off_windows():
    client1 = by_tenant(generate("vtc_on_off", 600.0, seed=4))["c1"]
    assert all(int(r.t // 60) % 2 == 0 for r in client1)
    assert {int(r.t // 120) for r in client1} == set(range(5))


def test_vtc_short_long_is_poisson_at_8_and_1_5_per_second():
    groups = by_tenant(generate("vtc_short_long", 600.0, seed=7))
    assert len(groups["c1"]) == pytest.approx(8 * 600, rel=0.1)
    assert len(groups["c2"]) == pytest.approx(1.5 * 600, rel=0.15)
    assert {(r.prompt_tokens, r.output_tokens) for r in groups["c1"]} == {(64, 64)}
    assert {(r.prompt_tokens, r.output_tokens) for r in groups["c2"]} == {(256, 256)}
    gaps = [b.t - a.t for a, b in pairwise(groups["c1"])]
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.15)


def test_vtc_distribution_shift_has_three_phases():
    requests = generate("vtc_distribution_shift", 900.0)
    per_phase = [counts([r for r in requests if 300 * k <= r.t < 300 * (k + 1)]) for k in range(3)]
    # c1 is ON in [0, 60), [120, 180) and [240, 300) of phase 1: 3 minutes at 30/min
    expected = [{"c1": 90, "c2": 600}, {"c1": 300, "c2": 300}, {"c1": 150, "c2": 450}]
    for sent, want in zip(per_phase, expected, strict=True):
        for tenant, number in want.items():
            assert abs(sent[tenant] - number) <= 1
    assert all(int(r.t // 60) % 2 == 0 for r in requests if r.tenant == "c1" and r.t < 300)


def test_vtc_weighted_documents_its_weights():
    assert workloads.VTC_WEIGHTED_WEIGHTS == {"c1": 1.0, "c2": 2.0, "c3": 3.0, "c4": 4.0}
    assert set(counts(generate("vtc_weighted", 60.0))) == set(workloads.VTC_WEIGHTED_WEIGHTS)


def test_shared_prefix_clients_ask_several_questions_per_own_document():
    requests = generate("dlpm_shared_prefix", 600.0, misbehave="none", rate=0.5)
    for tenant, group in by_tenant(requests).items():
        assert len(group) == pytest.approx(300, rel=0.2)
        documents = Counter(r.segments[0][0] for r in group)
        assert all(str(name).startswith(f"{tenant}/doc") for name in documents)
        assert max(documents.values()) == 8
        for request in group:
            (_, document), (question, length) = request.segments
            assert (document, question, length, request.output_tokens) == (21_400, None, 50, 15)


def test_shared_prefix_misbehaving_client_sends_more_s1_or_longer_documents_s2():
    s1 = counts(generate("dlpm_shared_prefix", 600.0, misbehave="S1", rate_factor=4.0))
    assert s1["c0"] > 3 * max(s1["c1"], s1["c2"], s1["c3"])
    s2 = by_tenant(generate("dlpm_shared_prefix", 300.0, misbehave="S2"))
    assert {r.segments[0][1] for r in s2["c0"]} == {42_800}
    assert {r.segments[0][1] for r in s2["c1"]} == {21_400}


def tot_trees(requests: list[TraceRequest]) -> dict[str, list[TraceRequest]]:
    trees: dict[str, list[TraceRequest]] = defaultdict(list)
    for request in requests:
        trees[str(request.segments[0][0])].append(request)
    return trees


def test_tree_of_thoughts_children_extend_their_parents_full_prompt():
    requests = generate("dlpm_tree_of_thoughts", 2000.0, misbehave="none", level_gap=1.0)
    trees = tot_trees(requests)
    complete = [tree for tree in trees.values() if tree[-1].t < 1990]
    assert complete and all(len(tree) == 2 + 4 + 8 + 16 for tree in complete)
    for tree in complete:
        prompts = {r.segments for r in tree}
        depths = Counter(len(r.segments) for r in tree)
        assert depths == {1: 2, 2: 4, 3: 8, 4: 16}
        for request in tree:
            assert request.segments[0][1] == 90 and request.output_tokens == 200
            if len(request.segments) > 1:
                parent = request.segments[:-1]
                assert parent in prompts
                assert request.segments[-1][1] == 200  # the parent's output ...
                (father,) = [r for r in tree if r.segments == parent][:1]
                siblings = {r.output_segment for r in tree if r.segments == parent}
                assert request.segments[-1][0] in siblings  # ... named as its output
                assert father.output_segment is not None
                parent_time = min(r.t for r in tree if r.segments == parent)
                assert request.t == pytest.approx(parent_time + 1.0)
    assert statistics.mean(r.prompt_tokens for r in complete[0]) == pytest.approx(546, rel=0.02)


def test_tree_of_thoughts_misbehaving_client_has_bigger_trees_or_longer_questions():
    s1 = by_tenant(generate("dlpm_tree_of_thoughts", 3000.0, misbehave="S1", level_gap=0.0))
    assert {len(tree) for tree in tot_trees(s1["c0"]).values()} == {340}
    assert {len(tree) for tree in tot_trees(s1["c1"]).values()} == {30}
    s2 = by_tenant(generate("dlpm_tree_of_thoughts", 600.0, misbehave="S2", branching=3))
    assert {r.segments[0][1] for r in s2["c0"]} == {900}
    assert {r.segments[0][1] for r in s2["c2"]} == {90}


def test_judge_branches_share_the_article_and_the_merge_reads_every_verdict():
    requests = generate("dlpm_judge", 600.0, misbehave="S1", level_gap=0.0)
    programs: dict[str, list[TraceRequest]] = defaultdict(list)
    for request in requests:
        programs[str(request.segments[0][0])].append(request)
    for article, program in programs.items():
        size = 17 if article.startswith("c0/") else 3
        assert len(program) == size
        *branches, merge = program
        assert len(merge.segments) == size  # the article and one verdict per dimension
        assert all(len(r.segments) == 2 for r in branches)


def test_mixed_chat_histories_grow_under_one_name_and_programs_are_present():
    requests = generate("dlpm_mixed", 1200.0, seed=2)
    assert set(counts(requests)) == {"chat0", "chat1", "tot", "judge"}
    conversations: dict[str, list[TraceRequest]] = defaultdict(list)
    for request in requests:
        if request.tenant.startswith("chat"):
            assert len(request.segments) == 1
            conversations[str(request.segments[0][0])].append(request)
    assert max(len(turns) for turns in conversations.values()) == 4
    for turns in conversations.values():
        lengths = [r.segments[0][1] for r in turns]
        for before, after, earlier in zip(lengths, lengths[1:], turns, strict=False):
            assert after > before + earlier.output_tokens  # history, reply, new message
        assert [r.t for r in turns] == pytest.approx(
            [turns[0].t + 15 * k for k in range(len(turns))]
        )


@pytest.mark.parametrize("clients", [5, 50])
def test_client_scaling_keeps_the_total_rate_with_one_prefix_per_client(clients):
    requests = generate("dlpm_client_scaling", 600.0, clients=clients, total_rate=4.0)
    assert len(requests) == pytest.approx(2400, rel=0.08)
    assert len(counts(requests)) == clients
    for tenant, group in by_tenant(requests).items():
        assert {r.segments[0] for r in group} == {(f"{tenant}/system", 1024)}


@pytest.mark.parametrize("rate", [50.0, 10.0])
def test_lmsys_like_is_poisson_with_heavy_tailed_lengths(rate):
    requests = generate("lmsys_like", 200.0, rate=rate, seed=3)
    assert len(requests) == pytest.approx(rate * 200, rel=0.1)
    prompts = [r.prompt_tokens for r in requests]
    outputs = [r.output_tokens for r in requests]
    assert statistics.median(prompts) == pytest.approx(11, abs=2)
    assert statistics.median(outputs) == pytest.approx(45, abs=5)
    if rate == 50.0:  # enough samples for the means of these heavy tails
        assert statistics.mean(prompts) == pytest.approx(40.62, rel=0.2)
        assert statistics.mean(outputs) == pytest.approx(85.32, rel=0.1)
    assert max(prompts) <= 2048 and max(outputs) <= 2048


def test_lmsys_like_spreads_requests_over_tenants():
    assert set(counts(generate("lmsys_like", 20.0, tenants=3))) == {"u0", "u1", "u2"}


@pytest.mark.parametrize("fraction", [0.1, 0.5])
def test_lmsys_like_hang_ups_leave_the_requests_as_they_were(fraction):
    """`hang_up`: that fraction of the requests carry a client that leaves after an
    exponential wait of mean `patience`, streamed; the requests themselves do not change."""
    plain = generate("lmsys_like", 200.0, seed=5)
    leaving = generate("lmsys_like", 200.0, seed=5, hang_up=fraction, patience=4.0)
    assert [replace(r, cancel_after=None) for r in leaving] == plain
    waits = [r.cancel_after for r in leaving if r.cancel_after is not None]
    assert len(waits) / len(leaving) == pytest.approx(fraction, abs=0.03)
    assert statistics.mean(waits) == pytest.approx(4.0, rel=0.15)
    assert all(r.stream for r in leaving)


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.95])
def test_slo_tiers_mark_the_paying_fraction_with_tight_tbt(fraction):
    requests = generate("slo_tiers", 2000.0, seed=1, rate=1.5, paying_fraction=fraction)
    sent = counts(requests)
    assert sent["paying"] / len(requests) == pytest.approx(fraction, abs=0.03)
    for request in requests:
        assert request.slo is not None
        assert request.slo.tbt == (0.1 if request.tenant == "paying" else 0.5)
        assert request.prompt_tokens + request.output_tokens <= 8192
    assert statistics.median(r.prompt_tokens for r in requests) == pytest.approx(1730, rel=0.15)
    assert statistics.median(r.output_tokens for r in requests) == pytest.approx(415, rel=0.1)


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: generate("nope", 10.0), "workload"),
        (lambda: generate("vtc_overload", -1.0), "duration"),
        (lambda: generate("vtc_overload", 10.0, rate=3), "rate"),
        (lambda: generate("vtc_overload", 10.0, seed="x"), "seed"),
        (lambda: generate("vtc_overload", 10.0, rpm=[90, -1]), "rpm[1]"),
        (lambda: generate("vtc_short_long", 10.0, rates=[1.0]), "rates"),
        (lambda: generate("dlpm_shared_prefix", 10.0, misbehave="S3"), "misbehave"),
        (lambda: generate("dlpm_tree_of_thoughts", 10.0, branching=0), "branching"),
        (lambda: generate("dlpm_client_scaling", 10.0, clients=1.5), "clients"),
        (lambda: generate("lmsys_like", 10.0, rate=0), "rate"),
        (lambda: generate("lmsys_like", 10.0, hang_up=1.5), "hang_up"),
        (lambda: generate("lmsys_like", 10.0, patience=0), "patience"),
        (lambda: generate("slo_tiers", 10.0, paying_fraction=1.5), "paying_fraction"),
        (lambda: workloads.vtc_on_off(duration=0), "duration"),
    ],
)
def test_bad_parameters_raise_config_error_naming_them(call, parameter):
    with pytest.raises(ConfigError) as error:
        call()
    assert error.value.parameter == parameter


def test_unknown_workload_error_lists_the_known_ones():
    with pytest.raises(ConfigError, match="vtc_overload"):
        generate("nope", 10.0)


def test_workload_parameters_list_each_generators_own_defaults():
    assert workloads.workload_parameters("slo_tiers")["paying_fraction"] == 0.05
    assert "duration" not in workloads.workload_parameters("vtc_overload")
