"""The names, labels, paths and environment the operator and the Helm chart share.

Everything here is part of the contract documented in docs/operator.md: the chart's RBAC,
Deployments and mounts are written against it. Change it there too, or not at all.
"""

from __future__ import annotations

from fairpool import __version__

#: The API group and version of InferencePool and TenantQuota.
GROUP = "fairpool.io"
VERSION = "v1alpha1"
POOL_PLURAL = "inferencepools"
TENANT_PLURAL = "tenantquotas"

#: The engine's OpenAI server, in every engine pod.
ENGINE_PORT = 8000
PORT_NAME = "http"
HEALTH_PATH = "/health"

#: The scheduler ConfigMap is mounted as a directory (no subPath), so that the kubelet swaps
#: in new versions of the file and the engines, which re-read it, follow without a restart.
SCHEDULER_DIR = "/etc/fairpool/scheduler"
SCHEDULER_KEY = "scheduler.yaml"
SCHEDULER_PATH = f"{SCHEDULER_DIR}/{SCHEDULER_KEY}"
#: Where the pool's weights are mounted (source path or pvc).
MODELS_DIR = "/models"

#: The gateway's configuration: one Secret, key gateway.yaml, mounted at GATEWAY_DIR.
GATEWAY_KEY = "gateway.yaml"
GATEWAY_DIR = "/etc/fairpool/gateway"
GATEWAY_LISTEN = {"host": "0.0.0.0", "port": 8080}
GATEWAY_ADMIN = {"host": "0.0.0.0", "port": 8081}

#: Engine pods run as this non-root user and group.
RUN_AS = 10001

MANAGED_BY = "fairpool-operator"
ENGINE_APP = "fairpool-engine"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
POOL_LABEL = "fairpool.io/pool"
#: A digest of the rendered object on the object itself (never on a pod template, so that
#: it restarts nothing): the reconciler rewrites an object whose digest differs.
HASH_ANNOTATION = "fairpool.io/rendered-hash"

#: The field manager of the operator's server-side applies.
FIELD_MANAGER = "fairpool-operator"

# --- environment (set by the chart) -----------------------------------------------------------
NAMESPACE_ENV = "FAIRPOOL_NAMESPACE"
ENGINE_IMAGE_ENV = "FAIRPOOL_ENGINE_IMAGE"
ENGINE_SIM_IMAGE_ENV = "FAIRPOOL_ENGINE_SIM_IMAGE"
GATEWAY_SECRET_ENV = "FAIRPOOL_GATEWAY_CONFIG_SECRET"
GATEWAY_ADMIN_URL_ENV = "FAIRPOOL_GATEWAY_ADMIN_URL"
SERVED_INTERVAL_ENV = "FAIRPOOL_SERVED_INTERVAL"

DEFAULT_GATEWAY_SECRET = "fairpool-gateway-config"
#: Used only when neither the pool nor the environment names an image.
DEFAULT_ENGINE_IMAGE = f"ghcr.io/fairpool/engine:{__version__}"
DEFAULT_ENGINE_SIM_IMAGE = f"ghcr.io/fairpool/engine-sim:{__version__}"
DEFAULT_PEERING = "fairpool"


def engine_name(pool: str) -> str:
    """The pool's Deployment and headless Service."""
    return f"{pool}-engine"


def scheduler_name(pool: str) -> str:
    """The pool's scheduler ConfigMap."""
    return f"{pool}-scheduler"


def selector_labels(pool: str) -> dict[str, str]:
    """What the pool's Deployment and Service select its pods by."""
    return {NAME_LABEL: ENGINE_APP, INSTANCE_LABEL: pool}


def engine_labels(pool: str) -> dict[str, str]:
    """The labels of everything the operator creates for a pool, pods included."""
    return {**selector_labels(pool), MANAGED_BY_LABEL: MANAGED_BY, POOL_LABEL: pool}
