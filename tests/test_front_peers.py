"""Gateway replicas that share their fronts' state (`fairpool.front.peers`), in one
process (`share_among`, as the simulator runs them): the saturation cap counts every
replica's requests, a freed slot goes to the tenant furthest below its share whichever
replica holds it, nothing is lost; and the reports replicas exchange through the shared
state parse back to what was sent, or are refused."""

from __future__ import annotations

import itertools

import pytest
from front_helpers import WEIGHTS, WORKERS, in_flight, replicas
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairpool.front import Flight, FrontRequest, Outcome, Usage
from fairpool.front.peers import (
    LONGEST_NAME,
    MOST_COUNTER,
    MOST_HELD,
    REPORT_BYTES,
    HeardPeers,
    ReplicaState,
)
from fairpool.sched.errors import ConfigError

pytestmark = pytest.mark.unit

events = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(0, 2), st.sampled_from(sorted(WEIGHTS))),
        st.tuples(st.just("output"), st.integers(0, 50), st.integers(1, 40)),
        st.tuples(st.just("finish"), st.integers(0, 50), st.integers(0, 40)),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(count=st.integers(2, 3), cap=st.integers(1, 3), script=events)
@example(  # found by the search: the replicas heard a charge one after another, and each
    # held back for the other's stale counter, leaving a slot idle (fixed: all hear first)
    count=3,
    cap=1,
    script=[
        ("arrive", 0, "gold"),
        ("arrive", 0, "bronze"),
        ("arrive", 0, "gold"),
        ("arrive", 1, "bronze"),
        ("arrive", 2, "bronze"),
        ("finish", 0, 0),
        ("finish", 1, 0),
    ],
)
def test_replicas_sharing_state_keep_one_cap_lose_nothing_and_leave_no_slot_idle(
    count, cap, script
):
    fronts = replicas(count, cap)
    ids = itertools.count()
    flights: list[Flight] = []
    for event in script:
        if event[0] == "arrive":
            front = fronts[event[1] % count]
            request = FrontRequest(f"r{next(ids)}", event[2], "", 30, 40)
            flights.append(front.arrive(request))
        else:
            dispatched = [flight for flight in flights if not flight.queued and not flight.settled]
            if not dispatched:
                continue
            flight = dispatched[event[1] % len(dispatched)]
            if event[0] == "output":
                flight.observe_output(event[2])
            else:
                flight.settle(Outcome(usage=Usage(30, 0, flight.output_tokens + event[2])))
        # One cap for all: no worker holds more than `cap` requests of all replicas.
        assert all(in_flight(fronts, worker) <= cap for worker in WORKERS)
        # Work conservation: while any replica holds a request, every worker is full.
        if any(front.queue.queued() for front in fronts):
            assert all(in_flight(fronts, worker) == cap for worker in WORKERS)
        # Nothing lost: each flight is queued at its replica, in flight there, or settled.
        for flight in flights:
            front = flight.front
            if flight.queued:
                assert front.queue.is_queued(flight.request_id)
            elif not flight.settled:
                assert flight.decision is not None
                assert front.router.workers[flight.decision.worker].outstanding > 0


def test_replicas_deciding_alone_each_fill_the_cap():
    """Why they share: alone, two replicas put twice the cap on each worker."""
    fronts = replicas(2, cap=1, share=False)
    for index in range(4):
        fronts[index % 2].arrive(FrontRequest(f"r{index}", "gold", "", 30, 40))
    assert [in_flight(fronts, worker) for worker in WORKERS] == [2, 2]


def test_a_freed_slot_goes_to_the_tenant_furthest_below_its_share_at_another_replica():
    a, b = replicas(2, cap=1)
    for index in range(4):  # bronze fills both workers through a, and waits there
        a.arrive(FrontRequest(f"bronze{index}", "bronze", "", 30, 40))
    gold = b.arrive(FrontRequest("gold0", "gold", "", 30, 40))
    assert gold.queued and a.queue.queued("bronze") == 2
    first = next(flight for flight in a._flights.values() if not flight.queued)
    first.settle(Outcome(usage=Usage(30, 0, 40)))
    # a held its bronze back: gold, at b, has the smaller counter (4 times the weight).
    assert not gold.queued and a.queue.queued("bronze") == 2


def test_a_tenant_that_starts_waiting_is_lifted_to_the_least_counter_waiting_anywhere():
    a, b = replicas(2, cap=1)
    for index in range(6):  # silver, served for a while through a: its counter grows
        flight = a.arrive(FrontRequest(f"silver{index}", "silver", "", 30, 40))
        if not flight.queued:
            flight.settle(Outcome(usage=Usage(30, 0, 40)))
    for index in range(4):
        a.arrive(FrontRequest(f"more{index}", "silver", "", 30, 40))
    waiting = a.queue.counter("silver")
    assert a.queue.queued("silver") and waiting > 0
    b.arrive(FrontRequest("gold0", "gold", "", 30, 40))  # new at b: lifted to silver's
    assert b.queue.counter("gold") == pytest.approx(waiting)


