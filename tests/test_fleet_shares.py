"""The fleet-wide shares each gateway replica reports (`fairpool_gateway.fleet_shares`),
on random service records: shares of the tenants served add up to one per pool, their
errors against the weighted shares add up to zero, and service in proportion to the
weights has no error."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairpool_gateway.fleet_shares import shares
from fairpool_gateway.shared_limits import FleetService

pytestmark = pytest.mark.unit

POOLS = ["chat", "batch"]
TENANTS = ["a", "b", "c", "d"]
amounts = st.one_of(st.just(0.0), st.floats(1.0, 1e9))
records = st.dictionaries(
    st.tuples(st.sampled_from(POOLS), st.sampled_from(TENANTS)),
    st.builds(FleetService, total=st.floats(0.0, 1e12), recent=amounts),
)
weights = st.dictionaries(st.sampled_from(TENANTS), st.sampled_from([0.5, 1.0, 2.0, 4.0]))


@given(records, weights)
def test_shares_add_up_and_errors_balance(service, table):
    found = shares(service, table)
    assert {(s.pool, s.tenant) for s in found} == set(service)
    for pool in POOLS:
        mine = [s for s in found if s.pool == pool]
        served = [s for s in mine if s.recent > 0]
        assert all(s.error is None and s.share == 0 for s in mine if s.recent == 0)
        if served:
            assert math.isclose(sum(s.share for s in served), 1.0, rel_tol=1e-9)
            assert math.isclose(sum(s.error for s in served), 0.0, abs_tol=1e-9)  # type: ignore[misc]


@given(st.lists(st.sampled_from(TENANTS), min_size=1, unique=True), weights, st.floats(1.0, 1e6))
def test_service_in_proportion_to_the_weights_has_no_error(tenants, table, scale):
    service = {
        ("chat", tenant): FleetService(0.0, scale * table.get(tenant, 1.0)) for tenant in tenants
    }
    for share in shares(service, table):
        assert share.error == pytest.approx(0.0, abs=1e-9)
