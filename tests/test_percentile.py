"""The one percentile definition (`fairpool.sim.metrics.percentile`): nearest rank."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairpool.sim.metrics import percentile

pytestmark = pytest.mark.unit

samples = st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=200)
fractions = st.floats(min_value=0.0, max_value=1.0)


@given(samples, fractions)
def test_it_is_the_smallest_value_with_at_least_that_fraction_at_or_below_it(values, fraction):
    result = percentile(values, fraction)
    assert result in values
    at_or_below = sum(value <= result for value in values)
    below = sum(value < result for value in values)
    assert at_or_below >= fraction * len(values)
    # Any smaller value of the sample has fewer than that fraction at or below it.
    assert below < fraction * len(values) or result == min(values)


@given(samples, fractions)
def test_it_is_the_value_of_rank_ceil_fraction_n(values, fraction):
    rank = max(math.ceil(fraction * len(values)), 1)
    assert percentile(values, fraction) == sorted(values)[rank - 1]


@given(samples, fractions, fractions)
def test_it_grows_with_the_fraction(values, first, second):
    low, high = sorted((first, second))
    assert percentile(values, low) <= percentile(values, high)


@given(samples, fractions, st.randoms(use_true_random=False))
def test_the_order_of_the_values_does_not_matter(values, fraction, rng):
    shuffled = list(values)
    rng.shuffle(shuffled)
    assert percentile(shuffled, fraction) == percentile(values, fraction)


@given(samples)
def test_zero_is_the_minimum_and_one_the_maximum(values):
    assert (percentile(values, 0.0), percentile(values, 1.0)) == (min(values), max(values))


def test_the_ranks_of_a_hundred_values():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.99) == 99.0  # not the maximum: rank 99 of 100
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.995) == 100.0
    assert percentile([1.0, 2.0], 0.5) == 1.0  # the lower middle value, never between


def test_it_does_not_touch_its_argument():
    values = [3.0, 1.0, 2.0]
    percentile(values, 0.5)
    assert values == [3.0, 1.0, 2.0]


def test_no_values_no_percentile():
    assert percentile([], 0.99) is None


@pytest.mark.parametrize("fraction", [-0.01, 1.01, 99.0])
def test_a_fraction_outside_0_1_is_an_error(fraction):
    with pytest.raises(ValueError, match="fraction"):
        percentile([1.0], fraction)
