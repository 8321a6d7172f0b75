"""The gateway's configuration: its pools (with where their workers are) and its tenant table.

`fairpool up` writes it from the manifests; in Kubernetes the operator renders it into the
gateway's tenant-table Secret. The gateway re-reads the file when it changes, so a new
tenant, weight or key takes effect without a restart.

```yaml
listen: {host: 0.0.0.0, port: 8080}
admin: {host: 127.0.0.1, port: 8081}        # or a non-loopback host with a tokenFile
pools:
  - name: chat
    model: llama-3-8b                       # served model name clients ask for
    routing: {policy: d2lpm}                # workerQuantum: auto
    bands: {standard: {minShare: 0.1}, batch: {minShare: 0.05}}
    workers: {urls: [http://10.0.0.5:8000, http://10.0.0.6:8000]}
groups:                                     # the fair order's tree (TenantGroups)
  acme: {weight: 3}
  acme-support: {weight: 2, parent: acme}
tenants:
  - tenant: acme-chat
    weight: 2
    group: acme-support                     # default: directly under its band
    pools: [chat]
    slo: {class: interactive}               # the band
    apiKeySha256: [9f86d081884c7d65...]     # SHA-256 of each key, hex; never the key
    limits: {requestsPerMinute: 600, concurrent: 32}
```
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import Field, field_validator, model_validator

from fairpool.api.common import DNS_LABEL, Spec, field_error
from fairpool.api.inference_pool import InferencePool, PoolBands, RoutingSpec
from fairpool.api.manifests import Manifests
from fairpool.api.scheduler_config import CostWeights
from fairpool.api.shares import GroupShare
from fairpool.api.tenant_group import TenantPlace, fair_order, group_problems, group_shares
from fairpool.api.tenant_quota import (
    SecretKeyRef,
    ServiceLevel,
    TenantId,
    TenantLimits,
    TenantQuota,
)
from fairpool.api.validation import validate
from fairpool.sched.errors import ConfigError
from fairpool.sched.registry import weighs_tenants
from fairpool.sched.tree import Shares

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def key_digest(key: str) -> str:
    """What the gateway stores of an API key: its SHA-256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Address(Spec):
    host: str = Field(default="127.0.0.1", description="Interface to listen on.")
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port (0: any free port).")


class AdminAddress(Address):
    """The admin API: metrics and every tenant's state. On a loopback address by default;
    anywhere else it needs a bearer token, read from `tokenFile` (a mounted Secret)."""

    port: int = Field(default=8081, ge=0, le=65535, description="TCP port (0: any free port).")
    token_file: str | None = Field(
        default=None,
        alias="tokenFile",
        description="A file holding the admin API's bearer token (re-read when it changes).",
    )
    max_connections: int = Field(
        default=128,
        ge=2,
        alias="maxConnections",
        description="Open connections to the admin port (probes, scrapes); more are reset.",
    )
    max_connections_per_client: int = Field(
        default=32,
        ge=1,
        alias="maxConnectionsPerClient",
        description="Open connections to the admin port from one client address.",
    )

    @model_validator(mode="after")
    def _private(self) -> AdminAddress:
        if self.token_file is None and not is_loopback(self.host):
            raise field_error(
                "AdminAddress",
                ("tokenFile",),
                None,
                f"required when the admin API listens on {self.host}, not a loopback address "
                "(the admin API shows every tenant's usage)",
            )
        if self.token_file is not None and not self.token_file.strip():
            raise field_error("AdminAddress", ("tokenFile",), self.token_file, "must be a path")
        return self


class KubernetesWorkersSpec(Spec):
    """The ready endpoints of the pool's headless Service, from its EndpointSlices."""

    namespace: str = Field(min_length=1, description="Namespace of the Service.")
    service: str = Field(min_length=1, description="Name of the pool's headless Service.")
    port_name: str = Field(default="http", alias="portName", description="Named port to use.")


