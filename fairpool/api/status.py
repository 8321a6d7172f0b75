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


class ResponseSeconds(Spec):
    """Bounds on the mean response time the plan predicts (the paper's Theorem 3.7)."""

    lower: float = Field(ge=0, description="Lower bound, seconds.")
    upper: float = Field(ge=0, description="Upper bound, seconds.")


class PlannedChainStatus(Spec):
    """One chain of a placement pool: one pipeline-parallel engine."""

    name: str = Field(description="Chain name, e.g. chain-0.")
    nodes: list[str] = Field(
        default_factory=list,
        description="Node slots of the stages in stage order, <group>-<index>.",
    )
    groups: list[str] = Field(default_factory=list, description="Node group of each stage.")
    layer_partition: str = Field(
        alias="layerPartition", description="Layers per stage (VLLM_PP_LAYER_PARTITION)."
    )
    capacity: int = Field(ge=0, description="Requests the chain runs at once (c_k).")
    service_seconds: float = Field(
        ge=0, alias="serviceSeconds", description="Predicted mean service time T_k, seconds."
    )


class PlacementStatus(Spec):
    """The plan the operator rendered for `spec.placement` (docs/placement.md)."""

    capacity_param: int = Field(
        ge=0, alias="capacityParam", description="Concurrent requests each stage reserves KV for."
    )
    predicted_response_seconds: ResponseSeconds | None = Field(
        default=None,
        alias="predictedResponseSeconds",
        description="Predicted mean response time at the spec's arrival rate.",
    )
    chains: list[PlannedChainStatus] = Field(default_factory=list, description="The chains.")
    idle_nodes: list[str] = Field(
        default_factory=list, alias="idleNodes", description="Node slots left out of every chain."
    )
    explanation: list[str] = Field(
        default_factory=list, description="Why the planner chose this, line by line."
    )


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
    placement: PlacementStatus | None = Field(
        default=None, description="For placement pools: the chains planned and rendered."
    )
    selector: str | None = Field(
        default=None,
        description="The engine pods' label selector (for the scale subresource: "
        "HorizontalPodAutoscalers read pod metrics by it).",
    )
    engine_image: str | None = Field(
        default=None,
        alias="engineImage",
        description="The engine image the pods run (unless engine.image is set): kept until "
        "the pool's model, engine or placement next changes, so that upgrading the operator "
        "restarts no engine.",
    )
    engine_image_spec: str | None = Field(
        default=None,
        alias="engineImageSpec",
        description="Digest of the model, engine and placement engineImage was chosen for.",
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


class GroupMembers(Spec):
    """By name, sorted."""

    groups: list[str] = Field(
        default_factory=list, description="TenantGroups whose spec.parent names this group."
    )
    tenants: list[str] = Field(
        default_factory=list,
        description="Tenant ids of the TenantQuotas whose spec.group names this group.",
    )


class GroupPoolShare(Spec):
    """What the gateway last reported of one pool's service to a group's tenants."""

    pool: str = Field(description="The InferencePool.")
    served_tokens: int = Field(
        ge=0,
        alias="servedTokens",
        description="Prompt plus completion tokens served in the pool to the tenants under "
        "the group (at any depth).",
    )
    served_service: float = Field(
        ge=0,
        alias="servedService",
        description="Service (cost units) charged in the pool to the tenants under the group.",
    )
    share: float = Field(
        ge=0,
        le=1,
        description="servedService divided by the service charged in the pool to every "
        "tenant: the fraction of the pool's service the group received, counted since the "
        "gateway replica that answered started.",
    )


class TenantGroupStatus(Spec):
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready: the group is in the fair order's tree as its spec says (False: "
        "its parent is missing or the groups form a cycle, and the message names them).",
    )
    members: GroupMembers = Field(
        default_factory=GroupMembers, description="The groups and tenants directly under it."
    )
    pools: list[GroupPoolShare] = Field(
        default_factory=list,
        description="Per pool, the service the gateway last reported for the group's tenants.",
    )
    last_reported: str | None = Field(
        default=None, alias="lastReported", description="When the gateway's numbers were read."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, alias="observedGeneration", description="Spec generation reconciled."
    )
