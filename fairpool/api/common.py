"""What the resources of API group fairpool.io/v1alpha1 share: metadata and the base model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

API_GROUP = "fairpool.io"
API_VERSION = "fairpool.io/v1alpha1"
#: Kubernetes object names (RFC 1123 labels): what pool, tenant and secret names must be.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: Names of most other objects (Secrets, claims): RFC 1123 subdomains.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class Spec(BaseModel):
    """Base of every spec model: camelCase in YAML, unknown fields refused by name."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Metadata(BaseModel):
    """The part of Kubernetes object metadata fairpool reads; the rest is kept as is."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    namespace: str | None = None
