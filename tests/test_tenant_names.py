"""Tenant names written by hand — the gateway's tenant table, a trace, the simulator's and
the load generator's flags — are accepted exactly when a TenantQuota would accept them as its
tenant id: the gateway builds its shared state's Redis keys as `prefix:{tenant}:...`, the
braces a Redis Cluster hash tag, so a `{`, `}` or `:` in a name would change their layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import ValidationError

from fairpool.api.gateway_config import GatewayConfig
from fairpool.api.tenant_quota import TenantQuota
from fairpool.api.validation import validate
from fairpool.sched.errors import ConfigError
from fairpool.sim.fleet import ClosedLoop
from fairpool.sim.trace import TraceError, parse_request
from fairpool_cli.load.tenants import parse_tenant_flag, read_tenants_file

pytestmark = pytest.mark.unit

#: Any text, text made of the characters that matter here, and names that are nearly labels
#: (some too long, some ending in '-'), so that both answers come up often.
NAMES = st.one_of(
    st.text(max_size=70),
    st.text(alphabet="az09-_A{}:. \n", max_size=70),
    st.from_regex(r"[a-z0-9][-a-z0-9]{0,70}", fullmatch=True),
)
HASH_TAGGED = ["acme}:x{", "{acme}", "acme:limits", "a{b", "a}b"]


def accepted(check: object, *arguments: object) -> bool:
    try:
        check(*arguments)  # type: ignore[operator]
    except (ValidationError, ConfigError):
        return False
    return True


def quota(name: str) -> TenantQuota:
    document = {"metadata": {"name": "quota"}, "spec": {"tenant": name}}
    document |= {"apiVersion": "fairpool.io/v1alpha1", "kind": "TenantQuota"}
    return TenantQuota.model_validate(document)


def gateway(name: str) -> GatewayConfig:
    return GatewayConfig.model_validate({"tenants": [{"tenant": name}]})


def trace_line(name: str) -> object:
    record = {"t": 0, "tenant": name, "segments": [[None, 8]], "output_tokens": 1}
    return parse_request(record, "line 1")


@given(NAMES)
def test_the_gateway_accepts_a_tenant_iff_a_tenant_quota_does(name):
    assert accepted(gateway, name) == accepted(quota, name)


@given(NAMES)
def test_a_trace_and_the_simulators_clients_accept_a_tenant_iff_a_tenant_quota_does(name):
    assert accepted(trace_line, name) == accepted(quota, name)
    assert accepted(ClosedLoop, name, 1, 0, 1, 1) == accepted(quota, name)


@given(NAMES)
def test_the_load_generators_tenant_flag_accepts_a_name_iff_a_tenant_quota_does(name):
    assume(":" not in name)  # the flag's separator
    assert accepted(parse_tenant_flag, f"{name}:rate=1") == accepted(quota, name.strip())


@pytest.mark.parametrize("name", HASH_TAGGED)
def test_a_name_with_a_hash_tag_or_a_separator_is_refused_naming_the_field(name):
    with pytest.raises(ConfigError) as refused:
        validate(GatewayConfig, {"tenants": [{"tenant": "ok"}, {"tenant": name}]}, "gateway.yaml")
    assert str(refused.value).startswith("gateway.yaml: tenants.1.tenant: ")
    with pytest.raises(TraceError) as refused_line:
        trace_line(name)
    assert refused_line.value.parameter == "line 1: tenant"
    assert "got " + repr(name) in refused_line.value.problem


def test_the_load_generators_tenants_file_names_the_entry(tmp_path: Path):
    listed = tmp_path / "tenants.yaml"
    listed.write_text(yaml.safe_dump([{"name": "acme", "rate": 1}, {"name": "Acme_Corp"}]))
    with pytest.raises(ConfigError) as refused:
        read_tenants_file(listed)
    assert refused.value.parameter == "tenants.yaml: tenants[1].name"
    assert "'Acme_Corp'" in refused.value.problem
