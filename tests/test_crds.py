"""The CRDs in crds/: generated from the API models, structural, valid for Kubernetes, and in
agreement with the models on what they accept."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cel_rules import admission_errors
from hypothesis import given
from hypothesis import strategies as st
from openapi_schema_validator import OAS30Validator
from pydantic import BaseModel, ValidationError

from fairpool.api import crds
from fairpool.api.inference_pool import InferencePool
from fairpool.api.shares import default_bands
from fairpool.api.stored import pruned_fields, stored
from fairpool.api.tenant_group import TenantGroup
from fairpool.api.tenant_quota import TenantQuota

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
CRD_DIR = ROOT / "crds"
MODELS: dict[str, type[BaseModel]] = {
    "InferencePool": InferencePool,
    "TenantQuota": TenantQuota,
    "TenantGroup": TenantGroup,
}
PLURALS = {
    "InferencePool": "inferencepools",
    "TenantQuota": "tenantquotas",
    "TenantGroup": "tenantgroups",
}
JUNCTORS = ("oneOf", "anyOf", "allOf", "not")
Schema = dict[str, Any]


def load_crd(kind: str) -> Schema:
    """The checked-in CRD of `kind`."""
    document: Schema = yaml.safe_load((CRD_DIR / f"{PLURALS[kind]}.fairpool.io.yaml").read_text())
    return document


def version_of(crd: Schema) -> Schema:
    (version,) = crd["spec"]["versions"]
    return version  # type: ignore[no-any-return]


@functools.cache
def schema_of(kind: str) -> Schema:
    """The openAPIV3Schema of the checked-in CRD (shared: do not modify)."""
    return version_of(load_crd(kind))["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


@functools.cache
def strict_validator(kind: str) -> OAS30Validator:
    return OAS30Validator(closed(schema_of(kind)))


def closed(schema: Schema) -> Schema:
    """A copy that refuses unknown fields, as `kubectl apply` (strict field validation)
    does where the API server would otherwise prune them."""
    result = copy.deepcopy(schema)
    for node in nodes(result):
        if node.get("type") == "object" and "properties" in node:
            node["additionalProperties"] = False
    return result


def nodes(schema: Schema, path: str = "") -> list[Schema]:
    """Every typed schema node (not the insides of junctors), depth first."""
    found = [schema]
    for name, prop in schema.get("properties", {}).items():
        found += nodes(prop, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += nodes(schema[key], f"{path}[]")
    return found


def labelled(schema: Schema, path: str = "") -> list[tuple[str, Schema]]:
    """Every typed node with its path, for error messages."""
    found = [(path or "<root>", schema)]
    for name, prop in schema.get("properties", {}).items():
        found += labelled(prop, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += labelled(schema[key], f"{path}[]")
    return found


def schema_errors(kind: str, document: Schema) -> list[str]:
    """What the API server (strict field validation) says of `document`, as `path: message`:
    its unknown fields, and what the schema refuses of what it would store."""
    unknown = [f"{path}: unknown field" for path in pruned_fields(document)]
    kept = stored(document)
    errors = [
        f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
        for error in strict_validator(kind).iter_errors(kept)
    ]
    if errors:  # the CEL rules run on objects of the schema's shape only
        return unknown + errors
    return unknown + admission_errors(schema_of(kind), kept)


def model_errors(kind: str, document: Schema) -> list[str]:
    try:
        MODELS[kind].model_validate(document, strict=True)
    except ValidationError as error:
        return [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()]
    return []


def resource(kind: str, spec: Schema | None = None, **top: Any) -> Schema:
    document = {"apiVersion": "fairpool.io/v1alpha1", "kind": kind, "metadata": {"name": "x"}}
    if spec is not None:
        document["spec"] = spec
    return {**document, **top}


def pool(**spec: Any) -> Schema:
    return resource("InferencePool", {"model": {"name": "m"}, "engine": {"kind": "sim"}, **spec})


# --- generated, and up to date ---------------------------------------------------------------


def test_crds_are_up_to_date_with_the_models():
    assert crds.stale_files(CRD_DIR) == [], "crds/ is stale: run `make crds`"
    assert sorted(p.name for p in CRD_DIR.glob("*.yaml")) == sorted(crds.generated())


def test_check_mode_reports_stale_files_and_write_mode_fixes_them(tmp_path):
    lines: list[str] = []
    assert crds.main(["--check", "--dir", str(tmp_path)], out=lines.append) == 1
    assert len(lines) == len(crds.RESOURCES) and all("make crds" in line for line in lines)
    assert crds.main(["--dir", str(tmp_path)], out=lines.append) == 0
    assert crds.main(["--check", "--dir", str(tmp_path)], out=lines.append) == 0
    (tmp_path / "tenantquotas.fairpool.io.yaml").write_text("edited: by hand\n")
    assert crds.main(["--check", "--dir", str(tmp_path)], out=lines.append) == 1


def test_unions_other_than_optional_and_int_or_string_have_no_structural_form():
    with pytest.raises(ValueError, match=re.escape("X | None")):
        crds.structural({"anyOf": [{"type": "string"}, {"type": "boolean"}]}, {}, "spec.x")
    quantity = {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}
    assert crds.structural(quantity, {}, "spec.q") == {
        "x-kubernetes-int-or-string": True,
        "nullable": True,
    }
    with pytest.raises(ValueError, match="cannot convert"):
        crds.structural({"type": "string", "if": {}}, {}, "spec.y")


# --- valid CustomResourceDefinitions ----------------------------------------------------------


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("version", ["1.25.0", kubernetes_validate.latest_version()])
def test_crd_validates_against_the_apiextensions_v1_schema(kind, version):
    kubernetes_validate.validate(load_crd(kind), version, strict=True)


def test_a_broken_crd_is_caught_by_the_apiextensions_schema():
    crd = load_crd("TenantQuota")
    spec = version_of(crd)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["weight"]["exclusiveMinimum"] = 0  # JSON Schema 2020's numeric form
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize(
    ("kind", "plural", "short"),
    [
        ("InferencePool", "inferencepools", "fpool"),
        ("TenantQuota", "tenantquotas", "tq"),
        ("TenantGroup", "tenantgroups", "tg"),
    ],
)
def test_names_scope_version_and_status_subresource(kind, plural, short):
    crd = load_crd(kind)
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{plural}.fairpool.io"
    assert spec["group"] == "fairpool.io" and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == kind and spec["names"]["plural"] == plural
    assert spec["names"]["shortNames"] == [short]
    version = version_of(crd)
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    # pools scale (kubectl scale, autoscalers: tests/test_operator_rollouts.py); tenants not
    scaled = {"status": {}, "scale": version["subresources"].get("scale")}
    assert version["subresources"] == (scaled if kind == "InferencePool" else {"status": {}})


def test_infpool_is_never_a_name_of_ours():
    """infpool belongs to the Gateway API Inference Extension's InferencePool."""
    for kind in MODELS:
        assert "infpool" not in yaml.safe_dump(load_crd(kind)["spec"]["names"])


