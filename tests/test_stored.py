"""What the API server stores of a fairpool resource (`fairpool.api.stored`): pruning and
defaulting by the CRD's structural schema, and the models reading the stored object as
they read the file — the gap through which a CRD default once looked explicitly set and
refused every placement pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from test_crds import CASES, MODELS, model_errors, resource

from fairpool.api.manifests import load_manifests
from fairpool.api.stored import pruned_fields, schema_of, stored
from fairpool.sched.errors import ConfigError
from fairpool_operator.config import OperatorConfig
from fairpool_operator.dry_run import render_files
from fairpool_operator.plan import plan_namespace

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_are_filled_parents_first_and_unknown_fields_pruned():
    document = resource(
        "InferencePool",
        {"model": {"name": "m", "source": "hf://org/m"}, "scheduler": None, "extra": 1},
        metadata={"name": "x", "labels": {"team": "a"}, "anything": "kept"},
    )
    kept = stored(document)
    assert "extra" not in kept["spec"] and kept["metadata"] == document["metadata"]
    # a null where the schema allows none is pruned as absent: `scheduler: {}`, then its fields
    assert kept["spec"]["scheduler"]["policy"] == "dlpm"
    assert kept["spec"]["routing"]["saturation"]["maxOutstanding"] == 64
    assert pruned_fields(document) == ["spec.extra"]
    secret = {"kind": "Secret", "data": {"k": "dg=="}}
    assert stored(secret) == secret  # not ours: as it is


def test_free_form_fields_and_maps_keep_what_they_hold():
    tolerations = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "future": 1}]
    document = resource(
        "InferencePool",
        {
            "model": {"name": "m", "source": "hf://org/m"},
            "engine": {"tolerations": tolerations, "nodeSelector": {"gpu": "h100"}},
        },
    )
    kept = stored(document)["spec"]["engine"]
    assert kept["tolerations"] == tolerations and kept["nodeSelector"] == {"gpu": "h100"}
    assert pruned_fields(document) == []


@given(CASES)
def test_storing_twice_stores_the_same(case):
    kind, spec = case
    once = stored(resource(kind, spec))
    assert stored(once) == once


@given(CASES)
def test_the_servers_defaults_never_change_what_a_file_means(case):
    """What `kubectl apply` sends and what the operator reads are the same resource: a
    file the models accept reads the same once stored (no default of the schema differs
    from the models', none looks explicitly set). The stored form may accept more: a null
    is pruned and defaulted."""
    kind, spec = case
    document = resource(kind, spec)
    if pruned_fields(document) or model_errors(kind, document):
        return
    kept = stored(document)
    assert model_errors(kind, kept) == []
    assert MODELS[kind].model_validate(kept) == MODELS[kind].model_validate(document)


def example_documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for number, document in enumerate(yaml.safe_load_all(path.read_text()), start=1):
            if isinstance(document, dict) and schema_of(str(document.get("kind"))) is not None:
                found.append((f"{path.name}#{number}", document))
    return found


@pytest.mark.parametrize(("where", "document"), example_documents())
def test_every_example_reads_the_same_stored(where, document):
    assert pruned_fields(document) == [], where
    model = MODELS[document["kind"]]
    assert model.model_validate(stored(document)) == model.model_validate(document), where


def test_the_pipeline_example_passes_after_the_servers_defaults():
    """The placement pool once failed here: the CRD's `routing.policy: d2lpm` default made
    the model believe d2lpm was asked for, and refuse it beside placement."""
    (pool,) = load_manifests(ROOT / "examples" / "pipeline.yaml").pools
    assert pool.spec.routing.policy == "jffc"
    assert (
        "default"
        not in schema_of("InferencePool")["properties"]["spec"]["properties"]["routing"][
            "properties"
        ]["policy"]
    )


def test_a_file_with_a_field_the_crd_does_not_know_is_refused_by_name(tmp_path):
    """As `kubectl apply` refuses it (strict field validation), before anything runs."""
    document = resource("InferencePool", {"model": {"name": "m"}, "engine": {"kind": "sim"}})
    document["spec"]["engine"]["gpuz"] = 1
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError, match=r"spec\.engine\.gpuz: unknown field"):
        load_manifests(path)
    rendering = render_files([path], "serving", {})
    assert rendering.problems == [
        "InferencePool x: spec.engine.gpuz: unknown field (kubectl apply refuses it)"
    ]


def test_a_null_the_server_would_default_is_read_as_the_default(tmp_path):
    document = resource("TenantQuota", {"weight": None})
    path = tmp_path / "tenant.yaml"
    path.write_text(yaml.safe_dump(document))
    (quota,) = load_manifests(path).quotas
    assert quota.spec.weight == 1.0


@pytest.mark.parametrize(
    "path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda path: path.name
)
def test_every_example_pool_passes_the_operator_as_the_api_server_stores_it(path):
    pools = [
        stored(document)
        for document in yaml.safe_load_all(path.read_text())
        if isinstance(document, dict) and document.get("kind") == "InferencePool"
    ]
    config = OperatorConfig(namespace="fairpool", engine_sim_image="sim:1", engine_image="e:1")
    for planned in plan_namespace(pools, [], {}, config).pools:
        assert planned.problem is None, f"{path.name}: {planned.problem}"
        assert planned.objects, path.name
