"""InferencePool: a pool of model servers that tenants share (API group fairpool.io/v1alpha1,
short name `fpool`; not the Gateway API Inference Extension's InferencePool).

```yaml
apiVersion: fairpool.io/v1alpha1
kind: InferencePool
metadata: {name: chat}
spec:
  model: {name: llama-3-8b, source: hf://meta-llama/Llama-3.1-8B-Instruct, maxModelLen: 8192}
  engine: {kind: vllm, resources: {gpus: 1}}     # or kind: sim (fairpool engine-sim)
  replicas: 2
  scheduler:                                      # inside each engine (quantum: auto)
    policy: dlpm
    bands: {standard: {minShare: 0.1}, batch: {minShare: 0.05}}   # the defaults
  routing: {policy: d2lpm}                        # across the replicas, at the gateway
```
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    field_validator,
    model_validator,
)

from fairpool.api.common import DNS_SUBDOMAIN, Metadata, Spec, cel_rules
from fairpool.api.model_source import ModelUri, parse_model_uri
from fairpool.api.placement import PlacementSpec
from fairpool.api.scheduler_config import CostWeights, known_policy
from fairpool.api.shares import Band, BandShare
from fairpool.api.status import InferencePoolStatus
from fairpool.sched.registry import ROUTERS, mixes_phases
from fairpool.sched.tree import DEFAULT_MIN_SHARES

EngineKind = Literal["vllm", "sim"]

#: A Kubernetes resource quantity ("8Gi", "500m", "1e3"): apimachinery's pattern.
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"


#: What a model source starts with (`fairpool.api.model_source` parses the rest).
SOURCE_PATTERN = r"^((hf|pvc|s3|gs|file)://|/)"


class SecretReference(Spec):
    """A Secret in the pool's namespace."""

    name: str = Field(
        min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="The Secret's name."
    )