@pytest.mark.parametrize(
    ("kind", "paths"),
    [
        (
            "InferencePool",
            {
                "Ready": ".status.readyReplicas",
                "Desired": ".spec.replicas",
                "Policy": ".spec.scheduler.policy",
                "Age": ".metadata.creationTimestamp",
            },
        ),
        (
            "TenantQuota",
            {
                "Ready": '.status.conditions[?(@.type=="Ready")].status',
                "Weight": ".spec.weight",
                "Pools": ".spec.pools",
                "Served Tokens": ".status.servedTokens",
                "Age": ".metadata.creationTimestamp",
            },
        ),
        (
            "TenantGroup",
            {
                "Ready": '.status.conditions[?(@.type=="Ready")].status',
                "Weight": ".spec.weight",
                "Parent": ".spec.parent",
                "Tenants": ".status.members.tenants",
                "Age": ".metadata.creationTimestamp",
            },
        ),
    ],
)
def test_printer_columns(kind, paths):
    columns = {c["name"]: c for c in version_of(load_crd(kind))["additionalPrinterColumns"]}
    for name, path in paths.items():
        assert columns[name]["jsonPath"] == path
        assert columns[name].get("priority", 0) == 0, f"{name} is shown without -o wide"
    schema = schema_of(kind)
    for column in columns.values():
        assert column["description"]
        if column["type"] == "date":
            continue
        node = schema
        path = column["jsonPath"]
        if "[?(" in path:  # a condition's field: conditions[?(@.type=="X")].status
            field = path.rsplit(".", 1)[1]
            node = schema["properties"]["status"]["properties"]["conditions"]["items"]
            node = node["properties"][field]
        else:
            for part in path.lstrip(".").split("."):
                node = node["properties"][part]
        expected = {"integer": {"integer"}, "number": {"number"}, "string": {"string", "array"}}
        assert node["type"] in expected[column["type"]], column["name"]