class WorkerSource(Spec):
    """Where a pool's workers are: exactly one of urls, file and kubernetes."""

    urls: list[str] | None = Field(default=None, description="Base URLs, e.g. http://h:8000.")
    file: str | None = Field(
        default=None, description="A file of base URLs, one per line, re-read on change."
    )
    kubernetes: KubernetesWorkersSpec | None = Field(default=None, description="Watched endpoints.")

    @model_validator(mode="after")
    def _exactly_one(self) -> WorkerSource:
        given = [name for name in ("urls", "file", "kubernetes") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of urls, file, kubernetes (got {given or 'none'})")
        for url in self.urls or ():
            check_worker_url(url)
        return self


def check_worker_url(url: str) -> str:
    if not re.match(r"^https?://[^/\s]+/?$", url):
        raise ValueError(f"worker URL must look like http://host:port, got {url!r}")
    return url.rstrip("/")


class ChainWorker(Spec):
    """One chain of a placement pool: a pipeline-parallel engine, its capacity c_k and its
    predicted service rate μ_k, which JFFC dispatches by."""

    name: str = Field(min_length=1, description="Chain name, e.g. chain-0.")
    url: str = Field(description="Base URL of the chain's first stage (its OpenAI server).")
    capacity: int = Field(ge=1, description="Requests the chain may run at once.")
    service_rate: float = Field(
        gt=0, alias="serviceRate", description="Predicted requests per second per slot (1/T_k)."
    )

    _url = field_validator("url")(lambda cls, url: check_worker_url(url))


class GatewayPool(Spec):
    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="The InferencePool's name (a DNS label, as Kubernetes names it: it is "
        "part of the shared state's keys).",
    )
    model: str = Field(min_length=1, description="Served model name that selects this pool.")
    routing: RoutingSpec = Field(default_factory=RoutingSpec, description="Worker choice.")
    cost: CostWeights = Field(default_factory=CostWeights, description="Service cost weights.")
    bands: PoolBands = Field(
        default_factory=PoolBands, description="The lower bands' minimum shares."
    )
    workers: WorkerSource = Field(description="Where the pool's workers are.")
    chains: list[ChainWorker] = Field(
        default_factory=list,
        description="For placement pools: the chains' capacities and rates, by worker URL.",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        alias="maxModelLen",
        description="The model's context: the output reserved against tokensPerMinute for a "
        "request that sets no output limit.",
    )
    fair_engines: bool = Field(
        default=False,
        alias="fairEngines",
        description="The engines run a scheduler that keeps the tenants' weights (fairpool's "
        "vtc or dlpm): each tenant may then always keep one request waiting in every "
        "engine, so the engines' weights decide whatever the number of gateway replicas.",
    )

    @model_validator(mode="after")
    def _chains_are_workers(self) -> GatewayPool:
        if not self.chains:
            return self
        if self.routing.policy != "jffc":
            raise ValueError("chains need routing.policy jffc")
        if self.workers.urls is None:
            raise ValueError("chains need workers.urls (the chains' URLs)")
        missing = sorted({chain.url for chain in self.chains} - set(self.workers.urls))
        if missing:
            raise ValueError(f"chain URL {missing[0]!r} is not among workers.urls")
        return self


class GatewayTenant(Spec):
    tenant: TenantId = Field(
        description="Tenant id, as a TenantQuota's spec.tenant: it is part of the shared "
        "state's Redis keys, which a `{`, `}` or `:` in it would change."
    )
    weight: float = Field(default=1.0, gt=0, description="Share of service among its siblings.")
    group: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="The group (of `groups`) the tenant belongs to; unset: directly under "
        "its band (its slo.class).",
    )
    pools: list[str] = Field(default_factory=list, description="Pools allowed; empty: all.")
    api_key_sha256: list[str] = Field(
        default_factory=list, alias="apiKeySha256", description="SHA-256 (hex) of each API key."
    )
    api_key_files: list[str] = Field(
        default_factory=list,
        alias="apiKeyFiles",
        description="Files holding API keys, one per line (a mounted Secret).",
    )
    limits: TenantLimits = Field(default_factory=TenantLimits, description="Hard limits.")
    slo: ServiceLevel = Field(default_factory=ServiceLevel, description="Latency targets.")

    @field_validator("api_key_sha256")
    @classmethod
    def _hex_digests(cls, digests: list[str]) -> list[str]:
        for digest in digests:
            if not SHA256_HEX.match(digest):
                raise ValueError("each entry must be 64 lowercase hex digits (a SHA-256)")
        return digests

    def may_use(self, pool: str) -> bool:
        return not self.pools or pool in self.pools

    def place(self) -> TenantPlace:
        """Where the tenant is in the fair order's tree."""
        return TenantPlace(
            self.tenant, self.weight, self.group, self.slo.slo_class, self.slo.ttft_seconds
        )


