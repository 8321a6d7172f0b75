"""Theorem 3.7's bounds, the App. A.3 exact K = 2 value and Erlang C (seed 003, §3.2.2).

The reference is the JFFC Markov chain itself (eq. 23), solved numerically with its queue
truncated where the remaining probability is below 1e-12: lower ≤ exact ≤ upper, the
K = 2 recursion equals it, and with one chain both bounds are the M/M/c value.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairpool.placement import (
    Chain,
    chain_bounds,
    exact_two_chains,
    jffc_bounds,
    mmc_response_time,
)
from fairpool.sched.errors import ConfigError

pytestmark = pytest.mark.unit


def solve_stationary(rates: dict[tuple[int, int], float], states: int) -> list[float]:
    """π with πQ = 0 and Σπ = 1, by Gaussian elimination with partial pivoting."""
    # Rows: balance equations of states 1..S−1 (transposed generator), plus Σπ = 1.
    matrix = [[0.0] * (states + 1) for _ in range(states)]
    for (source, target), rate in rates.items():
        matrix[target][source] += rate
        matrix[source][source] -= rate
    matrix[0] = [1.0] * states + [1.0]
    for column in range(states):
        pivot = max(range(column, states), key=lambda row: abs(matrix[row][column]))
        matrix[column], matrix[pivot] = matrix[pivot], matrix[column]
        lead = matrix[column][column]
        for row in range(states):
            if row != column and matrix[row][column]:
                factor = matrix[row][column] / lead
                for k in range(column, states + 1):
                    matrix[row][k] -= factor * matrix[column][k]
    return [matrix[row][states] / matrix[row][row] for row in range(states)]


def ctmc_response_time(arrival_rate: float, rates: list[float], capacities: list[int]) -> float:
    """Mean response time of JFFC from the CTMC of eq. (23), chains fastest first."""
    order = sorted(range(len(rates)), key=lambda k: -rates[k])
    mu = [rates[k] for k in order]
    cap = [capacities[k] for k in order]
    nu = sum(c * m for c, m in zip(cap, mu, strict=True))
    rho = arrival_rate / nu
    queue = max(1, math.ceil(math.log(1e-12) / math.log(rho)))
    busy = list(itertools.product(*(range(c + 1) for c in cap)))
    full = tuple(cap)
    index = {(0, *z): i for i, z in enumerate(busy)}
    for n in range(1, queue + 1):
        index[(n, *full)] = len(index)
    rates_between: dict[tuple[int, int], float] = {}
    for state, i in index.items():
        waiting, z = state[0], state[1:]
        free = [k for k in range(len(z)) if z[k] < cap[k]]
        if free:  # an arrival joins the fastest chain with room
            arrived = list(z)
            arrived[free[0]] += 1
            rates_between[(i, index[(0, *arrived)])] = arrival_rate
        elif waiting < queue:
            rates_between[(i, index[(waiting + 1, *z)])] = arrival_rate
        if waiting:  # a completion takes the head of the queue
            rates_between[(i, index[(waiting - 1, *z)])] = nu
            continue
        for k, jobs in enumerate(z):
            if jobs:
                left = list(z)
                left[k] -= 1
                rates_between[(i, index[(0, *left)])] = jobs * mu[k]
    pi = solve_stationary(rates_between, len(index))
    occupancy = sum(pi[i] * sum(state) for state, i in index.items())
    return occupancy / arrival_rate  # Little's law (24)


chain_sets = st.lists(
    st.tuples(st.floats(0.2, 3.0), st.integers(1, 3)), min_size=1, max_size=3
).filter(lambda chains: math.prod(c + 1 for _, c in chains) <= 40)


@settings(max_examples=30, deadline=None)
@given(chains=chain_sets, load=st.floats(0.05, 0.6))
def test_bounds_bracket_the_ctmc(chains: list[tuple[float, int]], load: float) -> None:
    rates = [rate for rate, _ in chains]
    capacities = [capacity for _, capacity in chains]
    arrival_rate = load * sum(r * c for r, c in chains)
    exact = ctmc_response_time(arrival_rate, rates, capacities)
    bounds = jffc_bounds(arrival_rate, rates, capacities)
    assert bounds.lower <= exact * (1 + 1e-9)
    assert exact <= bounds.upper * (1 + 1e-9)
    assert bounds.lower >= 1 / max(rates) * (1 - 1e-12)  # no job beats the fastest chain


@settings(max_examples=30, deadline=None)
@given(
    fast=st.tuples(st.floats(0.2, 3.0), st.integers(1, 4)),
    slow=st.tuples(st.floats(0.2, 3.0), st.integers(1, 4)),
    load=st.floats(0.05, 0.6),
)
def test_exact_two_chains_equals_the_ctmc(
    fast: tuple[float, int], slow: tuple[float, int], load: float
) -> None:
    rates, capacities = (fast[0], slow[0]), (fast[1], slow[1])
    arrival_rate = load * (fast[0] * fast[1] + slow[0] * slow[1])
    exact = exact_two_chains(arrival_rate, rates, capacities)
    assert exact == pytest.approx(
        ctmc_response_time(arrival_rate, list(rates), list(capacities)), rel=1e-7
    )
    bounds = jffc_bounds(arrival_rate, rates, capacities)
    assert bounds.lower <= exact * (1 + 1e-9) and exact <= bounds.upper * (1 + 1e-9)


def test_the_lower_bound_is_strict_in_the_paper_remark() -> None:
    """App. A.3's point: departures leave holes on the fast chain while the slow one is
    busy, so 'jobs always sit on the fastest chains' (the lower bound) is not exact."""
    exact = exact_two_chains(1.5, (2.0, 0.5), (2, 2))
    bounds = jffc_bounds(1.5, (2.0, 0.5), (2, 2))
    assert bounds.lower < exact - 1e-3 < exact + 1e-3 < bounds.upper


@settings(max_examples=50, deadline=None)
@given(rate=st.floats(0.01, 10.0), servers=st.integers(1, 400), load=st.floats(0.01, 0.99))
def test_one_chain_bounds_are_erlang_c(rate: float, servers: int, load: float) -> None:
    arrival_rate = load * rate * servers
    bounds = jffc_bounds(arrival_rate, [rate], [servers])
    expected = mmc_response_time(arrival_rate, rate, servers)
    assert bounds.lower == pytest.approx(expected, rel=1e-9)
    assert bounds.upper == pytest.approx(expected, rel=1e-9)


def test_erlang_c_closed_forms() -> None:
    assert mmc_response_time(1.0, 2.0, 1) == pytest.approx(1 / (2.0 - 1.0))  # M/M/1
    rho = 3.0 / (2 * 2.0)  # M/M/2: T = 1/(μ(1 − ρ²))
    assert mmc_response_time(3.0, 2.0, 2) == pytest.approx(1 / (2.0 * (1 - rho**2)))
    # One chain of two equal-rate chains' worth is M/M/(c1 + c2).
    assert exact_two_chains(3.0, (1.0, 1.0), (2, 3)) == pytest.approx(
        mmc_response_time(3.0, 1.0, 5)
    )


def test_large_capacities_stay_finite_and_ordered() -> None:
    """C in the thousands: products of λ/ν_i underflow in plain floats; logs do not."""
    rates = [1 / 11.83, 1 / 24.6, 1 / 50.7]
    capacities = [900, 700, 500]
    nu = sum(r * c for r, c in zip(rates, capacities, strict=True))
    for load in (0.1, 0.5, 0.9, 0.999):
        bounds = jffc_bounds(load * nu, rates, capacities)
        assert math.isfinite(bounds.lower) and math.isfinite(bounds.upper)
        assert 11.83 * (1 - 1e-9) <= bounds.lower <= bounds.upper
    assert jffc_bounds(0.5 * 900 / 11.83, [1 / 11.83], [900]).lower == pytest.approx(
        mmc_response_time(0.5 * 900 / 11.83, 1 / 11.83, 900)
    )


def test_chain_bounds_take_planned_chains() -> None:
    chains = [Chain((0, 1), (40, 40), 24, 11.83), Chain((2,), (80,), 5, 30.0)]
    assert chain_bounds(1.0, chains) == jffc_bounds(1.0, [1 / 11.83, 1 / 30.0], [24, 5])


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: jffc_bounds(3.0, [1.0], [3]), "arrivalRate"),  # λ = ν
        (lambda: jffc_bounds(4.0, [1.0, 0.5], [2, 2]), "arrivalRate"),  # λ > ν
        (lambda: jffc_bounds(1.0, [1.0], [0]), "capacities"),
        (lambda: jffc_bounds(1.0, [0.0], [2]), "rates"),
        (lambda: jffc_bounds(1.0, [1.0, 2.0], [2]), "capacities"),
        (lambda: jffc_bounds(1.0, [], []), "chains"),
        (lambda: jffc_bounds(0.0, [1.0], [2]), "arrivalRate"),
        (lambda: mmc_response_time(2.0, 1.0, 2), "arrivalRate"),
        (lambda: mmc_response_time(1.0, 1.0, 0), "servers"),
        (lambda: exact_two_chains(5.0, (1.0, 1.0), (2, 3)), "arrivalRate"),
    ],
)
def test_bad_input_names_the_field(call: object, field: str) -> None:
    assert callable(call)
    with pytest.raises(ConfigError) as error:
        call()
    assert error.value.parameter == field
