"""Model sources as URIs (`fairpool.api.model_source`) and the pool fields around them."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fairpool.api.inference_pool import ModelSpec
from fairpool.api.model_source import FETCHED, parse_model_uri

pytestmark = pytest.mark.unit

NAME = st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
BUCKET = st.from_regex(r"[a-z0-9][a-z0-9-]{1,20}[a-z0-9]", fullmatch=True)
SEGMENT = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,15}", fullmatch=True).filter(
    lambda part: part not in (".", "..")
)
PATH = st.lists(SEGMENT, max_size=4).map("/".join)
REVISION = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,30}", fullmatch=True)

SOURCES = st.one_of(
    st.builds(lambda org, name: f"hf://{org}/{name}", NAME, NAME),
    st.builds(lambda org, name, rev: f"hf://{org}/{name}@{rev}", NAME, NAME, REVISION),
    st.builds(lambda claim, path: f"pvc://{claim}/{path}".rstrip("/"), NAME, PATH),
    st.builds(lambda bucket, path: f"s3://{bucket}/{path}".rstrip("/"), BUCKET, PATH),
    st.builds(lambda bucket, path: f"gs://{bucket}/{path}".rstrip("/"), BUCKET, PATH),
    st.builds(lambda path: f"/{path}", PATH),
)


@given(SOURCES)
def test_a_source_reads_back_as_it_was_written(text):
    uri = parse_model_uri(text)
    assert str(uri) == text
    assert parse_model_uri(str(uri)) == uri
    assert uri.fetched == (uri.scheme in FETCHED)


@given(SOURCES, SOURCES)
def test_each_source_has_its_own_cache_directory_a_plain_name(first, second):
    one, other = parse_model_uri(first), parse_model_uri(second)
    for uri in (one, other):
        assert re.fullmatch(r"[A-Za-z0-9_.-]{1,93}", uri.cache_name), uri.cache_name
        assert uri.cache_name not in (".", "..")
    if one != other:
        assert one.cache_name != other.cache_name


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("meta-llama/Llama-3.1-8B", "give a URI"),
        ("ftp://host/model", "unknown scheme 'ftp'"),
        ("hf://", "not a repository id"),
        ("hf://org/model@", "not a branch, tag or commit"),
        ("hf://org/../model", "not a repository id"),
        ("hf://org/model@../main", "not a branch, tag or commit"),
        ("pvc://Models/llama", "not a PersistentVolumeClaim name"),
        ("pvc://models/../etc", "may not contain . or .."),
        ("s3://a/m", "not a bucket name"),
        ("s3://UPPER/m", "not a bucket name"),
        ("gs://bucket/./m", "may not contain . or .."),
        ("file://relative/path", "absolute path"),
        ("hf://org/model name", "not a model source"),
        ("hf://org/" + "m" * 2000, "not a model source"),
    ],
)
def test_a_bad_source_is_refused_saying_why(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_model_uri(text)


@given(st.text(max_size=60))
def test_any_text_is_a_source_or_a_value_error(text):
    try:
        uri = parse_model_uri(text)
    except ValueError as error:
        assert str(error)
    else:
        assert parse_model_uri(str(uri)) == uri


def test_credentials_go_with_fetched_sources_and_a_class_with_a_claim():
    ModelSpec.model_validate({"name": "m", "source": "hf://org/m", "secretRef": {"name": "t"}})
    for source in ("pvc://weights/m", "/models/m", None):
        with pytest.raises(ValidationError, match="secretRef is for"):
            ModelSpec.model_validate({"name": "m", "source": source, "secretRef": {"name": "t"}})
    with pytest.raises(ValidationError, match="storageClassName is for volume pvc"):
        ModelSpec.model_validate({"name": "m", "cache": {"storageClassName": "nfs"}})
    with pytest.raises(ValidationError, match=r"source[\s\S]*unknown scheme"):
        ModelSpec.model_validate({"name": "m", "source": "http://example.com/m"})
