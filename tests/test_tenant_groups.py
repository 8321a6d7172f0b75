"""The fair order's tree in configuration: TenantGroups and TenantQuotas' groups and bands,
turned into the tree the schedulers run (`fairpool.api.tenant_group.fair_order`) the same
way by the engines' scheduler configuration, the gateway's configuration (`GatewayConfig.
shares`), `fairpool up` and `fairpool sim`; and every tree that is not one refused naming
the field."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import tenant_group as group_doc
from hypothesis import given
from hypothesis import strategies as st

from fairpool.api.gateway_config import GatewayConfig, gateway_config_from_manifests
from fairpool.api.manifests import load_manifests
from fairpool.api.rendering import scheduler_config
from fairpool.api.scheduler_config import parse_scheduler_config
from fairpool.api.shares import GroupShare
from fairpool.api.stored import stored
from fairpool.api.tenant_group import (
    TenantPlace,
    fair_order,
    group_problems,
    group_shares,
    without_broken_parents,
)
from fairpool.api.tenant_quota import tenant_shares
from fairpool.api.validation import validate
from fairpool.sched.errors import ConfigError
from fairpool.sched.tree import Shares
from fairpool.sim.run import SimulationOptions, fleet_config
from fairpool_operator.config import OperatorConfig
from fairpool_operator.plan import plan_namespace

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tenants-slo.yaml"
BANDS = ("interactive", "standard", "batch")
OPERATOR = OperatorConfig(namespace="serving", engine_sim_image="sim:1", engine_image="e:1")


# --- documents ---------------------------------------------------------------------------------


def pool_doc(name: str, **scheduler: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": f"{name}-model"},
            "engine": {"kind": "sim"},
            "scheduler": scheduler,
        },
    }


def tenant_doc(
    name: str,
    weight: float = 1.0,
    group: str | None = None,
    band: str = "standard",
    pools: list[str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": weight, "slo": {"class": band}, "pools": pools or []}
    if group is not None:
        spec["group"] = group
    return {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "TenantQuota",
        "metadata": {"name": name},
        "spec": spec,
    }


def write(path: Path, documents: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(documents))
    return path


# --- trees the API accepts -----------------------------------------------------------------------

NAMES = [f"g{index}" for index in range(8)]


@st.composite
def forests(draw: st.DrawFn) -> dict[str, tuple[float, str | None]]:
    """Groups whose parents come before them: always a tree (a forest of them)."""
    count = draw(st.integers(0, len(NAMES)))
    groups: dict[str, tuple[float, str | None]] = {}
    for index in range(count):
        weight = draw(st.sampled_from([0.5, 1.0, 2.0, 7.0]))
        parent = draw(st.none() | st.sampled_from(NAMES[:index])) if index else None
        groups[NAMES[index]] = (weight, parent)
    return groups


@st.composite
def namespaces(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Pools, a forest of groups and tenants in them (or in none), in any band and pool."""
    groups = draw(forests())
    pools = [pool_doc("alpha"), pool_doc("beta", bands={"batch": {"minShare": 0.3}})]
    tenants = []
    for index in range(draw(st.integers(0, 6))):
        tenants.append(
            tenant_doc(
                f"t{index}",
                weight=draw(st.sampled_from([1.0, 2.0, 3.5])),
                group=draw(st.none() | st.sampled_from(sorted(groups))) if groups else None,
                band=draw(st.sampled_from(BANDS)),
                pools=draw(st.sampled_from([[], ["alpha"], ["beta"], ["alpha", "beta"]])),
            )
        )
    return [
        *pools,
        *(group_doc(name, weight, parent) for name, (weight, parent) in groups.items()),
        *tenants,
    ]


@given(namespaces())
def test_every_tree_the_api_accepts_is_the_same_tree_for_engines_gateway_and_simulator(
    documents: list[dict[str, Any]],
) -> None:
    """The manifests load; each pool's tree, as the engines read it from their scheduler
    configuration, as the gateway builds it from its configuration and as `fairpool sim`
    builds it from the same files, is one tree, and holds what the manifests say."""
    with tempfile.TemporaryDirectory() as directory:
        path = write(Path(directory) / "manifests.yaml", documents)
        manifests = load_manifests(path)
        gateway = gateway_config_from_manifests(manifests, {})
        groups = group_shares(manifests.groups)
        for pool in manifests.pools:
            engines = parse_scheduler_config(
                scheduler_config(pool, manifests.quotas, groups).model_dump(by_alias=True)
            ).weights()
            ours = gateway.shares(pool.name)
            allowed = [quota for quota in manifests.quotas if quota.spec.may_use(pool.name)]
            simulated = tenant_shares(
                allowed, manifests.groups, pool.spec.scheduler.bands.by_band()
            )
            for tree in (ours, simulated):
                assert dict(tree) == dict(engines)
                assert tree.groups == engines.groups
                assert tree.tenant_groups == engines.tenant_groups
                assert tree.tenant_bands == engines.tenant_bands
                assert tree.min_shares == engines.min_shares
            for quota in allowed:
                path_of = engines.path(quota.tenant)
                assert (path_of[-1] if path_of else None) == quota.spec.group
                assert engines.tenant_band(quota.tenant) == quota.spec.slo.slo_class
                assert engines[quota.tenant] == quota.spec.weight
            # only the groups on the pool's tenants' paths
            on_paths = {group for quota in allowed for group in engines.path(quota.tenant)}
            assert set(engines.groups) == on_paths
            assert engines.min_shares["batch"] == pool.spec.scheduler.bands.batch.min_share


# --- trees that are not one --------------------------------------------------------------------


@st.composite
def cyclic(draw: st.DrawFn) -> tuple[dict[str, tuple[float, str | None]], list[str]]:
    """A forest with a cycle added: the groups of the cycle, in order."""
    groups = draw(forests().filter(lambda found: len(found) >= 1))
    names = sorted(groups)
    cycle = draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True))
    for here, there in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
        groups[here] = (groups[here][0], there)
    return groups, cycle


@given(cyclic())
def test_any_cycle_is_refused_naming_the_field(case: Any) -> None:
    groups, cycle = case
    shares = {
        name: GroupShare(weight=weight, parent=parent) for name, (weight, parent) in groups.items()
    }
    problems = group_problems(shares)
    assert set(cycle) <= set(problems)
    assert all(problems[name][0] == "ParentCycle" for name in cycle)
    assert all(problems[name][0] == "ParentCycle" for name in problems)
    # the core refuses it, naming a group's parent ...
    with pytest.raises(ConfigError) as error:
        fair_order([], shares)
    assert error.value.parameter.startswith("groups[") and error.value.parameter.endswith(".parent")
    # ... the gateway's configuration, at load ...
    with pytest.raises(ConfigError) as error:
        validate(
            GatewayConfig,
            {"groups": {n: s.model_dump() for n, s in shares.items()}},
            "gateway.yaml",
        )
    first = min(problems)
    assert error.value.parameter == f"gateway.yaml: groups.{first}.parent"
    assert "form a cycle" in error.value.problem
    # ... and so do the manifests; the operator places each at the top and builds a tree
    with tempfile.TemporaryDirectory() as directory:
        documents = [group_doc(name, weight, parent) for name, (weight, parent) in groups.items()]
        path = write(Path(directory) / "groups.yaml", documents)
        with pytest.raises(ConfigError) as error:
            load_manifests(path)
        number = list(groups).index(first) + 1
        assert error.value.parameter == f"groups.yaml, document {number}: spec.parent"
    mended = without_broken_parents(shares)
    assert group_problems(mended) == {}
    assert all(mended[name].parent is None for name in cycle)
    fair_order([], mended)


