"""Pure functions from a pool, its tenants or the tenant table to the Kubernetes objects the
operator creates: the engine Deployment, the headless Service, the scheduler ConfigMap, and
the gateway's configuration Secret. No API calls, no clock, no randomness: the same input
gives the same objects, byte for byte, which is what makes `fairpool render` a dry run and
the operator's reconciles idempotent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from fairpool.api.common import API_VERSION
from fairpool.api.gateway_config import GatewayConfig
from fairpool.api.inference_pool import InferencePool, ModelSource
from fairpool.api.rendering import engine_arguments, scheduler_config, scheduler_config_document
from fairpool.api.tenant_quota import TenantQuota
from fairpool_operator import contract
from fairpool_operator.config import OperatorConfig
from fairpool_operator.pod_template import merged as pod_template_merged

Manifest = dict[str, Any]

#: Seconds between two startup probes of an engine.
STARTUP_PERIOD = 10

#: The uid an ownerReference carries before the API server has assigned the pool one (only in
#: `fairpool render` of a file; the operator always knows the pool's uid).
UNKNOWN_UID = "<uid of the InferencePool>"


def owner_reference(pool: InferencePool) -> dict[str, Any]:
    """Makes the pool the controller of an object: deleting the pool deletes the object
    (Kubernetes' garbage collector), and `kubectl get -o wide` shows who owns it."""
    uid = (pool.metadata.model_extra or {}).get("uid") or UNKNOWN_UID
    return {
        "apiVersion": API_VERSION,
        "kind": "InferencePool",
        "name": pool.name,
        "uid": str(uid),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pool_objects(
    pool: InferencePool, quotas: Iterable[TenantQuota], config: OperatorConfig
) -> list[Manifest]:
    """Everything one pool needs: scheduler ConfigMap, headless Service, engine Deployment."""
    return [
        scheduler_configmap(pool, quotas, config.namespace),
        engine_service(pool, config.namespace),
        engine_deployment(pool, config),
    ]


def scheduler_configmap(
    pool: InferencePool, quotas: Iterable[TenantQuota], namespace: str
) -> Manifest:
    """The engines' scheduler configuration: the pool's policy and the weights of the
    tenants allowed on it. A weight change rewrites this file and nothing else; the engines
    re-read it and keep running."""
    document = scheduler_config_document(scheduler_config(pool, quotas))
    return finish(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": object_metadata(pool, contract.scheduler_name(pool.name), namespace),
            "data": {contract.SCHEDULER_KEY: yaml.safe_dump(document, sort_keys=True)},
        }
    )


def engine_service(pool: InferencePool, namespace: str) -> Manifest:
    """Headless: its EndpointSlices list every engine pod, which is what the gateway routes
    over (it picks the pod, not kube-proxy)."""
    return finish(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": object_metadata(pool, contract.engine_name(pool.name), namespace),
            "spec": {
                "clusterIP": "None",
                "selector": contract.selector_labels(pool.name),
                "ports": [
                    {
                        "name": contract.PORT_NAME,
                        "port": contract.ENGINE_PORT,
                        "targetPort": contract.PORT_NAME,
                        "protocol": "TCP",
                    }
                ],
            },
        }
    )


def engine_deployment(pool: InferencePool, config: OperatorConfig) -> Manifest:
    """The pool's replicas: `fairpool engine` (vLLM with the fair scheduler) or
    `fairpool engine-sim`, non-root on a read-only root filesystem, ready when /health
    answers, the scheduler configuration mounted as a directory that follows the ConfigMap."""
    spec = pool.spec
    arguments = engine_arguments(
        pool,
        host="0.0.0.0",
        port=contract.ENGINE_PORT,
        scheduler_config=contract.SCHEDULER_PATH,
        model=model_argument(spec.model.source),
    )
    container = engine_container(pool, config, arguments, pod_resources(pool))
    pod_spec = engine_pod_spec(pool, config, container, spec.engine.node_selector)
    return finish(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": object_metadata(pool, contract.engine_name(pool.name), config.namespace),
            "spec": {
                "replicas": spec.replicas,
                "selector": {"matchLabels": contract.selector_labels(pool.name)},
                **_strategy(pool),
                "template": pod_template(pool, contract.engine_labels(pool.name), pod_spec),
            },
        }
    )