class ModelCache(Spec):
    """A volume per pod or one claim per pool (docs/kubernetes.md weighs the two)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            ("!has(self.storageClassName) || self.volume == 'pvc'",
             "storageClassName is for volume pvc"),
        )
    )  # fmt: skip

    volume: Literal["emptyDir", "pvc"] = Field(
        default="emptyDir",
        description="emptyDir: each pod downloads into its own bounded volume at every "
        "start; pvc: one PersistentVolumeClaim per pool (<pool>-model-cache) that the "
        "first pod fills and the others, and every restart, reuse.",
    )
    size: str = Field(
        default="100Gi",
        pattern=QUANTITY_PATTERN,
        description="The emptyDir's size limit, or the claim's request: room for the "
        "weights (a pod that writes more is evicted).",
    )
    storage_class_name: str | None = Field(
        default=None,
        min_length=1,
        alias="storageClassName",
        description="The claim's storage class (pvc only; unset: the cluster's default).",
    )
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = Field(
        default="ReadWriteMany",
        alias="accessMode",
        description="The claim's access mode (pvc only): ReadWriteMany lets replicas on "
        "any node share it; ReadWriteOnce keeps them on the node that mounted it first.",
    )

    @model_validator(mode="after")
    def _claim_fields_need_a_claim(self) -> ModelCache:
        if self.volume == "emptyDir" and self.storage_class_name is not None:
            raise ValueError("storageClassName is for volume pvc")
        return self


class ModelSpec(Spec):
    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            ("!has(self.secretRef) || (has(self.source) && "
             "['hf://', 's3://', 'gs://'].exists(scheme, self.source.startsWith(scheme)))",
             "secretRef is for hf://, s3:// and gs:// sources"),
        )
    )  # fmt: skip

    name: str = Field(
        min_length=1, description="Served model name: what clients put in the `model` field."
    )
    source: str | None = Field(
        default=None,
        max_length=1024,
        description="Where the weights are: hf://org/model[@revision], pvc://claim/path, "
        "s3://bucket/prefix, gs://bucket/prefix, or a local path (fairpool up only). Not "
        "needed for engine kind sim.",
        json_schema_extra={"pattern": SOURCE_PATTERN},  # the API server's first check
    )
    secret_ref: SecretReference | None = Field(
        default=None,
        alias="secretRef",
        description="Credentials for the source: a Secret with HF_TOKEN (hf), "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (s3) or service-account.json (gs).",
    )
    cache: ModelCache = Field(
        default_factory=ModelCache, description="Where hf, s3 and gs sources are fetched to."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, alias="maxModelLen", description="Longest prompt plus output."
    )

    @field_validator("source")
    @classmethod
    def _a_model_uri(cls, source: str | None) -> str | None:
        if source is not None:
            parse_model_uri(source)
        return source

    @model_validator(mode="after")
    def _credentials_for_fetched_sources(self) -> ModelSpec:
        uri = self.uri
        if self.secret_ref is not None and (uri is None or not uri.fetched):
            raise ValueError("secretRef is for hf://, s3:// and gs:// sources")
        return self

    @property
    def uri(self) -> ModelUri | None:
        """The parsed source."""
        return parse_model_uri(self.source) if self.source is not None else None


def _quantity(value: int | str) -> str:
    """A Kubernetes quantity, as the API returns it (a string)."""
    text = str(value)
    if not re.match(QUANTITY_PATTERN, text):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 8, 500m, 32Gi)")
    return text


#: A resource quantity: an integer or a string such as "500m" or "32Gi".
Quantity = Annotated[StrictInt | str, AfterValidator(_quantity)]
#: A resource name: `cpu`, `memory`, or an extended resource such as `nvidia.com/gpu`.
RESOURCE_NAME = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
ResourceName = Annotated[str, StringConstraints(pattern=RESOURCE_NAME, max_length=253)]


class Resources(Spec):
    gpus: int | None = Field(
        default=None,
        ge=0,
        le=16,
        description="GPUs per replica, as `gpuResource` limits (unset: 1 for kind vllm, 0 "
        "for sim).",
    )
    gpu_resource: ResourceName = Field(
        default="nvidia.com/gpu",
        alias="gpuResource",
        description="The extended resource one GPU is: nvidia.com/gpu, amd.com/gpu, a MIG "
        "profile such as nvidia.com/mig-3g.40gb, ...",
    )
    cpu: Quantity | None = Field(default=None, description="CPU request and limit, e.g. 8 or 500m.")
    memory: Quantity | None = Field(
        default=None, description="Memory request and limit, e.g. 64Gi."
    )
    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Requests of any resource (over cpu and memory), e.g. {cpu: 4}.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Limits of any resource (over cpu, memory and the GPUs), e.g. "
        "{memory: 96Gi, rdma/ib: 1}.",
    )

    @field_validator("requests", "limits")
    @classmethod
    def _resource_names(cls, quantities: dict[str, str]) -> dict[str, str]:
        for name in quantities:
            if len(name) > 253 or not re.match(RESOURCE_NAME, name):
                raise ValueError(f"{name!r} is not a resource name (e.g. cpu, nvidia.com/gpu)")
        return quantities


#: A count or a percentage of replicas, as a Deployment's rolling update takes them.
IntOrPercent = Annotated[StrictInt | str, AfterValidator(lambda value: _count_or_percent(value))]


def _count_or_percent(value: int | str) -> int | str:
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must be >= 0")
        return value
    if not re.fullmatch(r"[0-9]{1,3}%", value):
        raise ValueError(f"{value!r} is not a count or a percentage (e.g. 1, 25%)")
    return value


class RolloutSpec(Spec):
    """How a change rolls over the replicas (the Deployment's rolling update)."""

    max_surge: IntOrPercent | None = Field(
        default=None,
        alias="maxSurge",
        description="Extra replicas while rolling (unset: 0 for GPU pools, which have no "
        "spare GPU unless you say so; 25% otherwise). 1 on a cluster with a spare GPU keeps "
        "every replica serving through a rollout.",
    )
    max_unavailable: IntOrPercent | None = Field(
        default=None,
        alias="maxUnavailable",
        description="Replicas that may be down while rolling (unset: 1 for GPU pools, 25% "
        "otherwise).",
    )


class SimEngineSpec(Spec):
    """Options of the simulated engine (`fairpool engine-sim`)."""

    profile: str = Field(default="llama3-8b-h100", description="Hardware/model profile.")
    speedup: float = Field(default=1.0, gt=0, description="Run this many times real time.")
    memory_tokens: int | None = Field(
        default=None, ge=1, alias="memoryTokens", description="KV-cache size in tokens."
    )


class EngineSpec(Spec):
    kind: EngineKind = Field(
        default="vllm", description="vllm (vLLM with fairpool's scheduler) or sim."
    )
    image: str | None = Field(default=None, description="Engine image; default from the chart.")
    extra_args: list[str] = Field(
        default_factory=list, alias="extraArgs", description="More command-line arguments."
    )
    resources: Resources = Field(default_factory=Resources, description="Per replica.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, alias="nodeSelector", description="Node labels replicas need."
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes tolerations of the engine pods."
    )
    sim: SimEngineSpec = Field(default_factory=SimEngineSpec, description="For kind sim only.")
    template: dict[str, Any] = Field(
        default_factory=dict,
        description="A pod template (metadata: labels, annotations; spec: env and envFrom "
        "of the `engine` container, sidecars, tolerations, affinity, topologySpreadConstraints, "
        "priorityClassName, runtimeClassName, volumes, ...) the operator's engine pods are "
        "laid over: what the operator sets wins, the rest is added (docs/operator.md).",
    )
    allow_untested_vllm: bool = Field(
        default=False,
        alias="allowUntestedVllm",
        description="Start fairpool's scheduler on a vLLM release it is not tested with "
        "(FAIRPOOL_ALLOW_UNTESTED_VLLM=1); by default it refuses one outside its range.",
    )
    _check_template = field_validator("template")(lambda cls, value: _template_shape(value))
    startup_seconds: int | None = Field(
        default=None,
        ge=10,
        le=86_400,
        alias="startupSeconds",
        description="How long an engine may take to load its model before Kubernetes "
        "restarts it (unset: 1800 for vllm, 120 for sim).",
    )
    drain_seconds: int = Field(
        default=120,
        ge=0,
        le=3600,
        alias="drainSeconds",
        description="How long a stopping engine finishes what it serves: it leaves the "
        "gateway's rotation, then stops once no request runs or waits, at most this long "
        "(0: no drain).",
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Rolling updates.")
    progress_deadline_seconds: int | None = Field(
        default=None,
        ge=60,
        le=86_400,
        alias="progressDeadlineSeconds",
        description="How long a rollout may go without progress before the pool is "
        "Degraded (unset: startupSeconds plus 600, plus 3600 for a source fetched at start).",
    )
    shm_size: str = Field(
        default="8Gi",
        alias="shmSize",
        pattern=QUANTITY_PATTERN,
        description="Size limit of /dev/shm (vllm: its workers share tensors there), "
        "counted in the pod's memory.",
    )
    scratch_size: str = Field(
        default="32Gi",
        alias="scratchSize",
        pattern=QUANTITY_PATTERN,
        description="Size limit of /tmp (vLLM's and Triton's caches). A pod that writes "
        "more is evicted.",
    )


def _template_shape(template: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(template) - {"metadata", "spec"})
    if unknown:
        raise ValueError(f"a pod template has metadata and spec only, not {', '.join(unknown)}")
    for part in ("metadata", "spec"):
        if not isinstance(template.get(part, {}), dict):
            raise ValueError(f"template.{part} must be a mapping")
    return template


def _min_share(band: str) -> BandShare:
    return BandShare(minShare=DEFAULT_MIN_SHARES[band])


class PoolBands(Spec):
    """A tenant's band is its TenantQuota's spec.slo.class; interactive has no minimum."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            ("double(self.standard.minShare) + double(self.batch.minShare) < 1.0",
             "the minimum shares of standard and batch must add up to below 1"),
        )
    )  # fmt: skip

    standard: BandShare = Field(
        default_factory=lambda: _min_share("standard"),
        description="The standard band's minimum share.",
    )
    batch: BandShare = Field(
        default_factory=lambda: _min_share("batch"), description="The batch band's minimum share."
    )

    @model_validator(mode="after")
    def _below_one(self) -> PoolBands:
        total = self.standard.min_share + self.batch.min_share
        if total >= 1:
            raise ValueError(
                f"the minimum shares of standard and batch must add up to below 1, got "
                f"{self.standard.min_share} + {self.batch.min_share}"
            )
        return self

    def by_band(self) -> dict[Band, BandShare]:
        """The bands' minimum shares as the scheduler and gateway configurations map them."""
        return {"standard": self.standard, "batch": self.batch}


class PoolScheduler(Spec):
    """The fair scheduler inside every engine of the pool."""

    policy: str = Field(
        default="dlpm", description="dlpm, vtc, lpm, fcfs, ... (any engine policy)."
    )
    memory_safe: bool = Field(
        default=False, alias="memorySafe", description="Admit only what can never overflow KV."
    )
    quantum: float | None = Field(
        default=None,
        gt=0,
        description="DLPM's quantum Q in service units (dlpm only; unset: auto, the largest "
        "prompt cost admitted, at least 2048).",
    )
    share_memory: bool | None = Field(
        default=None,
        alias="shareMemory",
        description="Under KV pressure, preempt from and hold back the tenants above their "
        "weighted share of the cache (unset: on for vtc and dlpm, off for the others).",
    )
    cost: CostWeights = Field(default_factory=CostWeights, description="Service cost weights.")
    bands: PoolBands = Field(
        default_factory=PoolBands,
        description="Priority bands: while requests of more than one band wait, the highest "
        "band goes first, but each lower band with requests waiting is served at least its "
        "minShare of the service.",
    )

    _known_policy = field_validator("policy")(lambda cls, name: known_policy(name))


class Saturation(Spec):
    """When a worker counts as full: new requests then wait in the gateway's fair queue."""

    max_outstanding: int = Field(
        default=64,
        ge=1,
        alias="maxOutstanding",
        description="Requests the gateway has in flight on one worker.",
    )
    max_waiting: int = Field(
        default=8,
        ge=0,
        alias="maxWaiting",
        description="Requests waiting in the engine's own queue (vllm:num_requests_waiting).",
    )
    max_kv_usage: float = Field(
        default=0.95,
        gt=0,
        le=1,
        alias="maxKvUsage",
        description="Fraction of KV cache in use (vllm:kv_cache_usage_perc).",
    )
    tenant_waiting: int = Field(
        default=8,
        ge=1,
        alias="tenantWaiting",
        description="With fair engines: requests of each tenant that may wait in each "
        "engine's queue whatever the thresholds above. More than the engine admits at "
        "once, so that a tenant's queue there does not empty before it is refilled (a fair "
        "scheduler forgets the credit of a tenant whose queue empties).",
    )


def _no_default_in_schema(schema: dict[str, Any]) -> None:
    """A default that depends on other fields stays out of the CRD: the API server would
    store it, and the models would then take it for the user's choice (a placement pool's
    unset routing policy would look like an explicit d2lpm, and be refused)."""
    schema.pop("default", None)


class RoutingSpec(Spec):
    """How the gateway spreads requests over the pool's replicas."""

    policy: str = Field(
        default="d2lpm",
        description="d2lpm, cache_aware, least_load, ... (unset: d2lpm, or jffc with placement).",
        json_schema_extra=_no_default_in_schema,
    )
    worker_quantum: float | None = Field(
        default=None,
        gt=0,
        alias="workerQuantum",
        description="D2LPM's per-worker quantum Q^w in service units (unset: auto, eight "
        "times the largest prompt cost routed, at least 8192).",
    )
    min_match_chars: int = Field(
        default=64,
        ge=0,
        alias="minMatchChars",
        description="Shorter prompt-prefix matches are ignored: about one 16-token KV block "
        "of text, the least an engine can reuse.",
    )
    saturation: Saturation = Field(default_factory=Saturation, description="Full workers.")
    queue_policy: Literal["vtc", "fcfs"] = Field(
        default="vtc",
        alias="queuePolicy",
        description="Order of the gateway's queue when every worker is saturated: vtc "
        "(fair across tenants) or fcfs (arrival order, for comparison).",
    )
    queue_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        alias="queueTimeoutSeconds",
        description="Longest a request waits in the gateway's fair queue before a 429.",
    )
    wait_for_workers: bool = Field(
        default=False,
        alias="waitForWorkers",
        description="While no model server is in rotation (starting, or scaled to zero), "
        "hold requests in the fair queue instead of answering 503 at once.",
    )
    share_cache_across_tenants: bool = Field(
        default=False,
        alias="shareCacheAcrossTenants",
        description="Let tenants share prefix-cache entries (and routing by them). Off, each "
        "tenant's prompts are cached apart (vLLM's cache_salt), so no tenant can learn "
        "from cache hits or timing what another sent.",
    )

    @field_validator("policy")
    @classmethod
    def _known_router(cls, name: str) -> str:
        if name not in ROUTERS:
            raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
        return name


class InferencePoolSpec(Spec):
    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            ("self.engine.kind == 'sim' || has(self.model.source)",
             "model.source is required for engine kind vllm"),
            ("!has(self.placement) || has(self.model.maxModelLen)",
             "model.maxModelLen is required with placement (it sizes KV)"),
            ("!has(self.placement) || !has(self.routing.policy) || self.routing.policy == 'jffc'",
             "routing.policy must be jffc (or unset) with placement"),
            ("self.engine.kind == 'sim' || !self.scheduler.policy.startsWith('rad')",
             "scheduler.policy rad needs engine kind sim: vLLM cannot keep a batch to one phase"),
        )
    )  # fmt: skip

    model: ModelSpec = Field(description="The model the pool serves.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="The model servers.")
    replicas: int = Field(default=1, ge=0, le=1024, description="Engine replicas.")
    scheduler: PoolScheduler = Field(
        default_factory=PoolScheduler, description="Fair scheduling inside each engine."
    )
    routing: RoutingSpec = Field(
        default_factory=RoutingSpec, description="Routing across replicas at the gateway."
    )
    placement: PlacementSpec | None = Field(
        default=None,
        description="Split the model over chains of mixed GPUs, each chain one "
        "pipeline-parallel engine (docs/placement.md); replicas is then ignored.",
    )

    @model_validator(mode="after")
    def _vllm_needs_weights(self) -> InferencePoolSpec:
        if self.engine.kind == "vllm" and self.model.source is None:
            raise ValueError("model.source is required for engine kind vllm")
        return self

    @model_validator(mode="after")
    def _vllm_batches_mix_phases(self) -> InferencePoolSpec:
        """vLLM decodes its running requests in every batch; a policy that keeps a batch to
        one phase (RAD) runs only on the simulated engine (docs/scheduling.md)."""
        if self.engine.kind == "vllm" and not mixes_phases(self.scheduler.policy):
            raise ValueError(
                "scheduler.policy rad needs engine kind sim: vLLM cannot keep a batch to one phase"
            )
        return self

    @property
    def gpus(self) -> int:
        """GPUs per replica: as given, else one for vLLM and none for the simulator."""
        given = self.engine.resources.gpus
        if given is not None:
            return given
        return 1 if self.engine.kind == "vllm" else 0

    @property
    def startup_seconds(self) -> int:
        """How long a replica may take to start: as given, else sized for loading a
        model (vLLM) or for a process start (sim)."""
        given = self.engine.startup_seconds
        if given is not None:
            return given
        return 1800 if self.engine.kind == "vllm" else 120

    @property
    def progress_deadline_seconds(self) -> int:
        """How long a rollout may stall: as given, else model loading and a download."""
        given = self.engine.progress_deadline_seconds
        if given is not None:
            return given
        uri = self.model.uri
        fetched = self.engine.kind == "vllm" and uri is not None and uri.fetched
        return self.startup_seconds + 600 + (3600 if fetched else 0)

    @model_validator(mode="after")
    def _placement_routes_with_jffc(self) -> InferencePoolSpec:
        """Chains differ in speed and capacity: the gateway balances them with JFFC."""
        if self.placement is None:
            return self
        if self.model.max_model_len is None:
            raise ValueError("model.maxModelLen is required with placement (it sizes KV)")
        if "policy" in self.routing.model_fields_set and self.routing.policy != "jffc":
            raise ValueError("routing.policy must be jffc (or unset) with placement")
        self.routing.policy = "jffc"
        return self


class InferencePool(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)  # status and the like
    api_version: Literal["fairpool.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["InferencePool"]
    metadata: Metadata
    spec: InferencePoolSpec
    status: InferencePoolStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name