@given(
    st.dictionaries(
        st.sampled_from(NAMES[:5]), st.none() | st.sampled_from([*NAMES[:5], "missing"])
    ),
    st.lists(st.none() | st.sampled_from([*NAMES[:5], "missing"]), max_size=5),
)
def test_the_operator_writes_a_tree_whatever_the_groups_say(
    parents: dict[str, str | None], groups_of_tenants: list[str | None]
) -> None:
    """Any TenantGroups the API server stores (parents missing, cycles) and tenants naming
    any group: the plan never raises, the engines' file holds one tree, a group is Ready
    exactly when its parent exists and leads to no cycle, and a tenant is in its group
    exactly when the group exists."""
    parents = {name: parent for name, parent in parents.items() if parent != name}  # CEL
    groups = [stored(group_doc(name, parent=parent)) for name, parent in parents.items()]
    quotas = [stored(tenant_doc(f"t{i}", group=g)) for i, g in enumerate(groups_of_tenants)]
    plan = plan_namespace([stored(pool_doc("alpha"))], quotas, {}, OPERATOR, groups=groups)
    (configmap,) = [obj for obj in plan.objects if obj["kind"] == "ConfigMap"]
    document = yaml.safe_load(configmap["data"]["scheduler.yaml"])
    tree = parse_scheduler_config(document).weights()
    problems = group_problems({name: GroupShare(parent=parent) for name, parent in parents.items()})
    assert {group.name for group in plan.groups if group.problem} == set(problems)
    for index, group in enumerate(groups_of_tenants):
        expected = group if group in parents else None
        assert document.get("tenantGroups", {}).get(f"t{index}") == expected
        assert (tree.path(f"t{index}")[-1:] or (None,))[0] == expected


def test_a_tenant_in_an_unknown_group_is_refused_at_load_naming_the_field(tmp_path: Path) -> None:
    document = {
        "pools": [{"name": "chat", "model": "m", "workers": {"urls": ["http://10.0.0.5:8000"]}}],
        "groups": {"acme": {"weight": 2}},
        "tenants": [
            {"tenant": "a", "group": "acme"},
            {"tenant": "b"},
            {"tenant": "c", "slo": {"class": "batch"}},
            {"tenant": "d", "group": "x"},
        ],
    }
    with pytest.raises(ConfigError, match=r"^gateway\.yaml: tenants\.3\.group: no group 'x'$"):
        validate(GatewayConfig, document, "gateway.yaml")
    document["groups"]["acme"]["parent"] = "initech"
    document["tenants"].pop()
    with pytest.raises(ConfigError, match=r"^gateway\.yaml: groups\.acme\.parent: no group"):
        validate(GatewayConfig, document, "gateway.yaml")
    del document["groups"]["acme"]["parent"]
    config = validate(GatewayConfig, document, "gateway.yaml")
    shares = config.shares("chat")
    assert isinstance(shares, Shares)
    assert (shares.path("a"), shares.path("b"), shares.tenant_band("c")) == (("acme",), (), "batch")
    with pytest.raises(ConfigError, match="no pool named 'code'"):
        config.shares("code")

    path = write(
        tmp_path / "tenants.yaml",
        [group_doc("acme"), tenant_doc("a", group="acme"), tenant_doc("b", group="acne")],
    )
    with pytest.raises(ConfigError) as error:
        load_manifests(path)
    assert str(error.value) == "tenants.yaml, document 3: spec.group: no TenantGroup named 'acne'"


def test_a_pool_keeps_only_the_tenants_allowed_in_it() -> None:
    config = GatewayConfig.model_validate(
        {
            "pools": [
                {"name": "chat", "model": "m1", "workers": {"urls": ["http://a:1"]}},
                {
                    "name": "code",
                    "model": "m2",
                    "workers": {"urls": ["http://b:1"]},
                    "bands": {"standard": {"minShare": 0.2}},
                },
            ],
            "groups": {"org": {"weight": 2}, "team": {"parent": "org"}, "other": {}},
            "tenants": [
                {"tenant": "a", "group": "team", "pools": ["chat"]},
                {"tenant": "b", "pools": ["code"], "slo": {"class": "interactive"}},
            ],
        }
    )
    chat, code = config.shares("chat"), config.shares("code")
    assert dict(chat) == {"a": 1.0} and set(chat.groups) == {"org", "team"}
    assert (
        dict(code) == {"b": 1.0} and code.groups == {} and code.tenant_bands == {"b": "interactive"}
    )
    assert (chat.min_shares["standard"], code.min_shares["standard"]) == (0.1, 0.2)


