"""The names, labels, paths and environment the operator and the Helm chart share.

Everything here is part of the contract documented in docs/operator.md: the chart's RBAC,
Deployments, mounts and NetworkPolicies (which select the engine pods by ENGINE_APP,
MANAGED_BY and CHAIN_LABEL) are written against it. Change it there too, or not at all.
"""

from __future__ import annotations

import hashlib

from fairpool import __version__

#: The API group and version of InferencePool, TenantQuota and TenantGroup.
GROUP = "fairpool.io"
VERSION = "v1alpha1"
POOL_PLURAL = "inferencepools"
TENANT_PLURAL = "tenantquotas"
GROUP_PLURAL = "tenantgroups"

#: The engine's OpenAI server, in every engine pod.
ENGINE_PORT = 8000
PORT_NAME = "http"
HEALTH_PATH = "/health"

#: The scheduler ConfigMap is mounted as a directory (no subPath), so that the kubelet swaps
#: in new versions of the file and the engines, which re-read it, follow without a restart.
SCHEDULER_DIR = "/etc/fairpool/scheduler"
SCHEDULER_KEY = "scheduler.yaml"
SCHEDULER_PATH = f"{SCHEDULER_DIR}/{SCHEDULER_KEY}"
#: Where a pvc:// source's directory is mounted.
MODELS_DIR = "/models"
#: Where fetched sources (hf, s3, gs) are kept: the cache volume, filled by the init step.
MODEL_CACHE_DIR = "/var/cache/fairpool/models"
#: Where the source's credentials Secret is mounted, in the init step only.
MODEL_CREDENTIALS_DIR = "/var/run/secrets/fairpool/model"
#: The init container that fetches the model.
FETCH_CONTAINER = "fetch-model"

#: The gateway's configuration: one Secret, key gateway.yaml, mounted at GATEWAY_DIR.
GATEWAY_KEY = "gateway.yaml"
GATEWAY_DIR = "/etc/fairpool/gateway"
#: The admin API's bearer token: key `token` of a Secret the chart creates, mounted as a
#: folder at ADMIN_TOKEN_DIR in the gateway (which checks it) and in the operator (which
#: reads the gateway's /metrics with it).
ADMIN_TOKEN_KEY = "token"
ADMIN_TOKEN_DIR = "/etc/fairpool/admin-token"
ADMIN_TOKEN_PATH = f"{ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}"
GATEWAY_LISTEN = {"host": "0.0.0.0", "port": 8080}
GATEWAY_ADMIN = {"host": "0.0.0.0", "port": 8081, "tokenFile": ADMIN_TOKEN_PATH}

#: Engine pods run as this non-root user and group.
RUN_AS = 10001

MANAGED_BY = "fairpool-operator"
ENGINE_APP = "fairpool-engine"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
POOL_LABEL = "fairpool.io/pool"
#: The label a Secret must carry for the operator to read API keys from it: a TenantQuota
#: may name only such a Secret (any other is reported, never read), so nobody who may
#: write TenantQuotas can turn another Secret of the namespace into API keys.
API_KEYS_LABEL = "fairpool.io/api-keys"
API_KEYS_LABELS = {API_KEYS_LABEL: "true"}
#: A digest of the rendered object on the object itself (never on a pod template, so that
#: it restarts nothing): the reconciler rewrites an object whose digest differs.
HASH_ANNOTATION = "fairpool.io/rendered-hash"

#: The field manager of the operator's server-side applies.
FIELD_MANAGER = "fairpool-operator"

# --- environment (set by the chart) -----------------------------------------------------------
NAMESPACE_ENV = "FAIRPOOL_NAMESPACE"
ENGINE_IMAGE_ENV = "FAIRPOOL_ENGINE_IMAGE"
ENGINE_SIM_IMAGE_ENV = "FAIRPOOL_ENGINE_SIM_IMAGE"
#: The engine's override of its vLLM version check (fairpool_engine.vllm.compat).
ALLOW_UNTESTED_VLLM_ENV = "FAIRPOOL_ALLOW_UNTESTED_VLLM"
#: Comma-separated names of the image pull Secrets engine pods use (the chart's).
PULL_SECRETS_ENV = "FAIRPOOL_IMAGE_PULL_SECRETS"
GATEWAY_SECRET_ENV = "FAIRPOOL_GATEWAY_CONFIG_SECRET"
GATEWAY_ADMIN_URL_ENV = "FAIRPOOL_GATEWAY_ADMIN_URL"
GATEWAY_ADMIN_TOKEN_FILE_ENV = "FAIRPOOL_GATEWAY_ADMIN_TOKEN_FILE"
#: Several gateway pods: how many, where they share tenant state, whether the chart
#: mounts the server's password into them (at SHARED_STATE_PASSWORD_PATH), the ACL user
#: they log in as and the prefix of their keys (sharedState.username, .keyPrefix).
GATEWAY_REPLICAS_ENV = "FAIRPOOL_GATEWAY_REPLICAS"
SHARED_STATE_URL_ENV = "FAIRPOOL_GATEWAY_SHARED_STATE_URL"
SHARED_STATE_PASSWORD_ENV = "FAIRPOOL_GATEWAY_SHARED_STATE_PASSWORD"
SHARED_STATE_USERNAME_ENV = "FAIRPOOL_GATEWAY_SHARED_STATE_USERNAME"
SHARED_STATE_KEY_PREFIX_ENV = "FAIRPOOL_GATEWAY_SHARED_STATE_KEY_PREFIX"
GENERATED_SECRETS_ENV = "FAIRPOOL_GENERATED_SECRETS"
WATCH_NODES_ENV = "FAIRPOOL_WATCH_NODES"
SHARED_STATE_PASSWORD_PATH = "/etc/fairpool/shared-state/password"
SERVED_INTERVAL_ENV = "FAIRPOOL_SERVED_INTERVAL"

DEFAULT_GATEWAY_SECRET = "fairpool-gateway-config"
#: Used only when neither the pool nor the environment names an image.
DEFAULT_ENGINE_IMAGE = f"ghcr.io/fairpool/engine:{__version__}"
DEFAULT_ENGINE_SIM_IMAGE = f"ghcr.io/fairpool/engine-sim:{__version__}"
DEFAULT_PEERING = "fairpool"


def engine_name(pool: str) -> str:
    """The pool's Deployment and headless Service."""
    return f"{pool}-engine"


def model_cache_name(pool: str) -> str:
    """The pool's model cache PersistentVolumeClaim (model.cache.volume: pvc)."""
    return f"{pool}-model-cache"


def scheduler_name(pool: str) -> str:
    """The pool's scheduler ConfigMap."""
    return f"{pool}-scheduler"


def selector_labels(pool: str) -> dict[str, str]:
    """What the pool's Deployment and Service select its pods by."""
    return {NAME_LABEL: ENGINE_APP, INSTANCE_LABEL: pool}


def engine_labels(pool: str) -> dict[str, str]:
    """The labels of everything the operator creates for a pool, pods included."""
    return {**selector_labels(pool), MANAGED_BY_LABEL: MANAGED_BY, POOL_LABEL: pool}


# --- placement pools (docs/placement.md) ------------------------------------------------------
#: Which chain of a placement pool a pod or object belongs to (e.g. chain-0), and which
#: pipeline stage a pod runs ("0", "1", ...; the workers of a LeaderWorkerSet: "workers").
CHAIN_LABEL = "fairpool.io/chain"
STAGE_LABEL = "fairpool.io/stage"
LWS_WORKERS_STAGE = "workers"
#: vLLM's torch.distributed rendezvous on stage 0 (`--master-port`, vLLM's default).
MASTER_PORT = 29501
MASTER_PORT_NAME = "dist"
#: Every stage of a chain reads the layer split from this variable, in stage order.
PP_PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"
#: What the LeaderWorkerSet controller sets in each pod of a group.
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
LWS_WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
#: `auto` (detect the LeaderWorkerSet API at start), `true` or `false`.
LEADER_WORKER_SET_ENV = "FAIRPOOL_LEADER_WORKER_SET"
#: Longest name of a chain's objects: a StatefulSet's pods add "-0" and a
#: controller-revision-hash label "<name>-<10 characters>" that must stay within 63.
CHAIN_NAME_LIMIT = 48


def chain_name(pool: str, chain: str) -> str:
    """The chain's Service (the gateway's worker URL) and, with LWS, its LeaderWorkerSet."""
    return fit_name(f"{pool}-{chain}")


def stage_name(pool: str, chain: str, stage: int) -> str:
    """Without LWS: the StatefulSet of one stage (its one pod is `<name>-0`)."""
    return fit_name(f"{pool}-{chain}-s{stage}")


def head_name(pool: str, chain: str) -> str:
    """Without LWS: the headless Service that gives a chain's stage 0 its DNS name."""
    return fit_name(f"{pool}-{chain}-head")


def chain_selector_labels(pool: str, chain: str) -> dict[str, str]:
    return {**selector_labels(pool), CHAIN_LABEL: chain}


def fit_name(name: str, limit: int = CHAIN_NAME_LIMIT) -> str:
    """`name`, or when longer than `limit` its head and a digest of the whole: still unique,
    still a DNS label, the same every time."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"