class Timeouts(Spec):
    """Seconds; every upstream call has one. Running out of one is the request's failure,
    not the worker's: only a worker that cannot be reached leaves rotation (and health
    checks take out one that stops answering)."""

    connect: float = Field(default=2.0, gt=0, description="Connecting to a worker.")
    first_byte: float = Field(
        default=300.0,
        gt=0,
        alias="firstByte",
        description="Until a streamed answer starts (the engine may queue the request).",
    )
    total: float = Field(
        default=900.0, gt=0, description="Until a non-streamed answer has arrived whole."
    )
    idle: float = Field(default=60.0, gt=0, description="Between two chunks of a stream.")
    health: float = Field(default=1.0, gt=0, description="A health or metrics poll.")


class ClientLimits(Spec):
    """What one client connection and one request may cost the gateway before it is
    refused: bounds on time and on the work of parsing, checked before anything else."""

    header_timeout: float = Field(
        default=10.0, gt=0, alias="headerTimeout", description="Seconds to send the headers."
    )
    body_timeout: float = Field(
        default=30.0, gt=0, alias="bodyTimeout", description="Seconds to send the body (408)."
    )
    write_timeout: float = Field(
        default=30.0,
        gt=0,
        alias="writeTimeout",
        description="Longest a stream waits for its client to read; then it is cut.",
    )
    idle_timeout: float = Field(
        default=3.0,
        gt=0,
        alias="idleTimeout",
        description="Seconds a connection may stay silent before its request starts (after "
        "it opens, or after its previous answer); then it is reset.",
    )
    keep_alive_timeout: float = Field(
        default=30.0,
        gt=0,
        alias="keepAliveTimeout",
        description="Seconds a kept-alive connection may stay silent between two requests; "
        "then it is reset. Longer than clients keep idle pooled connections (httpx and the "
        "OpenAI SDK 5 s, aiohttp 15 s), so that a client drops one before the gateway does "
        "and never sends a request on a connection being reset.",
    )
    max_connections: int = Field(
        default=4096,
        ge=1,
        alias="maxConnections",
        description="Open connections to the tenant port; more are reset at once.",
    )
    max_connections_per_client: int = Field(
        default=1024,
        ge=1,
        alias="maxConnectionsPerClient",
        description="Open connections to the tenant port from one client address (behind a "
        "proxy every client has the proxy's address: raise it to the proxy's pool).",
    )
    max_tenant_requests: int = Field(
        default=1024,
        ge=1,
        alias="maxTenantRequests",
        description="Requests one tenant may have open at the gateway at once, in any phase "
        "(its body read, queued, answered); 429 beyond, before the body is read.",
    )
    max_bytes_in_flight: int = Field(
        default=256 << 20,
        ge=1 << 20,
        alias="maxBytesInFlight",
        description="Bytes of request bodies and answers the gateway holds for all tenants "
        "together (503 beyond, for bodies; answers wait for room).",
    )
    max_tenant_bytes_in_flight: int = Field(
        default=64 << 20,
        ge=1 << 16,
        alias="maxTenantBytesInFlight",
        description="Bytes of request bodies and answers the gateway holds for one tenant "
        "(429 beyond, for bodies; answers wait for room).",
    )
    send_buffer_bytes: int | None = Field(
        default=256 << 10,
        ge=4096,
        alias="sendBufferBytes",
        description="The kernel's send buffer of each client connection (SO_SNDBUF; null: "
        "the kernel's own, which grows to megabytes): what a client that stops reading pins "
        "before its writes stall, and a stream's throughput is at most it per round trip.",
    )
    max_answer_bytes: int = Field(
        default=64 << 20,
        ge=1 << 16,
        alias="maxAnswerBytes",
        description="Largest answer that is not streamed (an engine's larger answer is a 502).",
    )
    refusal_burst: float = Field(
        default=20.0,
        ge=1,
        alias="refusalBurst",
        description="Refusals a tenant (or an address without a valid key) may get at once "
        "before the rest are held back and their connections closed.",
    )
    refusal_rate: float = Field(
        default=5.0,
        gt=0,
        alias="refusalRate",
        description="Refusals a second it may get for ever (one more per MiB of body read).",
    )
    max_json_objects: int = Field(
        default=20_000,
        ge=10,
        alias="maxJsonObjects",
        description="JSON objects in a request body (a 400 beyond): each costs far more "
        "memory parsed than its bytes.",
    )
    max_json_arrays: int = Field(
        default=20_000,
        ge=10,
        alias="maxJsonArrays",
        description="JSON arrays in a request body (a 400 beyond).",
    )
    max_json_strings: int = Field(
        default=200_000,
        ge=10,
        alias="maxJsonStrings",
        description="JSON strings, keys included, in a request body (a 400 beyond).",
    )
    max_json_numbers: int = Field(
        default=600_000,
        ge=10,
        alias="maxJsonNumbers",
        description="Numbers in a request body (token ids: a 128k-token prompt is 128k).",
    )
    max_json_depth: int = Field(
        default=64, ge=4, le=500, alias="maxJsonDepth", description="Nesting of a request body."
    )
    max_messages: int = Field(
        default=4096, ge=1, alias="maxMessages", description="Messages or input items."
    )
    max_choices: int = Field(
        default=8, ge=1, alias="maxChoices", description="`n` and `best_of`, each."
    )
    max_logprobs: int = Field(
        default=20,
        ge=0,
        alias="maxLogprobs",
        description="`logprobs`, `top_logprobs` and `prompt_logprobs`, each.",
    )

    @model_validator(mode="after")
    def _per_client_within_total(self) -> ClientLimits:
        if self.max_tenant_bytes_in_flight > self.max_bytes_in_flight:
            raise field_error(
                "ClientLimits",
                ("maxTenantBytesInFlight",),
                self.max_tenant_bytes_in_flight,
                f"at most maxBytesInFlight ({self.max_bytes_in_flight})",
            )
        return self