def test_a_fcfs_queue_shares_the_cap_and_leaves_the_order_to_whoever_hears_first():
    """fcfs is fairness off: the replicas share the cap, and a freed slot goes to the
    first replica that hears of it (here the other one, told at the settlement)."""
    a, b = replicas(2, cap=1, queue_policy="fcfs")
    for index in range(3):
        a.arrive(FrontRequest(f"bronze{index}", "bronze", "", 30, 40))
    gold = b.arrive(FrontRequest("gold0", "gold", "", 30, 40))
    assert gold.queued
    first = next(flight for flight in a._flights.values() if not flight.queued)
    first.settle(Outcome(usage=Usage(30, 0, 40)))
    assert not gold.queued and a.queue.queued("bronze") == 1
    assert [in_flight([a, b], worker) for worker in WORKERS] == [1, 1]


def test_replicas_that_cannot_hear_each_other_divide_the_cap():
    """The shared state is down: each replica takes the others to hold what it holds."""
    (front,) = replicas(1, cap=4, share=False)
    peers = HeardPeers()
    front.share_with(peers)
    peers.lost(replicas=2)
    flights = [front.arrive(FrontRequest(f"r{index}", "gold", "", 30, 40)) for index in range(6)]
    assert [front.router.workers[worker].outstanding for worker in WORKERS] == [2, 2]
    assert sum(flight.queued for flight in flights) == 2
    peers.hear({})  # heard again, and nobody else holds anything
    front.release_waiting()
    assert not any(flight.queued for flight in flights)


counters = st.floats(-MOST_COUNTER, MOST_COUNTER, allow_nan=False, allow_infinity=False)
states = st.builds(
    ReplicaState,
    st.dictionaries(st.text(min_size=1), st.integers(0, 1000)),
    st.dictionaries(st.text(min_size=1), st.tuples(st.integers(0, 1000), counters)),
)


@given(state=states)
def test_a_replicas_report_parses_back_to_what_it_said(state):
    assert ReplicaState.from_json(state.to_json()) == state


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"inFlight": [], "queued": {}}',
        '{"inFlight": {"w0": "many"}, "queued": {}}',
        '{"inFlight": {}, "queued": {"t": [1]}}',
        '{"queued": {}}',
    ],
)
def test_a_report_of_another_shape_is_refused_by_name(text):
    with pytest.raises(ConfigError, match="replica state"):
        ReplicaState.from_json(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"inFlight": {"w0": 1}, "queued": {"t": [1, NaN]}}', "counter of nan"),
        ('{"inFlight": {}, "queued": {"t": [1, Infinity]}}', "counter of inf"),
        ('{"inFlight": {}, "queued": {"t": [1, 1e300]}}', "counter of 1e+300"),
        ('{"inFlight": {"w0": -1}, "queued": {}}', "count of -1"),
        ('{"inFlight": {"w0": 2.5}, "queued": {}}', "count of 2.5"),
        ('{"inFlight": {"w0": true}, "queued": {}}', "count of True"),
        (f'{{"inFlight": {{"w0": {MOST_HELD + 1}}}, "queued": {{}}}}', "count of"),
        (
            f'{{"inFlight": {{"w0": {MOST_HELD}}}, "queued": {{"t": [1, 0]}}}}',
            f"{MOST_HELD + 1} requests held",
        ),
        (f'{{"inFlight": {{"{"w" * (LONGEST_NAME + 1)}": 1}}, "queued": {{}}}}', "a name of"),
        ("[" * 100_000 + "]" * 100_000, "not a replica's report"),
        (" " * (REPORT_BYTES + 1), "bytes: the most is"),
    ],
    ids=[
        "nan",
        "infinite",
        "huge-counter",
        "negative",
        "fraction",
        "bool",
        "count-too-big",
        "holds-too-much",
        "long-name",
        "deep",
        "long",
    ],
)
def test_a_report_no_replica_could_write_is_refused_saying_why(text, says):
    """What another replica reports is bounded before it counts: finite, within what one
    replica can hold, short names, a bounded length and nesting."""
    with pytest.raises(ConfigError, match="replica state") as error:
        ReplicaState.from_json(text)
    assert says in str(error.value)


@given(text=st.text())
def test_any_text_is_a_report_or_refused_by_name(text):
    try:
        assert isinstance(ReplicaState.from_json(text), ReplicaState)
    except ConfigError as error:
        assert "replica state" in str(error)


def test_peers_count_what_goes_before_a_tenant_by_counter_then_name():
    peers = HeardPeers()
    peers.hear(
        {
            "x": ReplicaState({"w0": 2}, {"bronze": (3, 10.0), "gold": (1, 5.0)}),
            "y": ReplicaState({"w0": 1, "w1": 4}, {"silver": (2, 5.0), "gold": (2, 7.0)}),
        }
    )
    assert (peers.in_flight("w0"), peers.in_flight("w1"), peers.in_flight("w2")) == (3, 4, 0)
    assert peers.queued_before("gold", 6.0) == 2  # silver's 2 at 5.0; gold's own never
    assert peers.queued_before("silver", 5.0) == 1  # gold's 1 at 5.0 ties, first by name
    assert peers.queued_before("bronze", 5.0) == 0  # ... and after bronze
    assert sorted(peers.waiting_counters()) == [5.0, 5.0, 7.0, 10.0]
    peers.hear({})
    assert peers.in_flight("w0") == 0 and len(peers) == 0
