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
from fairpool.api.inference_pool import InferencePool
from fairpool.api.rendering import engine_arguments, scheduler_config, scheduler_config_document
from fairpool.api.shares import GroupShare
from fairpool.api.tenant_quota import TenantQuota
from fairpool_operator import contract
from fairpool_operator.config import OperatorConfig
from fairpool_operator.pod_template import merged as pod_template_merged

Manifest = dict[str, Any]

#: Seconds between two startup probes of an engine.
STARTUP_PERIOD = 10
#: Seconds a pod's grace period leaves after the drain, for the engine's own shutdown.
DRAIN_SLACK = 30

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
    pool: InferencePool,
    quotas: Iterable[TenantQuota],
    config: OperatorConfig,
    groups: Mapping[str, GroupShare] | None = None,
) -> list[Manifest]:
    """Everything one pool needs: scheduler ConfigMap, headless Service, engine Deployment,
    its disruption budget (and the model cache's claim, when the pool keeps one)."""
    return [
        *model_cache_claims(pool, config.namespace),
        scheduler_configmap(pool, quotas, config.namespace, groups),
        engine_service(pool, config.namespace),
        engine_deployment(pool, config),
        disruption_budget(pool, config.namespace),
    ]


def disruption_budget(pool: InferencePool, namespace: str) -> Manifest:
    """At most one replica of the pool evicted at a time (a node drain, an autoscaler's
    scale-down of nodes): the others keep serving while it restarts elsewhere."""
    return finish(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": object_metadata(pool, contract.engine_name(pool.name), namespace),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": contract.selector_labels(pool.name)},
            },
        }
    )


def model_cache_claims(pool: InferencePool, namespace: str) -> list[Manifest]:
    """The claim the pool's pods share their fetched model in (model.cache.volume: pvc):
    the first pod to start fills it, the others and every restart reuse it. Created once
    and then left alone (a claim's class and mode cannot change); deleted with the pool."""
    uri, cache = pool.spec.model.uri, pool.spec.model.cache
    if pool.spec.engine.kind != "vllm" or uri is None or not uri.fetched or cache.volume != "pvc":
        return []
    spec: dict[str, Any] = {
        "accessModes": [cache.access_mode],
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name is not None:
        spec["storageClassName"] = cache.storage_class_name
    metadata = object_metadata(pool, contract.model_cache_name(pool.name), namespace)
    return [
        finish(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": metadata,
                "spec": spec,
            }
        )
    ]