def engine_container(
    pool: InferencePool,
    config: OperatorConfig,
    arguments: list[str],
    resources: dict[str, dict[str, Any]],
    env: list[dict[str, Any]] | None = None,
    serves_http: bool = True,
) -> dict[str, Any]:
    """The engine container: `fairpool` with `arguments`, the caches under /tmp, `env`
    after the common variables; with `serves_http` (not a headless pipeline stage) the
    OpenAI port and the readiness probe on /health."""
    spec = pool.spec
    _, mounts = _volumes(pool)
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.engine.image or config.image(spec.engine.kind),
        "command": ["fairpool"],
        "args": arguments,
        "env": [
            {"name": "FAIRPOOL_SCHEDULER_CONFIG", "value": contract.SCHEDULER_PATH},
            # Caches (Hugging Face, vLLM, Triton) go to the writable /tmp.
            {"name": "HOME", "value": "/tmp"},
            {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
            {"name": "HF_HOME", "value": "/tmp/.cache/huggingface"},
            *_untested_vllm(pool),
            *(env or []),
        ],
    }
    if serves_http:
        container["ports"] = [
            {"name": contract.PORT_NAME, "containerPort": contract.ENGINE_PORT, "protocol": "TCP"}
        ]
        health = {"path": contract.HEALTH_PATH, "port": contract.PORT_NAME}
        container["readinessProbe"] = {
            "httpGet": dict(health),  # copies: a shared dict would print as a YAML anchor
            "periodSeconds": 5,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        }
        # Loading a model takes minutes: liveness waits until the engine first answers,
        # for up to the pool's startupSeconds, and then restarts one that stops answering
        # for a minute.
        container["startupProbe"] = {
            "httpGet": dict(health),
            "periodSeconds": STARTUP_PERIOD,
            "timeoutSeconds": 2,
            "failureThreshold": -(-spec.startup_seconds // STARTUP_PERIOD),
        }
        container["livenessProbe"] = {
            "httpGet": dict(health),
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        }
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    container["volumeMounts"] = mounts
    if resources:
        container["resources"] = resources
    return container


def pod_template(
    pool: InferencePool, labels: Mapping[str, str], pod_spec: dict[str, Any]
) -> dict[str, Any]:
    """An engine pod template: the operator's labels and spec laid over the pool's
    `engine.template` (`fairpool_operator.pod_template`)."""
    owned = {"metadata": {"labels": dict(labels)}, "spec": pod_spec}
    return pod_template_merged(owned, pool.spec.engine.template)


def engine_pod_spec(
    pool: InferencePool,
    config: OperatorConfig,
    container: dict[str, Any],
    node_selector: Mapping[str, str],
    affinity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An engine pod: non-root, no service-account token, the pool's volumes and
    tolerations, `node_selector` and `affinity`, the chart's image pull Secrets."""
    volumes, _ = _volumes(pool)
    pod_spec: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": contract.RUN_AS,
            "runAsGroup": contract.RUN_AS,
            "fsGroup": contract.RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,  # engines never talk to the API server
        "containers": [container],
        "volumes": volumes,
    }
    if node_selector:
        pod_spec["nodeSelector"] = dict(sorted(node_selector.items()))
    if pool.spec.engine.tolerations:
        pod_spec["tolerations"] = [dict(toleration) for toleration in pool.spec.engine.tolerations]
    if affinity:
        pod_spec["affinity"] = affinity
    if config.pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in config.pull_secrets]
    return pod_spec


def _untested_vllm(pool: InferencePool) -> list[dict[str, str]]:
    """The engine's override of its vLLM version check, when the pool asks for it."""
    if not pool.spec.engine.allow_untested_vllm:
        return []
    return [{"name": contract.ALLOW_UNTESTED_VLLM_ENV, "value": "1"}]


