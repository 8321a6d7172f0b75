"""A pool's `engine.template` merged under the operator's pod template
(`fairpool_operator.pod_template`): the template adds, the operator's fields win."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_operator_render import CONFIG, container, k8s_validate, pool

from fairpool_operator.pod_template import KEYED_LISTS, MERGED_BY_NAME, WHOLE, merged
from fairpool_operator.render import engine_deployment

pytestmark = pytest.mark.unit

TEMPLATE: dict[str, Any] = {
    "metadata": {
        "labels": {"team": "search", "app.kubernetes.io/instance": "not-the-pool"},
        "annotations": {"prometheus.io/scrape": "true"},
    },
    "spec": {
        "priorityClassName": "inference",
        "runtimeClassName": "nvidia",
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
             "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": {"team": "search"}}}
        ],
        "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
        "volumes": [{"name": "certs", "secret": {"secretName": "ca"}},
                    {"name": "tmp", "hostPath": {"path": "/var/tmp"}}],
        "containers": [
            {
                "name": "engine",
                "image": "someone/else:latest",
                "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
                        {"name": "HOME", "value": "/root"}],
                "envFrom": [{"secretRef": {"name": "hf-token"}}],
                "volumeMounts": [{"name": "certs", "mountPath": "/etc/ssl/private"}],
                "securityContext": {"privileged": True},
            },
            {"name": "log-shipper", "image": "fluent/fluent-bit:3.0"},
        ],
    },
}  # fmt: skip


def test_a_template_adds_to_the_engine_pods_and_takes_nothing_away():
    plain = engine_deployment(pool(), CONFIG)["spec"]["template"]
    templated = pool(engine={"kind": "vllm", "template": TEMPLATE})
    deployment = engine_deployment(templated, CONFIG)
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    # added
    assert pod["metadata"]["labels"]["team"] == "search"
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    assert spec["priorityClassName"] == "inference" and spec["runtimeClassName"] == "nvidia"
    assert spec["topologySpreadConstraints"] == TEMPLATE["spec"]["topologySpreadConstraints"]
    assert [c["name"] for c in spec["containers"]] == ["engine", "log-shipper"]
    engine = container(deployment)
    env = {var["name"]: var["value"] for var in engine["env"]}
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert engine["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert {"name": "certs", "mountPath": "/etc/ssl/private"} in engine["volumeMounts"]
    assert {"name": "certs", "secret": {"secretName": "ca"}} in spec["volumes"]
    # kept: the operator's fields win
    assert (
        pod["metadata"]["labels"]["app.kubernetes.io/instance"]
        == (plain["metadata"]["labels"]["app.kubernetes.io/instance"])
    )
    assert engine["image"] == container(engine_deployment(pool(), CONFIG))["image"]
    assert env["HOME"] == "/tmp"
    assert engine["securityContext"] == plain["spec"]["containers"][0]["securityContext"]
    assert spec["securityContext"] == plain["spec"]["securityContext"]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert volumes["tmp"] == {v["name"]: v for v in plain["spec"]["volumes"]}["tmp"]
    assert (
        deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    )
    k8s_validate(deployment)


def test_a_template_is_a_pod_template():
    for bad in ({"containers": []}, {"spec": []}, {"metadata": "x"}):
        with pytest.raises(ValueError, match="template"):
            pool(engine={"kind": "vllm", "template": bad})


names = st.sampled_from(["a", "b", "c", "env", "volumes", "securityContext", "labels"])
leaves = st.one_of(st.integers(0, 3), st.sampled_from(["x", "y"]), st.booleans())
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.dictionaries(names, children, max_size=4),
        st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["n1", "n2", "n3"])}, optional={"v": children}
            ),
            max_size=3,
            unique_by=lambda item: item["name"],  # names are keys: Kubernetes refuses twins
        ),
    ),
    max_leaves=12,
)


def covers(result: Any, owned: Any, key: str | None = None) -> None:
    """Everything `owned` says is in `result`, as `merged` promises."""
    if isinstance(owned, dict) and isinstance(result, dict) and key not in WHOLE:
        for name, value in owned.items():
            assert name in result
            covers(result[name], value, name)
    elif isinstance(owned, list) and isinstance(result, list) and key in KEYED_LISTS:
        by_name = {item.get("name"): item for item in result if isinstance(item, dict)}
        for item in owned:
            if key in MERGED_BY_NAME:
                covers(by_name[item["name"]], item)
            else:  # the operator's entry, whole
                assert by_name[item["name"]] == item
    elif isinstance(owned, list) and isinstance(result, list):
        assert result[: len(owned)] == owned
    else:
        assert result == owned


@given(
    owned=st.dictionaries(names, trees, max_size=4),
    template=st.dictionaries(names, trees, max_size=4),
)
def test_whatever_the_template_the_operators_fields_stand(owned, template):
    result = merged(owned, template)
    covers(result, owned)
    for name, value in template.items():
        if name not in owned:
            assert result[name] == value  # what the operator leaves unset comes from the template
    assert merged(owned, {}) == owned