# --- structural schemas -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", MODELS)
def test_schema_is_structural(kind):
    schema = schema_of(kind)
    assert schema["properties"]["metadata"] == {"type": "object"}, "metadata is Kubernetes'"
    for path, node in labelled(schema):
        # a type, or a Kubernetes quantity (integer or string, the one exception allowed)
        assert "type" in node or node.get("x-kubernetes-int-or-string") is True, f"{path}"
        if "type" not in node:
            continue
        assert "$ref" not in node and "title" not in node, path
        assert not {"anyOf", "allOf", "not"} & set(node), f"{path}: a type-level junctor"
        for branch in node.get("oneOf", []):
            assert set(branch) == {"required"}, f"{path}: oneOf may only say what is required"
            assert set(branch["required"]) <= set(node["properties"]), path
        if node["type"] == "object" and path != ".metadata":
            shapes = [k in node for k in ("properties", "additionalProperties")]
            free = node.get("x-kubernetes-preserve-unknown-fields") is True
            assert sum(shapes) + free == 1, f"{path}: properties, a map or free-form"
        if node["type"] == "array":
            assert "items" in node, path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            if bound in node:
                assert node[bound] is True and bound.replace("exclusiveM", "m") in node, path


@pytest.mark.parametrize("kind", MODELS)
def test_every_property_has_a_description(kind):
    schema = schema_of(kind)
    for path, node in labelled(schema):
        if path in (".metadata",) or path.endswith("[]"):
            continue
        assert node.get("description"), f"{kind}{path} has no description (kubectl explain)"


@pytest.mark.parametrize("kind", MODELS)
def test_defaults_validate_and_are_pruned(kind):
    schema = schema_of(kind)
    for path, node in labelled(schema):
        if "default" not in node:
            continue
        assert node["default"] is not None, path
        assert path not in (".apiVersion", ".kind", ".metadata"), path
        errors = list(OAS30Validator(closed(node)).iter_errors(node["default"]))
        assert not errors, f"{path}: {errors[0].message}"


def test_enums_ranges_and_nullables_come_from_the_models():
    spec = schema_of("InferencePool")["properties"]["spec"]["properties"]
    assert spec["engine"]["properties"]["kind"]["enum"] == ["vllm", "sim"]
    assert spec["replicas"] == {
        "description": "Engine replicas.",
        "type": "integer",
        "default": 1,
        "minimum": 0,
        "maximum": 1024,
    }
    assert "dlpm+memsafe" in spec["scheduler"]["properties"]["policy"]["enum"]
    assert spec["engine"]["properties"]["image"]["nullable"] is True
    # a field the CEL rules test with has(): an explicit null is pruned as absent
    assert "nullable" not in spec["model"]["properties"]["maxModelLen"]
    assert spec["engine"]["properties"]["nodeSelector"]["additionalProperties"] == {
        "type": "string"
    }
    weight = schema_of("TenantQuota")["properties"]["spec"]["properties"]["weight"]
    assert (weight["minimum"], weight["exclusiveMinimum"], weight["maximum"]) == (0, True, 1000)
    group_weight = schema_of("TenantGroup")["properties"]["spec"]["properties"]["weight"]
    assert {key: group_weight[key] for key in weight if key != "description"} == {
        key: weight[key] for key in weight if key != "description"
    }, "a group's weight has the bounds and default of a tenant's"
    bands = spec["scheduler"]["properties"]["bands"]
    assert bands["default"] == {}
    assert bands["properties"]["standard"]["default"] == {"minShare": 0.1}
    assert bands["properties"]["batch"]["default"] == {"minShare": 0.05}
    assert "interactive" not in bands["properties"], "the highest band has no minimum"