def _strategy(pool: InferencePool) -> dict[str, Any]:
    """GPU replicas are replaced one at a time without a surge: a rollout then needs no spare
    GPU, which a full GPU pool does not have."""
    if not pool.spec.gpus:
        return {}
    rolling = {"maxSurge": 0, "maxUnavailable": 1}
    return {"strategy": {"type": "RollingUpdate", "rollingUpdate": rolling}}


def model_argument(source: ModelSource | None) -> str | None:
    """What the engine is told to load: the mounted directory, or the hub id."""
    if source is None:
        return None
    return source.hub if source.hub is not None else contract.MODELS_DIR


def gateway_secret(gateway: GatewayConfig, namespace: str, name: str) -> Manifest:
    """The gateway's tenant table and pools, one file in one Secret (key digests only).

    No labels: the Helm chart creates this Secret (so that the gateway can start before the
    operator's first write) and owns its metadata; the operator owns `data` alone."""
    document = gateway.model_dump(mode="json", by_alias=True, exclude_none=True)
    return finish(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": {contract.GATEWAY_KEY: yaml.safe_dump(document, sort_keys=False)},
        }
    )


def finish(manifest: Manifest) -> Manifest:
    """Stamps the object with the digest of its rendering (on its own metadata only)."""
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations[contract.HASH_ANNOTATION] = rendered_hash(manifest)
    return manifest


def rendered_hash(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the object's canonical JSON, its own digest annotation left out."""
    body = json.loads(json.dumps(manifest))
    body.get("metadata", {}).get("annotations", {}).pop(contract.HASH_ANNOTATION, None)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def object_metadata(
    pool: InferencePool, name: str, namespace: str, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**contract.engine_labels(pool.name), **(labels or {})},
        "ownerReferences": [owner_reference(pool)],
    }


def _volumes(pool: InferencePool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "scheduler", "configMap": {"name": contract.scheduler_name(pool.name)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": pool.spec.engine.scratch_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "scheduler", "mountPath": contract.SCHEDULER_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if pool.spec.engine.kind == "vllm":
        # vLLM's workers share tensors through /dev/shm; the runtime's default is 64 MiB.
        shm = {"medium": "Memory", "sizeLimit": pool.spec.engine.shm_size}
        volumes.append({"name": "dshm", "emptyDir": shm})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        source = pool.spec.model.source
        if source is not None and source.path is not None:
            volumes.append(
                {"name": "model", "hostPath": {"path": source.path, "type": "Directory"}}
            )
            mounts.append({"name": "model", "mountPath": contract.MODELS_DIR, "readOnly": True})
        elif source is not None and source.pvc is not None:
            claim = {"claimName": source.pvc.claim_name, "readOnly": True}
            volumes.append({"name": "model", "persistentVolumeClaim": claim})
            mount = {"name": "model", "mountPath": contract.MODELS_DIR, "readOnly": True}
            if source.pvc.sub_path:
                mount["subPath"] = source.pvc.sub_path
            mounts.append(mount)
    return volumes, mounts


def pod_resources(pool: InferencePool, gpus: int | None = None) -> dict[str, dict[str, Any]]:
    """`cpu` and `memory` as requests and limits; GPUs (the pool's, or `gpus`) as limits of
    `gpuResource`; then the pool's own `requests` and `limits`, which win."""
    spec = pool.spec.engine.resources
    gpus = pool.spec.gpus if gpus is None else gpus
    fixed = {name: value for name, value in (("cpu", spec.cpu), ("memory", spec.memory)) if value}
    requests: dict[str, Any] = {**fixed, **spec.requests}
    limits: dict[str, Any] = dict(fixed)
    if gpus:
        limits[spec.gpu_resource] = str(gpus)  # the API returns quantities as strings
    limits.update(spec.limits)
    resources: dict[str, dict[str, Any]] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources
