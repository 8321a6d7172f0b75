"""The status the operator writes on pools and tenants (the CRDs' status subresources)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fairpool.api.common import Spec

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(Spec):
    """A Kubernetes-style condition: the latest observation of one aspect of the object."""

    type: str = Field(min_length=1, description="Ready, Progressing, Degraded, SecretMissing, ...")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable details, naming the field.")
    last_transition_time: str | None = Field(
        default=None, alias="lastTransitionTime", description="RFC 3339 time of the change."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, alias="observedGeneration", description="Spec generation seen."
    )


class Endpoint(Spec):
    pod: str = Field(description="Engine pod name.")
    address: str = Field(description="Base URL of the pod's OpenAI server.")
    ready: bool = Field(description="Whether the pod passes its readiness probe.")


class InferencePoolStatus(Spec):
    replicas: int = Field(default=0, ge=0, description="Engine pods that exist.")
    ready_replicas: int = Field(
        default=0, ge=0, alias="readyReplicas", description="Engine pods ready to serve."
    )
    endpoints: list[Endpoint] = Field(default_factory=list, description="The engine pods.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing, Degraded."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, alias="observedGeneration", description="Spec generation reconciled."
    )


class TenantQuotaStatus(Spec):
    conditions: list[Condition] = Field(default_factory=list, description="Ready, SecretMissing.")
    served_tokens: int = Field(
        default=0,
        ge=0,
        alias="servedTokens",
        description="Tokens served, as the gateway last reported.",
    )
    served_service: float = Field(
        default=0.0, ge=0, alias="servedService", description="Service charged (cost units)."
    )
    last_reported: str | None = Field(
        default=None, alias="lastReported", description="When the gateway's numbers were read."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, alias="observedGeneration", description="Spec generation reconciled."
    )