class SharedStateSpec(Spec):
    """Where the gateway's replicas share tenant state (`docs/gateway.md`, "Several
    replicas"): a Redis or Valkey server."""

    url: str = Field(
        min_length=1,
        pattern=r"^(redis|rediss|unix)://",
        description="redis://host:port/db (rediss:// for TLS, unix:// for a socket).",
    )
    password_file: str | None = Field(
        default=None,
        alias="passwordFile",
        description="A file holding the server's password (a mounted Secret).",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Gateway replicas sharing the state: while the server is unreachable, each "
        "enforces its tenants' limits divided by this.",
    )
    lease_seconds: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        alias="leaseSeconds",
        description="How long a request's concurrency slot outlives a replica that stopped "
        "renewing it (one killed mid-stream).",
    )
    timeout_seconds: float = Field(
        default=0.25,
        gt=0,
        le=10,
        alias="timeoutSeconds",
        description="Longest wait for the server before a request is admitted by the local "
        "fallback instead.",
    )
    username: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^\S+$",
        description="The server's ACL user the gateway logs in as (with passwordFile): one "
        "allowed only keyPrefix's keys and channels and the gateway's commands.",
    )
    key_prefix: str = Field(
        default="fairpool",
        alias="keyPrefix",
        description="The first part of every key and channel the gateway uses "
        "(PREFIX:{tenant}:..., PREFIX:pool:{pool}:...): one per release, so that an ACL "
        "user can be allowed those alone (~PREFIX:* &PREFIX:*).",
    )

    @field_validator("key_prefix")
    @classmethod
    def _prefix_keeps_the_layout(cls, prefix: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", prefix):
            raise ValueError(
                f"keyPrefix {prefix!r} must be 1 to 128 letters, digits, '.', '_' or '-': a "
                "'{', '}', ':' or space would change the keys' layout, and a '*', '?' or '[' "
                "the ACL pattern ~PREFIX:* that allows them"
            )
        return prefix

    @model_validator(mode="after")
    def _username_with_password(self) -> SharedStateSpec:
        if self.username is not None and self.password_file is None:
            raise field_error(
                "SharedStateSpec",
                ("username",),
                self.username,
                "an ACL user logs in with a password: set passwordFile too",
            )
        return self


class GatewayConfig(Spec):
    listen: Address = Field(default_factory=Address, description="The tenant API.")
    admin: AdminAddress = Field(
        default_factory=AdminAddress,
        description="The admin API: loopback, or protected by a bearer token (tokenFile).",
    )
    drain_seconds: float = Field(
        default=45.0,
        ge=0,
        le=3600,
        alias="drainSeconds",
        description="On shutdown, how long requests in flight may take to finish before the "
        "gateway ends them (under the pod's terminationGracePeriodSeconds).",
    )
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Upstream timeouts.")
    clients: ClientLimits = Field(
        default_factory=ClientLimits, description="Bounds on what clients may cost."
    )
    health_interval: float = Field(
        default=0.5, gt=0, le=10, alias="healthInterval", description="Seconds between polls."
    )
    max_request_bytes: int = Field(
        default=4 << 20, ge=1024, alias="maxRequestBytes", description="Largest request body."
    )
    max_tree_bytes: int = Field(
        default=64 << 20,
        ge=1 << 16,
        alias="maxTreeBytes",
        description="Memory each pool's routing prefix tree may hold, estimated from what "
        "its text and its nodes cost (about a byte a character and 600 bytes a node).",
    )
    shared_state: SharedStateSpec | None = Field(
        default=None,
        alias="sharedState",
        description="Tenant state shared by the gateway's replicas (unset: this gateway's own).",
    )
    pools: list[GatewayPool] = Field(default_factory=list, description="Pools served.")
    groups: dict[str, GroupShare] = Field(
        default_factory=dict,
        description="The groups of the fair order's tree (TenantGroups), by name.",
    )
    tenants: list[GatewayTenant] = Field(default_factory=list, description="Tenant table.")

    @model_validator(mode="after")
    def _consistent(self) -> GatewayConfig:
        names = [pool.name for pool in self.pools]
        models = [pool.model for pool in self.pools]
        for label, values in (("pool name", names), ("model", models)):
            duplicates = sorted({value for value in values if values.count(value) > 1})
            if duplicates:
                raise ValueError(f"{label} {duplicates[0]!r} is used by two pools")
        tenants = [tenant.tenant for tenant in self.tenants]
        duplicates = sorted({tenant for tenant in tenants if tenants.count(tenant) > 1})
        if duplicates:
            raise ValueError(f"tenant {duplicates[0]!r} is defined twice")
        for tenant in self.tenants:
            unknown = sorted(set(tenant.pools) - set(names))
            if unknown:
                raise ValueError(f"tenant {tenant.tenant!r} names unknown pool {unknown[0]!r}")
        owners: dict[str, str] = {}
        for index, tenant in enumerate(self.tenants):
            for digest in tenant.api_key_sha256:
                owner = owners.setdefault(digest, tenant.tenant)
                if owner != tenant.tenant:
                    raise field_error(
                        "GatewayConfig",
                        ("tenants", index, "apiKeySha256"),
                        digest,
                        f"the key with digest {digest[:12]}… is listed under tenants "
                        f"{owner!r} and {tenant.tenant!r}: a key must name one tenant",
                    )
        self._check_tree()
        if self.admin.port == self.listen.port != 0:
            raise field_error(
                "GatewayConfig",
                ("admin", "port"),
                self.admin.port,
                f"the admin API must not share the tenant API's port (listen.port "
                f"{self.listen.port}): the gateway tells the two APIs apart by port",
            )
        return self

    def _check_tree(self) -> None:
        """Every group's parent and every tenant's group is a group, and no group is its own
        ancestor: the tree of every pool is one."""
        problems = group_problems(self.groups)
        if problems:
            name = min(problems)
            parent = self.groups[name].parent
            raise field_error(
                "GatewayConfig", ("groups", name, "parent"), parent, problems[name][1]
            )
        for index, tenant in enumerate(self.tenants):
            if tenant.group is not None and tenant.group not in self.groups:
                raise field_error(
                    "GatewayConfig",
                    ("tenants", index, "group"),
                    tenant.group,
                    f"no group {tenant.group!r}",
                )

    def pool_for_model(self, model: str) -> GatewayPool | None:
        return next((pool for pool in self.pools if pool.model == model), None)

    def shares(self, pool_name: str) -> Shares:
        """The fair order's tree of one pool: the tenants allowed in it, under their groups
        and in their bands, with the pool's bands' minimum shares (`fair_order`, as the
        engines' scheduler configuration has it)."""
        pool = next((pool for pool in self.pools if pool.name == pool_name), None)
        if pool is None:
            raise ConfigError("pool", f"no pool named {pool_name!r}")
        places = [tenant.place() for tenant in self.tenants if tenant.may_use(pool_name)]
        return fair_order(places, self.groups, pool.bands.by_band()).shares()


def load_gateway_config(path: str | Path, option: str = "--config") -> GatewayConfig:
    source = Path(path)
    if not source.is_file():
        raise ConfigError(option, f"no such file: {source}")
    try:
        document = yaml.safe_load(source.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(source.name, f"not valid YAML: {error}") from None
    return validate(GatewayConfig, document or {}, source.name)


def gateway_config_from_manifests(
    manifests: Manifests,
    workers: Mapping[str, list[str] | WorkerSource],
    **settings: object,
) -> GatewayConfig:
    """The gateway configuration the manifests describe; each pool's workers are a list of
    URLs (local mode) or any worker source (the operator: the pool's EndpointSlices).

    API keys are read from the Secrets the TenantQuotas reference and kept as digests.
    """
    pools = [gateway_pool(pool, workers.get(pool.name, [])) for pool in manifests.pools]
    tenants = []
    for quota in manifests.quotas:
        where = f"TenantQuota {quota.metadata.name}: spec.apiKeySecretRef"
        tenants.append(
            gateway_tenant(quota, api_keys(manifests, quota.spec.api_key_secret_ref, where))
        )
    groups = group_shares(manifests.groups)
    document = {"pools": pools, "groups": groups, "tenants": tenants, **settings}
    return validate(GatewayConfig, document, "gateway configuration")


def gateway_pool(
    pool: InferencePool,
    workers: list[str] | WorkerSource,
    chains: list[ChainWorker] | None = None,
) -> GatewayPool:
    """The gateway's entry for a pool: its model, routing, costs and where its workers are
    (for a placement pool, its chains: their URLs are then the workers)."""
    if chains:
        workers = [chain.url for chain in chains]
    source = workers if isinstance(workers, WorkerSource) else WorkerSource(urls=workers)
    return GatewayPool(
        name=pool.name,
        model=pool.spec.model.name,
        routing=pool.spec.routing,
        cost=pool.spec.scheduler.cost,
        bands=pool.spec.scheduler.bands,
        workers=source,
        chains=chains or [],
        maxModelLen=pool.spec.model.max_model_len,
        fairEngines=weighs_tenants(pool.spec.scheduler.policy),
    )


def gateway_tenant(
    quota: TenantQuota, keys: list[str], pools: list[str] | None = None
) -> GatewayTenant:
    """The gateway's entry for a tenant: weight, group, pools (`pools` replaces the quota's
    list), limits, SLO (its class the band) and the digests of its API keys (never the
    keys)."""
    return GatewayTenant(
        tenant=quota.tenant,
        weight=quota.spec.weight,
        group=quota.spec.group,
        pools=quota.spec.pools if pools is None else pools,
        apiKeySha256=sorted({key_digest(key) for key in keys}),
        limits=quota.spec.limits,
        slo=quota.spec.slo,
    )


def api_keys(manifests: Manifests, reference: SecretKeyRef | None, where: str) -> list[str]:
    """The keys a TenantQuota's secret reference names (none without a reference)."""
    if reference is None:
        return []
    secret = manifests.secrets.get(reference.name)
    if secret is None:
        raise ConfigError(where, f"no Secret named {reference.name!r} among the manifests")
    values = secret.values()
    if reference.key is not None:
        if reference.key not in values:
            raise ConfigError(where, f"Secret {reference.name!r} has no entry {reference.key!r}")
        values = {reference.key: values[reference.key]}
    keys = [value.strip() for value in values.values() if value.strip()]
    if not keys:
        raise ConfigError(where, f"Secret {reference.name!r} holds no API key")
    return keys