def scheduler_configmap(
    pool: InferencePool,
    quotas: Iterable[TenantQuota],
    namespace: str,
    groups: Mapping[str, GroupShare] | None = None,
) -> Manifest:
    """The engines' scheduler configuration: the pool's policy and the fair order's tree of
    the tenants allowed on it (weights, the groups on their paths, bands). A weight change
    rewrites this file and nothing else; the engines re-read it and keep running."""
    document = scheduler_config_document(scheduler_config(pool, quotas, groups))
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
        model=model_argument(pool),
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
                # a slow model load or download is not a stalled rollout
                "progressDeadlineSeconds": spec.progress_deadline_seconds,
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
        "image": engine_image(pool, config),
        "command": ["fairpool"],
        "args": arguments,
        "env": [
            {"name": "FAIRPOOL_SCHEDULER_CONFIG", "value": contract.SCHEDULER_PATH},
            # Caches (Hugging Face, vLLM, Triton) go to the writable /tmp.
            {"name": "HOME", "value": "/tmp"},
            {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
            {"name": "HF_HOME", "value": "/tmp/.cache/huggingface"},
            *_vllm_environment(pool),
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
        if spec.engine.drain_seconds:
            drain = ["fairpool", "drain", "--timeout", str(spec.engine.drain_seconds)]
            container["lifecycle"] = {"preStop": {"exec": {"command": drain}}}
    container["securityContext"] = container_security()
    container["volumeMounts"] = mounts
    if resources:
        container["resources"] = resources
    return container


def engine_image(pool: InferencePool, config: OperatorConfig) -> str:
    """The pool's `engine.image`; else the image its pods got for the pool's current model,
    engine and placement (`status.engineImage`): an operator upgrade, which changes the
    default, then restarts no engine, and the next change of what shapes the pods (a
    rollout anyway) takes the new default — scaling and weight changes do not; else the
    operator's default for the engine kind."""
    if pool.spec.engine.image:
        return pool.spec.engine.image
    status = pool.status
    if status is not None and status.engine_image and status.engine_image_spec == pod_shape(pool):
        return status.engine_image
    return config.image(pool.spec.engine.kind)


def pod_shape(pool: InferencePool) -> str:
    """Digest of what shapes a pool's pods, but not their number: model, engine, placement."""
    spec = pool.spec.model_dump(mode="json", by_alias=True)
    shape = {key: spec.get(key) for key in ("model", "engine", "placement")}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def container_security() -> dict[str, Any]:
    """Every engine pod container: non-root, no privileges, a read-only root filesystem."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


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
    if "lifecycle" in container:  # the drain, then vLLM's own shutdown
        pod_spec["terminationGracePeriodSeconds"] = pool.spec.engine.drain_seconds + DRAIN_SLACK
    fetcher = fetch_container(pool, config)
    if fetcher is not None:
        pod_spec["initContainers"] = [fetcher]
    if node_selector:
        pod_spec["nodeSelector"] = dict(sorted(node_selector.items()))
    if pool.spec.engine.tolerations:
        pod_spec["tolerations"] = [dict(toleration) for toleration in pool.spec.engine.tolerations]
    if affinity:
        pod_spec["affinity"] = affinity
    if config.pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in config.pull_secrets]
    return pod_spec


def _vllm_environment(pool: InferencePool) -> list[dict[str, str]]:
    """vLLM never reaches for the Hub (the weights are on a volume already: fetched by the
    init step, or a claim's), and skips its version check when the pool asks."""
    if pool.spec.engine.kind != "vllm":
        return []
    environment = [{"name": "HF_HUB_OFFLINE", "value": "1"}]
    if pool.spec.engine.allow_untested_vllm:
        environment.append({"name": contract.ALLOW_UNTESTED_VLLM_ENV, "value": "1"})
    return environment


def _strategy(pool: InferencePool) -> dict[str, Any]:
    """The rolling update the pool asks for; unset, GPU replicas are replaced one at a time
    without a surge (a rollout then needs no spare GPU, which a full GPU pool does not
    have), others as Kubernetes does (25% and 25%)."""
    rollout = pool.spec.engine.rollout
    gpu = bool(pool.spec.gpus)
    surge = rollout.max_surge if rollout.max_surge is not None else (0 if gpu else None)
    down = rollout.max_unavailable if rollout.max_unavailable is not None else (1 if gpu else None)
    rolling = {
        key: value
        for key, value in (("maxSurge", surge), ("maxUnavailable", down))
        if value is not None
    }
    if not rolling:
        return {}
    return {"strategy": {"type": "RollingUpdate", "rollingUpdate": rolling}}


def model_argument(pool: InferencePool) -> str | None:
    """The directory the engine loads: the claim's, or the fetched source's in the cache."""
    uri = pool.spec.model.uri
    if uri is None:
        return None
    if uri.scheme == "pvc":
        return contract.MODELS_DIR
    if uri.fetched:
        return f"{contract.MODEL_CACHE_DIR}/{uri.cache_name}"
    raise ValueError(f"{uri}: a local path is for fairpool up")  # refused by plan.pool_plans


def fetch_container(pool: InferencePool, config: OperatorConfig) -> dict[str, Any] | None:
    """The init step that fetches an hf, s3 or gs source into the cache volume before the
    engine starts (`fairpool fetch-model`): done at once when the cache holds the weights
    already. A failure's cause (GatedModel, RevisionNotFound, ...) is its termination
    message, which the pool's status reports (`fairpool_operator.model_status`)."""
    uri = pool.spec.model.uri
    if pool.spec.engine.kind != "vllm" or uri is None or not uri.fetched:
        return None
    arguments = ["fetch-model", str(uri), "--cache", contract.MODEL_CACHE_DIR]
    mounts: list[dict[str, Any]] = [
        {"name": "model-cache", "mountPath": contract.MODEL_CACHE_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if pool.spec.model.secret_ref is not None:
        arguments += ["--credentials", contract.MODEL_CREDENTIALS_DIR]
        mounts.append(
            {
                "name": "model-credentials",
                "mountPath": contract.MODEL_CREDENTIALS_DIR,
                "readOnly": True,
            }
        )
    arguments += ["--termination-log", "/dev/termination-log"]
    return {
        "name": contract.FETCH_CONTAINER,
        "image": engine_image(pool, config),
        "command": ["fairpool"],
        "args": arguments,
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(),
        "volumeMounts": mounts,
    }


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
        model_volumes, model_mounts = _model_volumes(pool)
        volumes += model_volumes
        mounts += model_mounts
    return volumes, mounts


def _model_volumes(pool: InferencePool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The weights' volumes, and the engine's read-only mounts of them."""
    uri, model = pool.spec.model.uri, pool.spec.model
    if uri is None:
        return [], []
    if uri.scheme == "pvc":
        claim = {"claimName": uri.location, "readOnly": True}
        mount = {"name": "model", "mountPath": contract.MODELS_DIR, "readOnly": True}
        if uri.path:
            mount["subPath"] = uri.path
        return [{"name": "model", "persistentVolumeClaim": claim}], [mount]
    if model.cache.volume == "pvc":
        cache: dict[str, Any] = {
            "persistentVolumeClaim": {"claimName": contract.model_cache_name(pool.name)}
        }
    else:
        cache = {"emptyDir": {"sizeLimit": model.cache.size}}
    volumes = [{"name": "model-cache", **cache}]
    if model.secret_ref is not None:
        secret = {"secretName": model.secret_ref.name, "defaultMode": 0o440}
        volumes.append({"name": "model-credentials", "secret": secret})
    mount = {"name": "model-cache", "mountPath": contract.MODEL_CACHE_DIR, "readOnly": True}
    return volumes, [mount]


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
