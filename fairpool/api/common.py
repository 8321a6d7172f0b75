"""What the resources of API group fairpool.io/v1alpha1 share: metadata and the base model."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

API_GROUP = "fairpool.io"
API_VERSION = "fairpool.io/v1alpha1"
#: Kubernetes object names (RFC 1123 labels): what pool, tenant and secret names must be.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: Names of most other objects (Secrets, claims): RFC 1123 subdomains.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


def cel_rules(*rules: tuple[str, str]) -> dict[str, Any]:
    """A model's cross-field rules as the CRD's `x-kubernetes-validations` (CEL, checked by
    the API server at admission), each `(rule, message)`, beside the pydantic validator
    that says the same: `self` is the object, `has()` a field that is set."""
    return {
        "x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in rules]
    }


def field_error(
    model: str, loc: tuple[str | int, ...], value: object, message: str
) -> ValidationError:
    """A validation error of `model` at `loc` (relative to the model being validated), for
    checks that span fields: pydantic puts the model's own place in front, so the error
    names the field itself (`admin.port`, `tenants.1.apiKeySha256`)."""
    error = PydanticCustomError("value_error", "{message}", {"message": message})
    return ValidationError.from_exception_data(
        model, [InitErrorDetails(type=error, loc=loc, input=value)]
    )


class Spec(BaseModel):
    """Base of every spec model: camelCase in YAML, unknown fields refused by name."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Metadata(BaseModel):
    """The part of Kubernetes object metadata fairpool reads; the rest is kept as is."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    namespace: str | None = None