# --- the models and the schema agree ----------------------------------------------------------


def example_resources() -> list[tuple[str, Schema]]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for number, document in enumerate(yaml.safe_load_all(path.read_text()), start=1):
            if isinstance(document, dict) and document.get("kind") in MODELS:
                found.append((f"{path.name}#{number}", document))
    return found


def test_examples_exist():
    kinds = {document["kind"] for _, document in example_resources()}
    assert kinds == set(MODELS)


@pytest.mark.parametrize(("where", "document"), example_resources())
def test_examples_validate_against_the_schema_and_the_model(where, document):
    assert schema_errors(document["kind"], document) == [], where
    MODELS[document["kind"]].model_validate(document)


@pytest.mark.parametrize(
    ("kind", "document", "field"),
    [
        ("TenantQuota", resource("TenantQuota", {"weight": -1}), "spec.weight"),
        ("TenantQuota", resource("TenantQuota", {"weight": 0}), "spec.weight"),
        ("TenantQuota", resource("TenantQuota", {"tenant": "Acme_Corp"}), "spec.tenant"),
        ("TenantQuota", resource("TenantQuota", {"limits": {"rpm": 5}}), "spec.limits"),
        ("TenantQuota", resource("TenantQuota", {"slo": {"class": "gold"}}), "spec.slo.class"),
        ("TenantQuota", resource("TenantQuota", {"group": "Acme"}), "spec.group"),
        ("TenantGroup", resource("TenantGroup", {"weight": 0}), "spec.weight"),
        ("TenantGroup", resource("TenantGroup", {"parent": "a_b"}), "spec.parent"),
        ("TenantGroup", resource("TenantGroup", {"parent": "x"}), ""),  # its own name
        ("TenantGroup", resource("TenantGroup", {"members": []}), "spec.members"),
        (
            "InferencePool",
            pool(scheduler={"bands": {"batch": {"minShare": 1}}}),
            "spec.scheduler.bands.batch.minShare",
        ),
        (
            "InferencePool",
            pool(scheduler={"bands": {"standard": {"minShare": 0.5}, "batch": {"minShare": 0.5}}}),
            "spec.scheduler.bands",
        ),
        (
            "InferencePool",
            pool(scheduler={"bands": {"interactive": {"minShare": 0.5}}}),
            "spec.scheduler.bands.interactive",
        ),
        ("InferencePool", pool(engine={"kind": "tgi"}), "spec.engine.kind"),
        ("InferencePool", pool(replicas=-1), "spec.replicas"),
        ("InferencePool", pool(scheduler={"policy": "dlpmm"}), "spec.scheduler.policy"),
        ("InferencePool", pool(routing={"policy": "random"}), "spec.routing.policy"),
        ("InferencePool", pool(gpus=1), "spec"),
        ("InferencePool", resource("InferencePool", {}), "spec"),
        ("InferencePool", resource("InferencePool"), ""),
        (
            "InferencePool",
            pool(model={"name": "m", "source": "ftp://host/m"}),
            "spec.model.source",
        ),
        ("InferencePool", pool(model={"name": "m", "source": {}}), "spec.model.source"),
    ],
)
def test_bad_resources_are_refused_by_both(kind, document, field):
    errors = schema_errors(kind, document)
    assert errors, f"the CRD accepts {document}"
    assert any(error.startswith(field) for error in errors), errors
    assert model_errors(kind, document)


def test_an_explicit_null_of_a_nullable_field_passes_both():
    document = pool(model={"name": "m", "source": "hf://org/m", "secretRef": None})
    assert schema_errors("InferencePool", document) == []
    assert model_errors("InferencePool", document) == []


def test_defaults_of_the_schema_are_the_defaults_of_the_models():
    for kind, document, field in [
        ("InferencePool", pool(), "scheduler"),
        ("TenantQuota", resource("TenantQuota"), "weight"),
        ("TenantGroup", resource("TenantGroup"), "weight"),
    ]:
        model = MODELS[kind]
        kept = stored(document)
        assert model.model_validate(kept) == model.model_validate(document)
        assert kept["spec"][field]
    bands = stored(pool())["spec"]["scheduler"]["bands"]
    assert bands == {"standard": {"minShare": 0.1}, "batch": {"minShare": 0.05}}
    assert InferencePool.model_validate(pool()).spec.scheduler.bands.by_band() == {
        band: share for band, share in default_bands().items() if band != "interactive"
    }


def test_a_group_that_is_its_own_parent_is_refused_by_both_naming_the_field():
    document = resource("TenantGroup", {"parent": "x"})
    assert schema_errors("TenantGroup", document) == [
        ": spec.parent: a group cannot be its own parent"
    ]
    assert model_errors("TenantGroup", stored(document)) == [
        "spec.parent: a group cannot be its own parent"
    ]
    assert schema_errors("TenantGroup", resource("TenantGroup", {"parent": "y"})) == []


def operator_only(kind: str, document: Schema) -> bool:
    """Whether `document` breaks a rule that only the operator enforces (see crds.py): a
    placement pool's plan (its groups' speeds and memory, the planner's own checks)."""
    if kind != "InferencePool":
        return False
    return document.get("spec", {}).get("placement") is not None


def model_rule(error: str) -> bool:
    """Whether `error` is the one rule of spec.model only the operator enforces: a
    source's form past its scheme (see crds.py)."""
    return error.startswith("spec.model.source") and "Value error" in error


def some(*values: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(values)


def optional_dict(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Schema]:
    """Mappings with any subset of the fields."""
    return st.fixed_dictionaries({}, optional=fields)


def mutated(spec: Schema, mutations: list[tuple[tuple[str, ...], Any]]) -> Schema:
    """`spec` with a value set at each path (dicts made on the way)."""
    result = copy.deepcopy(spec)
    for path, value in mutations:
        node = result
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = copy.deepcopy(value)
    return result


def with_mutations(
    valid: st.SearchStrategy[Schema], mutations: list[tuple[tuple[str, ...], Any]]
) -> st.SearchStrategy[Schema]:
    """Valid specs, some with up to two fields changed to values on either side of a rule."""
    changes = st.lists(st.sampled_from(mutations), max_size=2)
    return st.builds(mutated, valid, changes)


#: A placement that passes (examples/pipeline.yaml's), beside one that does not.
PLACEMENT = yaml.safe_load((ROOT / "examples" / "pipeline.yaml").read_text())["spec"]["placement"]
POOL_SPECS = with_mutations(
    st.fixed_dictionaries(
        {
            "model": optional_dict(
                source=some("/m", "pvc://w/llama", "hf://org/m@v1", "s3://bucket/m", "gs://b-1/m"),
                cache=optional_dict(volume=some("emptyDir", "pvc"), size=some("40Gi", 10)),
                maxModelLen=some(16, 4096, None),
            ).map(lambda model: {"name": "m", **model}),
            "engine": optional_dict(
                kind=some("vllm", "sim"),
                image=some("img:1", None),
                resources=optional_dict(gpus=some(0, 16), cpu=some("4", None)),
                sim=optional_dict(speedup=some(0.5, 4), memoryTokens=some(1, None)),
                nodeSelector=some({"gpu": "h100"}, {}),
                tolerations=some([{"key": "gpu", "operator": "Exists"}], []),
                extraArgs=some(["--enforce-eager"], []),
            ),
        },
        optional={
            "replicas": some(0, 2, 1024),
            "scheduler": optional_dict(
                policy=some("dlpm", "vtc+memsafe", "sarathi"),
                memorySafe=some(True, False),
                quantum=some(None, 2048, 0.5),
                cost=optional_dict(extendWeight=some(0, 1.5), outputWeight=some(2)),
                bands=optional_dict(
                    standard=optional_dict(minShare=some(0, 0.1, 0.5, 0.95)),
                    batch=optional_dict(minShare=some(0, 0.05, 0.5)),
                ),
            ),
            "routing": optional_dict(
                policy=some("d2lpm", "cache_aware"),
                workerQuantum=some(1, 8192.5),
                minMatchChars=some(0, 64),
                saturation=optional_dict(maxKvUsage=some(0.5, 1), maxWaiting=some(0, 3)),
                queuePolicy=some("vtc", "fcfs"),
                queueTimeoutSeconds=some(30),
            ),
            "placement": some(None, {"chains": [{"gpus": ["a100", "h100"]}]}, PLACEMENT),
        },
    ),
    [
        (("model", "name"), ""),
        (("model", "maxModelLen"), 15),
        (("model", "source"), None),
        (("model", "source"), {}),
        (("model", "source"), "ftp://host/m"),
        (("model", "source"), "hf://"),
        (("model", "source"), "pvc://Claim/m"),
        (("model", "source"), "s3://b/../m"),
        (("model", "secretRef"), {"name": ""}),
        (("model", "secretRef"), {"name": "hf-token"}),
        (("model", "cache", "volume"), "hostPath"),
        (("model", "cache", "storageClassName"), "nfs"),
        (("engine", "kind"), "tgi"),
        (("engine", "kind"), "vllm"),
        (("engine", "resources", "gpus"), -1),
        (("engine", "resources", "gpus"), 17),
        (("engine", "sim", "speedup"), 0),
        (("engine", "sim", "memoryTokens"), 0),
        (("engine", "unknownField"), 1),
        (("replicas",), -1),
        (("replicas",), 1025),
        (("replicas",), None),
        (("scheduler", "policy"), "dlpmm"),
        (("scheduler", "policy"), ""),
        (("scheduler", "quantum"), 0),
        (("scheduler", "cost", "extendWeight"), -1),
        (("scheduler", "bands", "standard", "minShare"), 1),
        (("scheduler", "bands", "batch", "minShare"), -0.1),
        (("scheduler", "bands", "batch", "minShare"), 0.9),
        (("scheduler", "bands", "interactive"), {"minShare": 0.1}),
        (("routing", "policy"), "random"),
        (("routing", "workerQuantum"), 0),
        (("routing", "minMatchChars"), -1),
        (("routing", "saturation", "maxKvUsage"), 0),
        (("routing", "saturation", "maxKvUsage"), 1.01),
        (("routing", "queuePolicy"), "lifo"),
        (("routing", "queueTimeoutSeconds"), 0),
        (("unknownField",), 1),
    ],
)
TENANT_SPECS = with_mutations(
    optional_dict(
        tenant=some(None, "acme", "a-1", "a" * 63),
        weight=some(0.5, 2, 1000),
        pools=some([], ["chat"]),
        group=some(None, "acme", "team-1"),
        apiKeySecretRef=some(None, {"name": "keys"}, {"name": "keys", "key": None}),
        limits=optional_dict(requestsPerMinute=some(1, None), concurrent=some(1), queued=some(0)),
        slo=optional_dict(
            **{"class": some("interactive", "batch")},
            ttftSeconds=some(0.5, None),
            tbtSeconds=some(0.1),
        ),
    ),
    [
        (("tenant",), "Acme"),
        (("tenant",), ""),
        (("tenant",), "a" * 64),
        (("weight",), -1),
        (("weight",), 0),
        (("weight",), 1000.5),
        (("weight",), None),
        (("apiKeySecretRef",), {}),
        (("apiKeySecretRef", "name"), ""),
        (("limits", "requestsPerMinute"), 0),
        (("limits", "queued"), -1),
        (("slo", "class"), "gold"),
        (("slo", "ttftSeconds"), 0),
        (("slo", "unknownField"), 1),
        (("group",), ""),
        (("group",), "Acme"),
        (("unknownField",), 1),
    ],
)
GROUP_SPECS = with_mutations(
    optional_dict(
        weight=some(0.5, 2, 1000),
        parent=some(None, "acme", "a" * 63),
        description=some(None, "Acme's support team", ""),
    ),
    [
        (("weight",), 0),
        (("weight",), 1000.5),
        (("weight",), None),
        (("parent",), "x"),  # the group's own name
        (("parent",), ""),
        (("parent",), "Acme"),
        (("parent",), "a" * 64),
        (("description",), "d" * 1025),
        (("unknownField",), 1),
    ],
)
CASES = st.one_of(
    st.tuples(st.just("InferencePool"), POOL_SPECS),
    st.tuples(st.just("TenantQuota"), TENANT_SPECS),
    st.tuples(st.just("TenantGroup"), GROUP_SPECS),
)


@given(CASES)
def test_the_schema_accepts_what_the_model_accepts_and_refuses_the_rest(case):
    """Both judge what the API server would store (a field it does not know is refused
    before that, by strict field validation); only the rules the operator enforces (a vLLM
    pool without model.source, placement's) may pass the schema and fail the model."""
    kind, spec = case
    document = resource(kind, spec)
    kept = stored(document)
    refused_by_schema = schema_errors(kind, document)
    unknown = [f"{path}: unknown field" for path in pruned_fields(document)]
    refused_by_model = unknown + model_errors(kind, kept)
    if not refused_by_model:
        assert not refused_by_schema, refused_by_schema
        dumped = MODELS[kind].model_validate(kept).model_dump(by_alias=True, mode="json")
        assert schema_errors(kind, dumped) == [], "a full dump (nulls included) validates"
    elif not operator_only(kind, kept) and not all(map(model_rule, refused_by_model)):
        assert refused_by_schema, f"the CRD accepts what the model refuses: {refused_by_model}"


PIPELINE_SPEC = yaml.safe_load((ROOT / "examples" / "pipeline.yaml").read_text())["spec"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"model": {"name": "m"}}, "model.source is required for engine kind vllm"),
        (
            {"model": {"name": "m", "source": "pvc://w"}, "scheduler": {"policy": "rad"}},
            "scheduler.policy rad needs engine kind sim",
        ),
        (
            {"model": {"name": "m", "source": "pvc://w", "secretRef": {"name": "t"}}},
            "secretRef is for hf://, s3:// and gs:// sources",
        ),
        (
            {
                "model": {"name": "m", "cache": {"storageClassName": "nfs"}},
                "engine": {"kind": "sim"},
            },
            "storageClassName is for volume pvc",
        ),
        (
            {**PIPELINE_SPEC, "model": {"name": "m", "source": "pvc://w"}},
            "model.maxModelLen is required with placement",
        ),
        ({**PIPELINE_SPEC, "routing": {"policy": "d2lpm"}}, "routing.policy must be jffc"),
        (
            {**PIPELINE_SPEC, "placement": {**PIPELINE_SPEC["placement"], "nodeGroups": []}},
            "give exactly one of nodeGroups and discovery",
        ),
        (
            {
                **PIPELINE_SPEC,
                "placement": {
                    **PIPELINE_SPEC["placement"],
                    "nodeGroups": [
                        {k: v for k, v in group.items() if k != "layerSeconds"} | {"tflops": 100}
                        for group in PIPELINE_SPEC["placement"]["nodeGroups"]
                    ],
                },
            },
            "give layerSeconds, or both tflops and memoryBandwidthGBps",
        ),
        (
            {
                **PIPELINE_SPEC,
                "placement": {
                    **PIPELINE_SPEC["placement"],
                    "nodeGroups": PIPELINE_SPEC["placement"]["nodeGroups"][:1] * 2,
                },
            },
            "Duplicate value",
        ),
    ],
)
def test_the_api_server_refuses_at_admission_what_the_models_refuse(spec, message):
    document = resource("InferencePool", spec)
    assert any(message in error for error in schema_errors("InferencePool", document))
    refused = " ".join(model_errors("InferencePool", stored(document)))
    assert refused, "the model accepts what the CRD refuses"
    if message != "Duplicate value":
        assert message.split(" (")[0] in refused.replace("spec.model.", "model.")


def test_the_examples_pass_every_admission_rule():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") in MODELS:
                assert schema_errors(document["kind"], document) == [], path.name