def test_first_token_targets_reach_the_gateways_queue_and_not_the_engines() -> None:
    """`slo.ttftSeconds` orders the interactive band by deadline in the gateway's queue
    (`Shares.ttft`); the engines' scheduler configuration leaves it out."""
    tenants = [
        {"tenant": "chat", "slo": {"class": "interactive", "ttftSeconds": 0.5}},
        {"tenant": "jobs", "slo": {"class": "batch", "ttftSeconds": 30}},
        {"tenant": "plain"},
    ]
    config = GatewayConfig.model_validate(
        {
            "pools": [{"name": "chat", "model": "m", "workers": {"urls": ["http://a:1"]}}],
            "tenants": tenants,
        }
    )
    shares = config.shares("chat")
    assert shares.ttft == {"chat": 0.5, "jobs": 30.0}
    assert shares.due("chat", 10.0) == 10.5
    assert shares.due("jobs", 10.0) == float("inf")  # batch: no deadlines
    assert shares.due("chat@batch", 10.0) == float("inf")  # its batch job neither
    order = fair_order(
        [TenantPlace("chat", band="interactive", ttft=0.5), TenantPlace("plain")], {}
    )
    assert order.ttft == {"chat": 0.5}
    assert order.shares().ttft == {"chat": 0.5}


def test_fair_order_writes_only_what_differs_from_the_defaults() -> None:
    order = fair_order(
        [TenantPlace("a", 2.0), TenantPlace("b", band="batch"), TenantPlace("c", group="x")],
        {"x": GroupShare(weight=3), "unused": GroupShare()},
    )
    assert order.weights == {"a": 2.0, "b": 1.0, "c": 1.0}
    assert order.tenant_bands == {"b": "batch"}
    assert order.tenant_groups == {"c": "x"}
    assert list(order.groups) == ["x"]


# --- fairpool up and fairpool sim read the same files --------------------------------------------


def test_fairpool_up_writes_the_tree_into_the_engines_and_the_gateways_files(
    tmp_path: Path,
) -> None:
    pytest.importorskip("fairpool_engine")
    from fairpool_cli.local.plan import plan_local

    manifests = load_manifests(EXAMPLE, ROOT / "examples" / "tenants-slo-keys.yaml")
    plan = plan_local(manifests, tmp_path, port=0, admin_port=0)
    scheduler = yaml.safe_load(plan.files[tmp_path / "scheduler-assistant.yaml"])
    gateway = GatewayConfig.model_validate(yaml.safe_load(plan.files[tmp_path / "gateway.yaml"]))
    engines = parse_scheduler_config(scheduler).weights()
    assert engines.path("tickets") == ("acme", "acme-support")
    assert engines.path("research") == ("acme", "acme-research")
    assert engines.tenant_band("chat") == "interactive"
    assert engines.tenant_band("batch") == "batch"
    ours = gateway.shares("assistant")
    assert (ours.groups, ours.tenant_groups, ours.tenant_bands) == (
        engines.groups,
        engines.tenant_groups,
        engines.tenant_bands,
    )


def test_fairpool_sim_builds_the_tree_from_tenantquotas_and_tenantgroups(tmp_path: Path) -> None:
    pool = write(tmp_path / "pool.yaml", [pool_doc("chat", bands={"batch": {"minShare": 0.25}})])
    options = SimulationOptions(tenants=str(EXAMPLE), pool=str(pool))
    weights = fleet_config(options).weights
    assert isinstance(weights, Shares)
    assert weights.path("chat") == ("acme", "acme-support")
    assert weights.groups["acme"].weight == 3.0
    assert weights.tenant_band("batch") == "batch"
    assert weights.min_shares["batch"] == 0.25  # the pool's, when one is given
    assert fleet_config(SimulationOptions(tenants=str(EXAMPLE))).weights.min_shares["batch"] == 0.05
    broken = write(tmp_path / "broken.yaml", [tenant_doc("a", group="nobody")])
    with pytest.raises(ConfigError, match=r"broken\.yaml, document 1: spec\.group"):
        fleet_config(SimulationOptions(tenants=str(broken)))
