"""The Helm chart (charts/fairpool), checked with a real Helm binary (`make helm` puts one at
.tools/bin/helm): lint --strict, renders with default values and with every option on, every
rendered object against the Kubernetes schemas (kubernetes-validate) or its CRD, the pods'
hardening, the RBAC rules, the operator/gateway contract, values.schema.json refusing bad
values, the dashboard's metric names, and the CRD copies. The examples are checked against
the CRD schemas here too."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from openapi_schema_validator import OAS30Validator
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fairpool.api.gateway_config import GatewayConfig, load_gateway_config
from fairpool.api.manifests import load_manifests
from fairpool_operator.config import GeneratedSecret, OperatorConfig
from fairpool_operator.plan import plan_namespace

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "fairpool"
HELM = ROOT / ".tools" / "bin" / "helm"
RELEASE, NAMESPACE = "fp", "serving"
#: The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest known.
KUBE_VERSIONS = ["1.25.0", kubernetes_validate.latest_version()]

#: On the tests that run Helm; the others (CRD copies, examples, schema files) run without it.
needs_helm = pytest.mark.skipif(
    not HELM.is_file(), reason="no Helm binary at .tools/bin/helm: run `make helm` first"
)

Doc = dict[str, Any]

#: Every option on: Ingress with TLS, ServiceMonitor, PodMonitor, dashboard in another
#: namespace, two replicas of each, pull secrets, extra env, placement.
FULL_VALUES: Doc = {
    "images": {"pullSecrets": ["regcred"], "gateway": {"repository": "r/gw", "tag": "dev"}},
    "operator": {
        "replicas": 2,
        "extraEnv": [{"name": "FAIRPOOL_LOG_LEVEL", "value": "debug"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/team": "platform"},
        "podLabels": {"example.com/tier": "control"},
        "priorityClassName": "system-cluster-critical",
        "serviceAccount": {"create": True, "name": "ops", "annotations": {"a": "b"}},
    },
    "gateway": {
        "replicas": 2,
        "configSecretName": "gw-config",
        "service": {
            "type": "LoadBalancer",
            "port": 80,
            "annotations": {"example.com/lb": "internal"},
        },
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "annotations": {"nginx.ingress.kubernetes.io/proxy-read-timeout": "600"},
            "hosts": [
                {"host": "llm.example.com", "paths": [{"path": "/v1", "pathType": "Prefix"}]}
            ],
            "tls": [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}],
        },
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": "gw"}},
                        },
                    }
                ]
            }
        },
    },
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "podMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    },
    "grafana": {"dashboard": {"enabled": True, "namespace": "monitoring"}},
    "networkPolicy": {
        "tenantFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}},
            {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16"]}},
        ],
        "monitoring": {
            "namespace": "observability",
            "podLabels": {"app.kubernetes.io/name": "prometheus"},
        },
    },
}

# ------------------------------------------------------------------------------- helpers


def helm(
    *args: str, values: Doc | None = None, tmp: Path | None = None
) -> subprocess.CompletedProcess[str]:
    command = [str(HELM), *args]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        command += ["-f", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def render(
    tmp: Path | None = None, values: Doc | None = None, *sets: str, release: str = RELEASE
) -> list[Doc]:
    done = helm(
        "template", release, str(CHART), "--namespace", NAMESPACE, *sets, values=values, tmp=tmp
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [doc for doc in by_kind(docs, kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def closed(schema: Any) -> Any:
    """The schema with unknown fields refused where it lists properties, as `kubectl apply`'s
    strict field validation refuses them (plain JSON-schema validation would accept them)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: closed(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema["additionalProperties"] = False
    return schema


def crd_schemas() -> dict[tuple[str, str], Doc]:
    """(apiVersion, kind) → the served version's openAPIV3Schema, from the chart's crds/."""
    schemas = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version["served"]:
                    schemas[f"{group}/{version['name']}", kind] = version["schema"][
                        "openAPIV3Schema"
                    ]
    return schemas


def crd_errors(doc: Doc, schema: Doc) -> list[str]:
    # apiVersion, kind and metadata are always allowed at the root, listed or not.
    implicit = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}}
    properties = {**implicit, "metadata": {"type": "object"}, **schema.get("properties", {})}
    validator = OAS30Validator(closed({**schema, "properties": properties}))
    return [
        f"{'.'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}"
        for error in validator.iter_errors(doc)
    ]


# The fields of the Prometheus Operator's ServiceMonitor and PodMonitor (monitoring.coreos.com/v1)
# that the chart uses, transcribed from their CRDs (unknown fields refused): their CRDs are
# not part of this repository.
_DURATION = {
    "type": "string",
    "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
    "(([0-9]+)ms)?)$",
}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
}
_ENDPOINT = {
    "type": "object",
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string"},
        "scheme": {"type": "string", "enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "authorization": {
            "type": "object",
            "properties": {
                "type": {"type": "string"},
                "credentials": {
                    "type": "object",
                    "required": ["key"],
                    "properties": {"name": {"type": "string"}, "key": {"type": "string"}},
                },
            },
        },
        "relabelings": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "action": {"type": "string", "enum": ["replace", "keep", "drop", "labelmap"]},
                    "sourceLabels": {
                        "type": "array",
                        "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
                    },
                    "targetLabel": {"type": "string"},
                },
            },
        },
    },
}


def _monitor_schema(endpoints: str, required: list[str]) -> Doc:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": required,
                "properties": {
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": {
                        "type": "object",
                        "properties": {
                            "any": {"type": "boolean"},
                            "matchNames": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    endpoints: {"type": "array", "minItems": 1, "items": _ENDPOINT},
                },
            },
        },
    }


_DURATION: Doc = {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$"}
_STRINGS: Doc = {"type": "object", "additionalProperties": {"type": "string"}}
#: The fields of the Prometheus Operator's PrometheusRule the chart uses (its CRD's, closed).
_PROMETHEUS_RULE: Doc = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": _DURATION,
                                        "labels": _STRINGS,
                                        "annotations": _STRINGS,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}  # fmt: skip

MONITOR_SCHEMAS = {
    ("monitoring.coreos.com/v1", "PrometheusRule"): _PROMETHEUS_RULE,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _monitor_schema(
        "endpoints", ["endpoints", "selector"]
    ),
    ("monitoring.coreos.com/v1", "PodMonitor"): _monitor_schema(
        "podMetricsEndpoints", ["selector"]
    ),
}


@pytest.fixture(scope="module")
def default_docs() -> list[Doc]:
    return render()


@pytest.fixture(scope="module")
def full_docs(tmp_path_factory) -> list[Doc]:
    return render(tmp_path_factory.mktemp("full"), FULL_VALUES)


# ---------------------------------------------------------------------------- lint, render


@needs_helm
def test_lint_strict_passes_with_default_and_full_values(tmp_path):
    for values in (None, FULL_VALUES):
        done = helm("lint", "--strict", str(CHART), values=values, tmp=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "0 chart(s) failed" in done.stdout


@needs_helm
def test_default_render_has_the_operator_gateway_rbac_and_dashboard(default_docs):
    kinds = sorted(f"{doc['kind']}/{doc['metadata']['name']}" for doc in default_docs)
    assert kinds == sorted(
        [
            "ClusterRole/serving-fp-operator-nodes",
            "ClusterRoleBinding/serving-fp-operator-nodes",
            "ConfigMap/fp-dashboard",
            "Deployment/fp-gateway",
            "Deployment/fp-operator",
            "KopfPeering/fairpool",
            "NetworkPolicy/fp-engine-chains",
            "NetworkPolicy/fp-engines",
            "NetworkPolicy/fp-gateway",
            "NetworkPolicy/fp-operator",
            "Role/fp-gateway",
            "Role/fp-operator",
            "RoleBinding/fp-gateway",
            "RoleBinding/fp-operator",
            "Service/fp-gateway",
            "Service/fp-gateway-admin",
            "ServiceAccount/fp-gateway",
            "ServiceAccount/fp-operator",
        ]
    )
    for doc in default_docs:  # namespaced, every one but the right to read Nodes
        if not doc["kind"].startswith("ClusterRole"):
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]


@needs_helm
def test_every_option_on_renders_ingress_monitors_and_two_replicas(full_docs):
    assert {doc["kind"] for doc in full_docs} >= {"Ingress", "ServiceMonitor", "PodMonitor"}
    operator = one(full_docs, "Deployment", "fp-operator")
    assert operator["spec"]["replicas"] == 2
    assert "strategy" not in operator["spec"]  # rolling: the standby pods wait on peering
    assert one(full_docs, "Deployment", "fp-gateway")["spec"]["replicas"] == 2
    dashboard = one(full_docs, "ConfigMap", "fp-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"


@needs_helm
def test_optional_parts_can_be_turned_off(tmp_path):
    docs = render(
        tmp_path,
        None,
        "--set",
        "rbac.create=false,operator.serviceAccount.create=false,grafana.dashboard.enabled=false,"
        "networkPolicy.enabled=false",
    )
    kinds = {doc["kind"] for doc in docs}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "ConfigMap"}
    assert "NetworkPolicy" not in kinds
    assert (
        one(docs, "Deployment", "fp-operator")["spec"]["template"]["spec"]["serviceAccountName"]
        == "default"
    )


@needs_helm
def test_a_long_release_name_still_gives_valid_names(tmp_path):
    release = "a" * 53  # Helm's longest release name
    docs = render(tmp_path, None, release=release)
    for doc in docs:
        name = doc["metadata"]["name"]
        if doc["kind"] in ("Service", "Deployment", "ServiceAccount", "ConfigMap"):
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name
    env = container_env(one(docs, "Deployment", f"{'a' * 49}-operator"))
    admin = one(docs, "Service", f"{'a' * 49}-gateway-admin")["metadata"]["name"]
    assert env["FAIRPOOL_GATEWAY_ADMIN_URL"] == f"http://{admin}.{NAMESPACE}:8081"


def notes(tmp_path: Path) -> str:
    """NOTES.txt as `helm install prod -n llm` prints it (a client-side dry run renders it
    without a cluster, with no kubeconfig at all)."""
    done = subprocess.run(
        [str(HELM), "install", "prod", str(CHART), "-n", "llm", "--dry-run=client"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


@needs_helm
def test_notes_print_the_next_commands_with_the_release_names(tmp_path):
    text = notes(tmp_path)
    assert "kubectl apply -n llm -f examples/cluster.yaml" in text
    assert "kubectl wait -n llm --for=condition=Ready pod" in text
    assert "app.kubernetes.io/instance=prod,app.kubernetes.io/component=gateway" in text
    assert "kubectl port-forward -n llm svc/prod-gateway 8080:8080" in text
    assert "/v1/chat/completions" in text and 'Authorization: Bearer $LIGHT_KEY"' in text
    assert "prod-gateway-admin-token" in text
    example = load_manifests(ROOT / "examples" / "cluster.yaml")
    assert f'"model": "{example.pools[0].spec.model.name}"' in text


def example_keys() -> set[str]:
    """Every API key written in a file of the repository's examples."""
    keys = set()
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for secret in load_manifests(path).secrets.values():
            keys |= {value.strip() for value in secret.values().values()}
    return keys


@needs_helm
def test_notes_create_random_keys_and_never_apply_known_ones(tmp_path):
    text = notes(tmp_path)
    known = example_keys()
    assert known  # local mode's examples still have theirs
    assert not [key for key in known if key in text]
    assert "sk-" not in text.replace('"sk-$(openssl rand -hex 24)"', "")
    # Each tenant the applied example names gets a Secret made here with a random key,
    # labelled as the operator wants it.
    example = load_manifests(ROOT / "examples" / "cluster.yaml")
    assert not example.secrets  # no key in the file
    names = {quota.spec.api_key_secret_ref.name for quota in example.quotas}
    assert names == {"flood-api-keys", "light-api-keys"}
    loop = "for tenant in flood light; do"
    assert loop in text
    for command in (
        'kubectl create secret generic $tenant-api-keys -n llm --from-literal=key="sk-$(openssl '
        'rand -hex 24)"',
        "kubectl label secret $tenant-api-keys -n llm fairpool.io/api-keys=true",
    ):
        assert command in text
    assert "kubectl get secret light-api-keys -n llm -o jsonpath='{.data.key}'" in text


def test_no_example_for_a_cluster_holds_a_key_the_operator_would_read():
    """A key in a file is a known key: the examples meant for a cluster hold no Secret, and
    the local-mode ones hold only Secrets without the label the operator reads keys by."""
    contract = pytest.importorskip("fairpool_operator.contract")
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for name, secret in load_manifests(path).secrets.items():
            labels = secret.metadata.model_dump().get("labels") or {}
            assert contract.API_KEYS_LABEL not in labels, f"{path.name}: Secret {name}"
            assert "Local mode only" in path.read_text(), path.name
    for cluster in ("cluster", "gpu", "tenants-slo", "pipeline"):
        assert not load_manifests(ROOT / "examples" / f"{cluster}.yaml").secrets, cluster


# ------------------------------------------------------------------------- schema validation


def validate_all(docs: list[Doc], version: str) -> None:
    custom = {**crd_schemas(), **MONITOR_SCHEMAS}
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in custom:
            assert crd_errors(doc, custom[key]) == [], key
        else:
            kubernetes_validate.validate(doc, version, strict=True)


@needs_helm
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_rendered_object_validates(default_docs, full_docs, version):
    validate_all(default_docs, version)
    validate_all(full_docs, version)


@needs_helm
def test_validation_would_catch_a_broken_object(default_docs):
    deployment = json.loads(json.dumps(one(default_docs, "Deployment", "fp-gateway")))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUser"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)
    peering = json.loads(json.dumps(one(default_docs, "KopfPeering", "fairpool")))
    peering["spec"] = {"unknown": 1}
    assert crd_errors(peering, crd_schemas()["kopf.dev/v1", "KopfPeering"])


def test_crds_validate_and_the_chart_holds_kopfs_peering_crds():
    names = set()
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd:
                for version in KUBE_VERSIONS:
                    kubernetes_validate.validate(crd, version, strict=True)
                names.add(crd["metadata"]["name"])
    assert {"kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"} <= names
    assert {
        "inferencepools.fairpool.io",
        "tenantquotas.fairpool.io",
        "tenantgroups.fairpool.io",
    } <= names


def test_chart_crds_are_byte_copies_of_the_generated_crds():
    generated = sorted((ROOT / "crds").glob("*.yaml"))
    assert generated, "crds/ holds no CRDs"
    for path in generated:
        copy = CHART / "crds" / path.name
        assert copy.is_file() and copy.read_bytes() == path.read_bytes(), (
            f"charts/fairpool/crds/{path.name} differs from crds/{path.name}: run `make chart`"
        )
    extra = {p.name for p in (CHART / "crds").iterdir()} - {p.name for p in generated}
    assert extra == {"kopf-peering.yaml"}


# ---------------------------------------------------------------------------- pod hardening


def pod_specs(docs: list[Doc]) -> list[Doc]:
    return [doc["spec"]["template"]["spec"] for doc in by_kind(docs, "Deployment")]


@needs_helm
def test_pods_run_as_non_root_with_read_only_root_filesystems(default_docs, full_docs):
    for spec in pod_specs(default_docs) + pod_specs(full_docs):
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        assert "emptyDir" in volumes["tmp"]
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["privileged"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
            assert set(container["resources"]) == {"requests", "limits"}
            assert container["image"].endswith(":0.1.0") or container["image"] == "r/gw:dev"


@needs_helm
def test_root_user_is_refused_by_the_values_schema(tmp_path):
    done = helm("template", "x", str(CHART), "--set", "podSecurity.runAsUser=0")
    assert done.returncode != 0 and "/podSecurity/runAsUser" in done.stderr


# -------------------------------------------------------------------- operator and gateway


def container_env(deployment: Doc) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container.get("env", [])}


@needs_helm
def test_operator_command_and_environment_follow_the_contract(full_docs):
    deployment = one(full_docs, "Deployment", "fp-operator")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "fairpool",
        "operator",
        "--namespace",
        NAMESPACE,
        "--peering",
        "fairpool",
        "--liveness",
        "http://0.0.0.0:8080/healthz",
        "--metrics-port",
        "9090",
        "--log-format",
        "json",
    ]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert container["image"] == "ghcr.io/fairpool/operator:0.1.0"
    env = container_env(deployment)
    admin = one(full_docs, "Service", "fp-gateway-admin")
    assert env["FAIRPOOL_NAMESPACE"] == NAMESPACE
    assert env["FAIRPOOL_ENGINE_IMAGE"] == "ghcr.io/fairpool/engine:0.1.0"
    assert env["FAIRPOOL_ENGINE_SIM_IMAGE"] == "ghcr.io/fairpool/engine-sim:0.1.0"
    assert env["FAIRPOOL_GATEWAY_CONFIG_SECRET"] == "gw-config"
    assert env["FAIRPOOL_GATEWAY_ADMIN_URL"] == f"http://fp-gateway-admin.{NAMESPACE}:8081"
    assert admin["spec"]["ports"] == [
        {"name": "admin", "port": 8081, "targetPort": "admin", "protocol": "TCP"}
    ]
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # kopf's identity
    assert env["FAIRPOOL_LOG_LEVEL"] == "debug"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    peering = one(full_docs, "KopfPeering", "fairpool")
    assert peering["metadata"]["namespace"] == NAMESPACE
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "ops"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    # the engine pods the operator makes pull with the same Secrets
    config = OperatorConfig.from_environment({k: v for k, v in env.items() if isinstance(v, str)})
    assert config.pull_secrets == ("regcred",)


@needs_helm
def test_image_tags_default_to_the_app_version_and_can_be_overridden(tmp_path):
    docs = render(tmp_path, None, "--set", "images.engine.tag=9.9,images.operator.tag=1.2")
    deployment = one(docs, "Deployment", "fp-operator")
    env = container_env(deployment)
    assert env["FAIRPOOL_ENGINE_IMAGE"] == "ghcr.io/fairpool/engine:9.9"
    assert env["FAIRPOOL_ENGINE_SIM_IMAGE"] == "ghcr.io/fairpool/engine-sim:0.1.0"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":1.2")


#: Image name → the Deployment and (for the engines) the operator's variable naming it.
IMAGE_REFERENCES = {
    "operator": ("fp-operator", None),
    "gateway": ("fp-gateway", None),
    "engine": ("fp-operator", "FAIRPOOL_ENGINE_IMAGE"),
    "engine-sim": ("fp-operator", "FAIRPOOL_ENGINE_SIM_IMAGE"),
}


def image_references(docs: list[Doc]) -> dict[str, str]:
    """Every image the chart names, by image name: the two it runs and the two the operator
    passes on to engine pods."""
    found = {}
    for name, (deployment, variable) in IMAGE_REFERENCES.items():
        doc = one(docs, "Deployment", deployment)
        container = doc["spec"]["template"]["spec"]["containers"][0]
        found[name] = container_env(doc)[variable] if variable else container["image"]
    return found


@needs_helm
def test_every_image_defaults_to_ghcr_io_fairpool_at_the_app_version(default_docs):
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert image_references(default_docs) == {
        name: f"ghcr.io/fairpool/{name}:{app_version}" for name in IMAGE_REFERENCES
    }


@needs_helm
def test_the_registry_moves_every_image_but_one_with_its_own_repository(tmp_path):
    docs = render(tmp_path, None, "--set", "images.registry=registry.example/team")
    assert image_references(docs) == {
        name: f"registry.example/team/{name}:0.1.0" for name in IMAGE_REFERENCES
    }
    docs = render(
        tmp_path,
        None,
        "--set",
        "images.registry=registry.example/team,images.gateway.repository=other.example/gw",
    )
    assert image_references(docs)["gateway"] == "other.example/gw:0.1.0"
    assert image_references(docs)["engine"] == "registry.example/team/engine:0.1.0"


@needs_helm
def test_a_digest_pins_the_image_and_the_tag_is_ignored(tmp_path):
    digest = "sha256:" + "0123456789abcdef" * 4
    values = {
        "images": {
            "registry": "registry.example/team",
            "engineSim": {"tag": "ignored", "digest": digest},
            "operator": {"digest": digest},
        }
    }
    found = image_references(render(tmp_path, values))
    assert found["engine-sim"] == f"registry.example/team/engine-sim@{digest}"
    assert found["operator"] == f"registry.example/team/operator@{digest}"
    assert found["gateway"] == "registry.example/team/gateway:0.1.0"


@needs_helm
def test_one_operator_pod_is_replaced_not_rolled(default_docs):
    operator = one(default_docs, "Deployment", "fp-operator")
    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["strategy"] == {"type": "Recreate"}


@needs_helm
def test_gateway_mounts_its_config_secret_and_serves_two_ports(full_docs):
    deployment = one(full_docs, "Deployment", "fp-gateway")
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["command"] == [
        "fairpool",
        "gateway",
        "--config",
        "/etc/fairpool/gateway/gateway.yaml",
        "--drain-seconds",
        "45",
        "--workers",
        "1",
    ]
    assert container["image"] == "r/gw:dev"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert mount == {"name": "config", "mountPath": "/etc/fairpool/gateway", "readOnly": True}
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    assert volume["secret"]["secretName"] == "gw-config"
    assert {(p["name"], p["containerPort"]) for p in container["ports"]} == {
        ("http", 8080),
        ("admin", 8081),
    }
    # Probes go to the admin port, whose connections tenant traffic cannot take.
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    tenant, admin = (
        one(full_docs, "Service", "fp-gateway"),
        one(full_docs, "Service", "fp-gateway-admin"),
    )
    for service in (tenant, admin):
        assert service["spec"]["selector"].items() <= labels.items()
    assert tenant["spec"]["type"] == "LoadBalancer"
    assert tenant["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]
    assert admin["spec"]["type"] == "ClusterIP"


@needs_helm
def test_a_rollout_drains_the_gateway_within_its_grace_period(default_docs, tmp_path):
    spec = one(default_docs, "Deployment", "fp-gateway")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop == ["sleep", "5"]  # the pod leaves the endpoints before SIGTERM
    command = container["command"]
    drain = float(command[command.index("--drain-seconds") + 1])
    grace = spec["terminationGracePeriodSeconds"]
    # preStop, the drain, then up to 5 s for the cut requests to end and 5 s for uvicorn.
    assert 5 + drain + 10 <= grace == 60
    assert drain == GatewayConfig().drain_seconds  # the gateway's own default, too
    docs = render(
        tmp_path,
        {
            "gateway": {
                "shutdown": {
                    "preStopSeconds": 10,
                    "drainSeconds": 280,
                    "terminationGracePeriodSeconds": 300,
                }
            }
        },
    )
    container = one(docs, "Deployment", "fp-gateway")["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[command.index("--drain-seconds") + 1] == "280"
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    done = helm("template", "x", str(CHART), "--set", "gateway.shutdown.drainSeconds=50")
    assert done.returncode != 0
    assert "preStopSeconds (5) + drainSeconds (50) + 10 must not exceed" in done.stderr


@needs_helm
def test_ingress_exposes_the_tenant_api_only(full_docs):
    (ingress,) = by_kind(full_docs, "Ingress")
    backends = [
        path["backend"]["service"]
        for rule in ingress["spec"]["rules"]
        for path in rule["http"]["paths"]
    ]
    assert backends == [{"name": "fp-gateway", "port": {"name": "http"}}]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["rules"][0]["host"] == "llm.example.com"
    assert ingress["spec"]["tls"] == [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}]
    assert "8081" not in yaml.safe_dump(ingress)


@needs_helm
def test_a_renderer_without_a_cluster_renders_the_same_objects_every_time(tmp_path):
    """As Argo CD and Flux render the chart (no `lookup`, a fresh render at every sync):
    the same objects every time, and no Secret at all — the gateway's configuration is the
    operator's to write, and the random ones (admin token, Valkey's password) the operator
    makes when they are missing, so a sync can neither blank nor regenerate them."""
    for values in (None, {"gateway": {"replicas": 3}}, FULL_VALUES):
        first, second = render(tmp_path, values), render(tmp_path, values)
        assert first == second
        assert by_kind(first, "Secret") == []
    templates = ROOT / "charts" / "fairpool" / "templates"
    for template in templates.iterdir():
        text = template.read_text()
        assert "lookup" not in text and "randAlphaNum" not in text, template.name


@needs_helm
def test_the_operator_writes_the_gateways_configuration_where_the_gateway_reads_it(
    default_docs, tmp_path
):
    operator = one(default_docs, "Deployment", "fp-operator")
    gateway = one(default_docs, "Deployment", "fp-gateway")
    name = container_env(operator)["FAIRPOOL_GATEWAY_CONFIG_SECRET"]
    volume = next(
        v
        for v in gateway["spec"]["template"]["spec"]["volumes"]
        if v.get("secret", {}).get("secretName") == name
    )
    assert "optional" not in volume["secret"]  # the gateway waits for the operator's first
    config = OperatorConfig.from_environment(container_env(operator))
    written = plan_namespace([], [], {}, config)
    path = tmp_path / "gateway.yaml"
    path.write_text(written.gateway_secret["stringData"]["gateway.yaml"])
    loaded = load_gateway_config(path)
    assert loaded.pools == [] and loaded.tenants == []
    assert (loaded.listen.port, loaded.admin.port) == (8080, 8081)
    assert loaded.admin.host == "0.0.0.0"  # reachable through the admin Service
    assert loaded.admin.token_file == mounted_token_path(gateway)  # so it wants a token


def mounted_token_path(deployment: Doc) -> str:
    """Where the pod finds the admin token: its mount of the token Secret, and the key."""
    spec = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "admin-token"]
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "admin-token"]
    assert mount["readOnly"] is True and "subPath" not in mount  # a folder: rotation is seen
    assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]
    return f"{mount['mountPath']}/token"


@needs_helm
def test_the_admin_token_is_made_by_the_operator_mounted_and_sent_by_it_and_prometheus(
    default_docs, full_docs, tmp_path
):
    gateway, operator = (
        one(default_docs, "Deployment", f"fp-{name}") for name in ("gateway", "operator")
    )
    config = OperatorConfig.from_environment(container_env(operator))
    assert GeneratedSecret("fp-gateway-admin-token", "token", 48) in config.generated_secrets
    for deployment in (gateway, operator):
        volume = next(
            v
            for v in deployment["spec"]["template"]["spec"]["volumes"]
            if v["name"] == "admin-token"
        )
        assert volume["secret"]["secretName"] == "fp-gateway-admin-token"
        # the operator starts without it (it makes it); the gateway waits for it
        assert volume["secret"].get("optional", False) is (deployment is operator)
    assert container_env(operator)["FAIRPOOL_GATEWAY_ADMIN_TOKEN_FILE"] == mounted_token_path(
        operator
    )
    (monitor,) = by_kind(full_docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "fp-gateway-admin-token", "key": "token"},
    }
    # A Secret of your own instead: nobody makes one and everything names yours.
    docs = render(tmp_path, None, "--set", "gateway.adminToken.existingSecret=my-token")
    operator = one(docs, "Deployment", "fp-operator")
    assert OperatorConfig.from_environment(container_env(operator)).generated_secrets == ()
    for name in ("gateway", "operator"):
        spec = one(docs, "Deployment", f"fp-{name}")["spec"]["template"]["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == "admin-token")
        assert volume["secret"]["secretName"] == "my-token"


@needs_helm
def test_service_monitor_scrapes_the_admin_service(full_docs):
    (monitor,) = by_kind(full_docs, "ServiceMonitor")
    admin = one(full_docs, "Service", "fp-gateway-admin")
    tenant = one(full_docs, "Service", "fp-gateway")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= admin["metadata"]["labels"].items()
    assert not selector.items() <= tenant["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == admin["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    pods = one(full_docs, "PodMonitor", "fp-engines")
    relabel = pods["spec"]["podMetricsEndpoints"][0]["relabelings"][0]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_fairpool_io_pool"]
    assert relabel["targetLabel"] == "pool"


@needs_helm
def test_chart_and_operator_share_the_contract(full_docs, default_docs):
    """The names, paths, ports and labels the operator's code and the chart both rely on."""
    contract = pytest.importorskip("fairpool_operator.contract")
    deployment = one(default_docs, "Deployment", "fp-operator")
    env = container_env(deployment)
    assert {
        contract.NAMESPACE_ENV,
        contract.ENGINE_IMAGE_ENV,
        contract.ENGINE_SIM_IMAGE_ENV,
        contract.GATEWAY_SECRET_ENV,
        contract.GATEWAY_ADMIN_URL_ENV,
        contract.LEADER_WORKER_SET_ENV,
    } <= env.keys()
    assert env[contract.LEADER_WORKER_SET_ENV] == "auto"
    assert env[contract.WATCH_NODES_ENV] == "true"  # rbac.readNodes: it may
    assert env[contract.GATEWAY_SECRET_ENV] == contract.DEFAULT_GATEWAY_SECRET
    assert one(default_docs, "KopfPeering", contract.DEFAULT_PEERING)
    gateway = one(default_docs, "Deployment", "fp-gateway")["spec"]["template"]["spec"]
    (config,) = [v for v in gateway["volumes"] if v["name"] == "config"]
    assert config["secret"]["secretName"] == contract.DEFAULT_GATEWAY_SECRET  # the operator's
    mount = next(m for m in gateway["containers"][0]["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == contract.GATEWAY_DIR and "subPath" not in mount
    command = gateway["containers"][0]["command"]
    assert (
        command[command.index("--config") + 1] == f"{contract.GATEWAY_DIR}/{contract.GATEWAY_KEY}"
    )
    ports = {p["name"]: p["containerPort"] for p in gateway["containers"][0]["ports"]}
    assert ports == {
        "http": contract.GATEWAY_LISTEN["port"],
        "admin": contract.GATEWAY_ADMIN["port"],
    }
    assert env[contract.GATEWAY_ADMIN_URL_ENV].endswith(f":{contract.GATEWAY_ADMIN['port']}")
    assert env[contract.GATEWAY_ADMIN_TOKEN_FILE_ENV] == contract.ADMIN_TOKEN_PATH
    assert contract.GATEWAY_ADMIN["tokenFile"] == contract.ADMIN_TOKEN_PATH
    token_mount = next(
        m for m in gateway["containers"][0]["volumeMounts"] if m["name"] == "admin-token"
    )
    assert token_mount["mountPath"] == contract.ADMIN_TOKEN_DIR
    assert gateway["securityContext"]["runAsUser"] == contract.RUN_AS
    monitor = one(full_docs, "PodMonitor", "fp-engines")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= contract.engine_labels("chat").items()
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == contract.PORT_NAME
    label = re.sub(r"[^a-zA-Z0-9_]", "_", contract.POOL_LABEL)
    assert endpoint["relabelings"][0]["sourceLabels"] == [f"__meta_kubernetes_pod_label_{label}"]


# ------------------------------------------------------------------------ NetworkPolicies


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) selects these labels."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        found = {
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
            "In": labels.get(key) in (values or []),
            "NotIn": labels.get(key) not in (values or []),
        }[operator]
        if not found:
            return False
    return True


@functools.cache
def engine_pods() -> dict[str, tuple[dict[str, str], list[str]]]:
    """Every kind of engine pod the operator renders, from the examples and a placement pool
    as LeaderWorkerSets: name → (labels, container port names)."""
    from fairpool_operator.config import OperatorConfig
    from fairpool_operator.dry_run import render_files
    from fairpool_operator.plan import plan_namespace

    objects = []
    for example in ("local", "gpu", "pipeline"):
        objects += render_files([ROOT / "examples" / f"{example}.yaml"], NAMESPACE, {}).objects
    pipeline = yaml.safe_load((ROOT / "examples" / "pipeline.yaml").read_text())
    pipeline["metadata"]["uid"] = "uid"
    pipeline["spec"]["placement"]["workload"] = {
        "arrivalRate": 1.0,
        "meanInputTokens": 2000,
        "meanOutputTokens": 200,
    }
    lws = OperatorConfig(namespace=NAMESPACE, leader_worker_set=True)
    objects += plan_namespace([pipeline], [], {}, lws).objects
    pods = {}
    for obj in objects:
        spec = obj.get("spec", {})
        templates = {"": spec.get("template")}
        if obj["kind"] == "LeaderWorkerSet":
            group = spec["leaderWorkerTemplate"]
            templates = {"leader": group.get("leaderTemplate"), "worker": group["workerTemplate"]}
        for role, template in templates.items():
            if template is None:
                continue
            ports = [
                port["name"]
                for container in template["spec"]["containers"]
                for port in container.get("ports", [])
            ]
            name = f"{obj['kind']}/{obj['metadata']['name']}/{role}".rstrip("/")
            pods[name] = (template["metadata"]["labels"], ports)
    kinds = {name.split("/")[0] for name in pods}
    assert kinds == {"Deployment", "StatefulSet", "LeaderWorkerSet"}, kinds
    return pods


def pod_labels(docs: list[Doc], deployment: str) -> dict[str, str]:
    return one(docs, "Deployment", deployment)["spec"]["template"]["metadata"]["labels"]


def allowed_from(rule: Doc, labels: dict[str, str], namespace_labels: dict[str, str]) -> bool:
    """Whether an ingress rule admits a pod with `labels` in a namespace with
    `namespace_labels` (a rule without `from` admits anyone)."""
    if "from" not in rule:
        return True
    for peer in rule["from"]:
        if "ipBlock" in peer:
            continue
        if "namespaceSelector" in peer:
            in_namespace = selects(peer["namespaceSelector"], namespace_labels)
        else:
            in_namespace = namespace_labels == {"kubernetes.io/metadata.name": NAMESPACE}
        if in_namespace and selects(peer.get("podSelector", {}), labels):
            return True
    return False


OWN_NAMESPACE = {"kubernetes.io/metadata.name": NAMESPACE}
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}


def rules_on(policy: Doc, port: str) -> list[Doc]:
    return [
        rule
        for rule in policy["spec"].get("ingress", [])
        if "ports" not in rule or any(p["port"] == port for p in rule["ports"])
    ]


def admits(policy: Doc, port: str, labels: dict[str, str], namespace: dict[str, str]) -> bool:
    return any(allowed_from(rule, labels, namespace) for rule in rules_on(policy, port))


@needs_helm
def test_engines_accept_only_the_gateway_and_the_monitoring_namespace(default_docs):
    policy = one(default_docs, "NetworkPolicy", "fp-engines")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    gateway, operator = (
        pod_labels(default_docs, "fp-gateway"),
        pod_labels(default_docs, "fp-operator"),
    )
    pods = engine_pods()
    for name, (labels, ports) in pods.items():
        assert selects(policy["spec"]["podSelector"], labels), name
        assert {
            rule_port["port"] for rule in policy["spec"]["ingress"] for rule_port in rule["ports"]
        } == {"http"}
        if "http" in ports:
            assert admits(policy, "http", gateway, OWN_NAMESPACE), name
            assert admits(policy, "http", {"app": "prometheus"}, MONITORING), name
        for stranger in (operator, {"app": "curl"}, labels):
            assert not admits(policy, "http", stranger, OWN_NAMESPACE), (name, stranger)
        assert not admits(policy, "http", gateway, {"kubernetes.io/metadata.name": "other"})
    assert not selects(policy["spec"]["podSelector"], gateway)


@needs_helm
def test_only_chain_stages_reach_each_other_on_any_port(default_docs):
    policy = one(default_docs, "NetworkPolicy", "fp-engine-chains")
    pods = engine_pods()
    chains = {name: labels for name, (labels, _) in pods.items() if "fairpool.io/chain" in labels}
    plain = {name: labels for name, (labels, _) in pods.items() if name not in chains}
    assert {name.split("/")[0] for name in chains} == {"StatefulSet", "LeaderWorkerSet"}
    assert {name.split("/")[0] for name in plain} == {"Deployment"}
    (rule,) = policy["spec"]["ingress"]
    assert "ports" not in rule  # any port: the rendezvous, NCCL/Gloo
    for name, labels in chains.items():
        assert selects(policy["spec"]["podSelector"], labels), name
        assert all(allowed_from(rule, other, OWN_NAMESPACE) for other in chains.values())
    for name, labels in plain.items():
        assert not selects(policy["spec"]["podSelector"], labels), name
        assert not allowed_from(rule, labels, OWN_NAMESPACE), name
    assert not allowed_from(rule, pod_labels(default_docs, "fp-gateway"), OWN_NAMESPACE)


@needs_helm
def test_the_admin_port_is_for_the_operator_and_monitoring_and_the_tenant_port_for_all(
    default_docs, full_docs
):
    policy = one(default_docs, "NetworkPolicy", "fp-gateway")
    gateway, operator = (
        pod_labels(default_docs, "fp-gateway"),
        pod_labels(default_docs, "fp-operator"),
    )
    assert selects(policy["spec"]["podSelector"], gateway)
    assert not selects(policy["spec"]["podSelector"], operator)
    container = one(default_docs, "Deployment", "fp-gateway")["spec"]["template"]["spec"][
        "containers"
    ][0]
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert ports == {port["name"] for port in container["ports"]} == {"http", "admin"}
    anyone = {"app": "anything"}
    assert admits(policy, "http", anyone, {"kubernetes.io/metadata.name": "elsewhere"})
    assert admits(policy, "admin", operator, OWN_NAMESPACE)
    assert admits(policy, "admin", {"app": "prometheus"}, MONITORING)
    assert not admits(policy, "admin", anyone, OWN_NAMESPACE)
    assert not admits(policy, "admin", anyone, {"kubernetes.io/metadata.name": "elsewhere"})
    assert not admits(policy, "admin", gateway, OWN_NAMESPACE)
    # Narrowed: the tenant port from the ingress namespace and a CIDR, Prometheus by label.
    narrowed = one(full_docs, "NetworkPolicy", "fp-gateway")
    assert rules_on(narrowed, "http")[0]["from"] == FULL_VALUES["networkPolicy"]["tenantFrom"]
    assert not admits(narrowed, "http", anyone, OWN_NAMESPACE)
    assert admits(narrowed, "http", anyone, {"kubernetes.io/metadata.name": "ingress"})
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    for name in ("fp-gateway", "fp-engines"):
        narrowed = one(full_docs, "NetworkPolicy", name)
        port = "admin" if name == "fp-gateway" else "http"
        observability = {"kubernetes.io/metadata.name": "observability"}
        assert admits(narrowed, port, prometheus, observability)
        assert not admits(narrowed, port, {"app": "grafana"}, observability)
        assert not admits(narrowed, port, prometheus, MONITORING)


@needs_helm
def test_the_operator_takes_only_prometheus_on_its_metrics_port(default_docs, full_docs):
    policy = one(default_docs, "NetworkPolicy", "fp-operator")
    assert selects(policy["spec"]["podSelector"], pod_labels(default_docs, "fp-operator"))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = {port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]}
    assert ports == {"metrics"}
    assert admits(policy, "metrics", {"app": "prometheus"}, MONITORING)
    gateway = pod_labels(default_docs, "fp-gateway")
    assert not admits(policy, "metrics", gateway, OWN_NAMESPACE)
    monitor = one(full_docs, "PodMonitor", "fp-operator")
    assert selects(monitor["spec"]["selector"], pod_labels(full_docs, "fp-operator"))
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


# ------------------------------------------------------------------------------------ RBAC


def rules(docs: list[Doc], kind: str, name: str) -> list[tuple[str, str, str, str]]:
    """(group, resource, verb, resourceName) tuples, so that the order does not matter."""
    return sorted(
        (group, resource, verb, name)
        for rule in one(docs, kind, name)["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames", ["*"])
    )


def expand(*entries: tuple[str, list[str], list[str]] | tuple[str, list[str], list[str], str]):
    return sorted(
        (group, resource, verb, entry[3] if len(entry) == 4 else "*")
        for entry in entries
        for group in [entry[0]]
        for resource in entry[1]
        for verb in entry[2]
    )


@needs_helm
def test_operator_role_is_exactly_the_contract(default_docs):
    crud = ["get", "list", "watch", "create", "patch", "update", "delete"]
    assert rules(default_docs, "Role", "fp-operator") == expand(
        (
            "fairpool.io",
            ["inferencepools", "tenantquotas", "tenantgroups"],
            ["get", "list", "watch", "patch", "update"],
        ),
        (
            "fairpool.io",
            ["inferencepools/status", "tenantquotas/status", "tenantgroups/status"],
            ["get", "patch", "update"],
        ),
        ("fairpool.io", ["inferencepools/finalizers"], ["update"]),
        ("apps", ["deployments"], crud),
        ("apps", ["statefulsets"], crud),
        ("leaderworkerset.x-k8s.io", ["leaderworkersets"], crud),
        ("", ["services", "configmaps"], crud),
        ("", ["persistentvolumeclaims"], ["get", "list", "watch", "create"]),
        ("policy", ["poddisruptionbudgets"], crud),
        ("", ["secrets"], ["get", "list", "watch", "create"]),
        ("", ["secrets"], ["patch", "update"], "fairpool-gateway-config"),
        ("", ["pods"], ["get", "list", "watch"]),
        ("", ["events"], ["create", "patch"]),
        ("kopf.dev", ["kopfpeerings"], ["get", "list", "watch", "patch"]),
    )


@needs_helm
def test_the_only_cluster_wide_right_is_reading_nodes(default_docs, full_docs, tmp_path):
    # kopf's cluster discovery is off; placement discovery reads Nodes, nothing else.
    for docs in (default_docs, full_docs):
        (role,) = by_kind(docs, "ClusterRole")
        assert rules(docs, "ClusterRole", role["metadata"]["name"]) == expand(
            ("", ["nodes"], ["get", "list", "watch"])
        )
        (binding,) = by_kind(docs, "ClusterRoleBinding")
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    docs = render(tmp_path, None, "--set", "rbac.readNodes=false")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")


@needs_helm
def test_gateway_role_only_watches_endpointslices(default_docs):
    assert rules(default_docs, "Role", "fp-gateway") == expand(
        ("discovery.k8s.io", ["endpointslices"], ["list", "watch"])
    )


@needs_helm
def test_no_wildcards_and_bindings_name_the_right_accounts(full_docs):
    for doc in by_kind(full_docs, "Role"):
        for rule in doc["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
    accounts = {doc["metadata"]["name"] for doc in by_kind(full_docs, "ServiceAccount")}
    assert accounts == {"ops", "fp-gateway"}
    for doc in by_kind(full_docs, "RoleBinding"):
        role = one(full_docs, doc["roleRef"]["kind"], doc["roleRef"]["name"])
        (subject,) = doc["subjects"]
        assert subject["namespace"] == NAMESPACE and subject["name"] in accounts
        component = role["metadata"]["labels"]["app.kubernetes.io/component"]
        assert subject["name"] == {"operator": "ops", "gateway": "fp-gateway"}[component]
    role = one(full_docs, "Role", "fp-operator")
    assert ["gw-config"] in [rule.get("resourceNames") for rule in role["rules"]]


# ------------------------------------------------------------------------ values.schema.json


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("gateway.replicas=two", "/gateway/replicas"),
        ("operator.replicas=-1", "/operator/replicas"),
        ("images.pullPolicy=Sometimes", "/images/pullPolicy"),
        ("gateway.service.port=70000", "/gateway/service/port"),
        ("gateway.service.type=Magic", "/gateway/service/type"),
        ("gateway.unknown=1", "/gateway"),
        ("metrics.serviceMonitor.interval=soon", "/metrics/serviceMonitor/interval"),
        ("metrics.serviceMonitor.enabled=maybe", "/metrics/serviceMonitor/enabled"),
        ("gateway.configSecretName=Bad_Name", "/gateway/configSecretName"),
        ("operator.leaderWorkerSet=maybe", "/operator/leaderWorkerSet"),
        ("gateway.ingress.hosts[0].paths[0].pathType=Any", "/gateway/ingress/hosts/0/paths/0"),
        ("operator.resources.limits.cpu=lots", "/operator/resources/limits/cpu"),
        ("images.registry=", "/images/registry"),
        ("images.registry=ghcr.io/fairpool/", "/images/registry"),
        ("images.engine.digest=sha256:abc", "/images/engine/digest"),
        ("images.gateway.repository=r/gw:dev", "/images/gateway/repository"),
        ("gateway.sharedState.keyPrefix=a:b", "/gateway/sharedState/keyPrefix"),
        ("gateway.sharedState.keyPrefix=*", "/gateway/sharedState/keyPrefix"),
        ("gateway.sharedState.username=a b", "/gateway/sharedState/username"),
    ],
)
@needs_helm
def test_values_schema_refuses_bad_values(setting, field):
    done = helm("template", "x", str(CHART), "--set", setting)
    assert done.returncode != 0, setting
    assert field in done.stderr, done.stderr
    lint = helm("lint", "--strict", str(CHART), "--set", setting)
    assert lint.returncode != 0, setting


def test_values_schema_is_complete():
    """Every value in values.yaml is described by the schema (type given, no open object
    without a reason), and the schema refuses unknown keys at every level it describes."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: Doc, path: str) -> None:
        assert "type" in node or "oneOf" in node, path
        if isinstance(value, dict) and "properties" in node:
            assert node.get("additionalProperties") is False, path
            for key, item in value.items():
                assert key in node["properties"], f"{path}.{key} has no schema"
                walk(item, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "values")


# -------------------------------------------------------------------------------- dashboard


def known_metric_names() -> set[str]:
    from fairpool_engine.sim.metrics import EngineMetrics
    from fairpool_gateway.fleet_shares import FleetShares
    from fairpool_gateway.metrics import GatewayMetrics
    from fairpool_operator import metrics as operator_metrics

    gateway = GatewayMetrics()
    gateway.add_state(lambda: iter(()), lambda: iter(()), lambda: iter(()), lambda: iter(()))
    engine = CollectorRegistry()
    EngineMetrics("model", registry=engine)
    operator = CollectorRegistry()
    for collector in vars(operator_metrics).values():
        if isinstance(collector, (Counter, Gauge, Histogram)):
            operator.register(collector)
    operator.register(FleetShares(None, dict, dict))  # type: ignore[arg-type]  (several replicas)
    suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"]}
    return {
        family.name + suffix
        for registry in (gateway.registry, engine, operator)
        for family in registry.collect()
        for suffix in suffixes[family.type]
    }


@needs_helm
def test_dashboard_configmap_holds_the_dashboard_and_its_metrics_exist(default_docs):
    configmap = one(default_docs, "ConfigMap", "fp-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    text = (CHART / "dashboards" / "fairpool.json").read_text()
    assert configmap["data"]["fairpool.json"] == text.rstrip("\n")
    dashboard = json.loads(text)
    assert dashboard["uid"] == "fairpool"
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    assert all(panel["targets"] for panel in panels)
    used = {
        name
        for expr in exprs
        for name in re.findall(r"\b((?:fairpool_|vllm:)[a-zA-Z0-9_:]+)", expr)
    }
    assert used <= known_metric_names(), used - known_metric_names()
    for needed in (
        "fairpool_gateway_service_total",
        "fairpool_gateway_time_to_first_token_seconds_bucket",
        "fairpool_gateway_request_duration_seconds_bucket",
        "fairpool_gateway_deficit",
        "fairpool_gateway_queued",
        "fairpool_gateway_worker_healthy",
        "fairpool_gateway_rejections_total",
        "fairpool_engine_tenant_service_total",
        "vllm:kv_cache_usage_perc",
    ):
        assert needed in used, needed
    for expr in exprs:  # balanced brackets, at least
        for left, right in ("()", "{}", "[]"):
            assert expr.count(left) == expr.count(right), expr
    titles = " ".join(panel["title"] for panel in panels)
    for word in ("share", "first token", "deficits", "rotation", "Rejections"):
        assert word in titles, word


# -------------------------------------------------------------------------------- examples


EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_examples_load_and_validate_against_the_crds(path):
    load_manifests(path)  # the models accept them (what `fairpool up` and the operator read)
    schemas = crd_schemas()
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        key = (doc["apiVersion"], doc["kind"])
        if key in schemas:
            assert crd_errors(doc, schemas[key]) == [], (path.name, doc["metadata"]["name"])
        else:
            kubernetes_validate.validate(doc, KUBE_VERSIONS[-1], strict=True)


def secrets_made_by_the_comments(path: Path) -> set[str]:
    """The key Secrets an example's header tells you to create (a shell loop over tenants,
    `kubectl create secret generic $tenant-SUFFIX` with a random key, then the label)."""
    text = path.read_text()
    loop = re.search(r"for (\w+) in ([\w -]+); do", text)
    assert loop, path.name
    variable, items = loop.group(1), loop.group(2).split()
    create = re.search(rf"kubectl create secret generic \${variable}(-[\w-]+) ", text)
    assert create, path.name
    assert '--from-literal=key="sk-$(openssl rand -hex 24)"' in text, path.name
    assert f"kubectl label secret ${variable}{create.group(1)} " in text, path.name
    assert "fairpool.io/api-keys=true" in text, path.name
    return {f"{item}{create.group(1)}" for item in items}


def test_the_kubernetes_examples_name_key_secrets_their_comments_make_with_random_keys():
    gpu = load_manifests(ROOT / "examples" / "gpu.yaml")
    (pool,) = gpu.pools
    assert pool.spec.engine.kind == "vllm" and pool.spec.engine.resources.gpus == 1
    uri, reference = pool.spec.model.uri, pool.spec.model.secret_ref
    assert uri is not None and uri.scheme == "hf" and reference is not None
    token = re.search(
        rf"kubectl create secret generic {reference.name} .*--from-literal=(\w+)=",
        (ROOT / "examples" / "gpu.yaml").read_text(),
    )
    assert token and token.group(1) == "HF_TOKEN"  # what the comment makes is what is read
    assert len(gpu.quotas) == 2
    for example, tenants in (("gpu", 2), ("tenants-slo", 4), ("cluster", 2)):
        path = ROOT / "examples" / f"{example}.yaml"
        quotas = load_manifests(path).quotas
        named = {q.spec.api_key_secret_ref.name for q in quotas if q.spec.api_key_secret_ref}
        assert len(named) == len(quotas) == tenants
        assert named == secrets_made_by_the_comments(path), example
    # Local mode's examples keep keys of their own, for the same tenants.
    local, cluster = (load_manifests(ROOT / "examples" / f"{n}.yaml") for n in ("local", "cluster"))
    assert [q.tenant for q in local.quotas] == [q.tenant for q in cluster.quotas]
    assert local.pools[0].spec == cluster.pools[0].spec
    slo_keys = load_manifests(ROOT / "examples" / "tenants-slo-keys.yaml").secrets
    slo_names = secrets_made_by_the_comments(ROOT / "examples" / "tenants-slo.yaml")
    assert set(slo_keys) == slo_names
    slo = load_manifests(ROOT / "examples" / "tenants-slo.yaml")
    classes = {quota.tenant: quota.spec.slo for quota in slo.quotas}
    assert classes["chat"].slo_class == "interactive"
    assert classes["chat"].ttft_seconds and classes["chat"].tbt_seconds
    assert classes["batch"].slo_class == "batch"
    # two organisations, one with two teams: every tenant in a group, every group in the tree
    parents = {group.name: group.spec.parent for group in slo.groups}
    assert parents == {
        "acme": None,
        "acme-support": "acme",
        "acme-research": "acme",
        "globex": None,
    }
    assert {quota.spec.group for quota in slo.quotas} <= set(parents)
    assert slo.pools[0].spec.scheduler.bands.batch.min_share == 0.05


def test_a_bad_example_is_caught_by_the_crd_schema():
    schema = crd_schemas()["fairpool.io/v1alpha1", "TenantQuota"]
    bad = {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "TenantQuota",
        "metadata": {"name": "x"},
        "spec": {"weight": -1, "limitz": {}},
    }
    errors = crd_errors(bad, schema)
    assert any(error.startswith("spec.weight") for error in errors)
    assert any("limitz" in error for error in errors)


# ------------------------------------------------------------------------------- fetch_helm


@needs_helm
def test_fetch_helm_is_idempotent():
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "fetch_helm.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "already there" in done.stdout
    version = subprocess.run([str(HELM), "version", "--short"], capture_output=True, text=True)
    assert version.stdout.startswith("v4.")


# --------------------------------------------------------------------- several gateway pods


def env_of(deployment: Doc) -> dict[str, str]:
    return {
        item["name"]: item.get("value", "")
        for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }


def mounts_of(deployment: Doc) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}


@needs_helm
def test_several_gateway_pods_share_state_in_a_bundled_valkey(tmp_path):
    docs = render(tmp_path, {"gateway": {"replicas": 3}})
    valkey = one(docs, "StatefulSet", "fp-shared-state")
    container = valkey["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("docker.io/valkey/valkey:")
    # the default user off; the gateways' own, its password's hash from the environment
    assert "--user default off" in container["command"][-1]
    assert '--user $GATEWAY_ACL "#$hash"' in container["command"][-1]
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {
        "name": "fp-shared-state",
        "key": "password",
    }
    rule = env_of(valkey)["GATEWAY_ACL"]
    assert rule.startswith("fairpool-gateway on resetkeys resetchannels ~serving.fp:* ")
    assert "&serving.fp:* -@all +" in rule and "@" not in rule.split("-@all")[1]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert one(docs, "Service", "fp-shared-state")["spec"]["ports"][0]["port"] == 6379
    config = OperatorConfig.from_environment(container_env(one(docs, "Deployment", "fp-operator")))
    assert GeneratedSecret("fp-shared-state", "password", 40) in config.generated_secrets
    policy = one(docs, "NetworkPolicy", "fp-shared-state")
    assert (
        policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"][
            "app.kubernetes.io/component"
        ]
        == "gateway"
    )
    pdb = one(docs, "PodDisruptionBudget", "fp-gateway")
    assert pdb["spec"]["minAvailable"] == 1
    # the operator writes sharedState into gateway.yaml; the gateways get the password file
    operator = env_of(one(docs, "Deployment", "fp-operator"))
    assert operator["FAIRPOOL_GATEWAY_SHARED_STATE_URL"] == "redis://fp-shared-state.serving:6379/0"
    assert operator["FAIRPOOL_GATEWAY_REPLICAS"] == "3"
    assert operator["FAIRPOOL_GATEWAY_SHARED_STATE_PASSWORD"] == "true"
    assert operator["FAIRPOOL_GATEWAY_SHARED_STATE_USERNAME"] == "fairpool-gateway"
    assert operator["FAIRPOOL_GATEWAY_SHARED_STATE_KEY_PREFIX"] == "serving.fp"
    gateway = one(docs, "Deployment", "fp-gateway")
    assert gateway["spec"]["replicas"] == 3
    contract = pytest.importorskip("fairpool_operator.contract")
    assert mounts_of(gateway)["shared-state"] + "/password" == contract.SHARED_STATE_PASSWORD_PATH
    for version in KUBE_VERSIONS:
        validate_all(docs, version)


@needs_helm
def test_several_gateway_pods_with_an_external_server_and_one_pod_with_none(tmp_path):
    url = "rediss://cache.internal:6380/2"
    docs = render(tmp_path, {"gateway": {"replicas": 2, "sharedState": {"url": url}}})
    assert not by_kind(docs, "StatefulSet")
    operator = env_of(one(docs, "Deployment", "fp-operator"))
    assert operator["FAIRPOOL_GATEWAY_SHARED_STATE_URL"] == url
    assert operator["FAIRPOOL_GATEWAY_SHARED_STATE_PASSWORD"] == "false"
    assert "FAIRPOOL_GATEWAY_SHARED_STATE_USERNAME" not in operator  # the default user
    assert operator["FAIRPOOL_GATEWAY_SHARED_STATE_KEY_PREFIX"] == "serving.fp"
    assert "shared-state" not in mounts_of(one(docs, "Deployment", "fp-gateway"))
    own = {"url": url, "existingSecret": "cache-auth", "username": "llm", "keyPrefix": "prod"}
    with_user = render(tmp_path, {"gateway": {"replicas": 2, "sharedState": own}})
    operator = env_of(one(with_user, "Deployment", "fp-operator"))
    assert operator["FAIRPOOL_GATEWAY_SHARED_STATE_USERNAME"] == "llm"
    assert operator["FAIRPOOL_GATEWAY_SHARED_STATE_KEY_PREFIX"] == "prod"
    without = {"gateway": {"replicas": 2, "sharedState": {"url": url, "username": "llm"}}}
    no_password = helm("template", RELEASE, str(CHART), values=without, tmp=tmp_path)
    assert no_password.returncode != 0
    assert "gateway.sharedState.username" in no_password.stderr
    assert "existingSecret" in no_password.stderr
    assert by_kind(docs, "PodDisruptionBudget")
    single = render(tmp_path, {"gateway": {"replicas": 1}})
    assert not by_kind(single, "StatefulSet") and not by_kind(single, "PodDisruptionBudget")
    assert "FAIRPOOL_GATEWAY_SHARED_STATE_URL" not in env_of(
        one(single, "Deployment", "fp-operator")
    )


@needs_helm
def test_several_gateway_processes_a_pod_share_state_without_a_budget(tmp_path):
    docs = render(tmp_path, {"gateway": {"workers": 3}})
    gateway = one(docs, "Deployment", "fp-gateway")
    command = gateway["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--workers") + 1] == "3"
    assert one(docs, "StatefulSet", "fp-shared-state")  # the processes count limits together
    operator = env_of(one(docs, "Deployment", "fp-operator"))
    assert operator["FAIRPOOL_GATEWAY_REPLICAS"] == "1"  # pods; each process multiplies it
    assert not by_kind(docs, "PodDisruptionBudget")  # one pod: a budget would block drains
    for version in KUBE_VERSIONS:
        validate_all(docs, version)


# ------------------------------------------------------------------------------------ alerts


@needs_helm
def test_the_alerts_parse_as_promql_and_query_metrics_that_exist(full_docs):
    promql = pytest.importorskip("promql_parser", reason="promql-parser (x86-64 wheels only)")
    (rule,) = by_kind(full_docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    alerts = {item["alert"]: item for group in rule["spec"]["groups"] for item in group["rules"]}
    assert set(alerts) == {
        "FairpoolTenantStarved",
        "FairpoolTenantBelowShare",
        "FairpoolGatewayErrors",
        "FairpoolPoolWithoutEngines",
        "FairpoolKVCacheSaturated",
        "FairpoolRejectionsSpiking",
        "FairpoolOperatorRefusedObjects",
        "FairpoolOperatorReconcileErrors",
    }
    known = known_metric_names()
    for name, alert in alerts.items():
        promql.parse(alert["expr"])  # raises on anything Prometheus would refuse
        used = set(re.findall(r"\b((?:fairpool_|vllm:)[a-zA-Z0-9_:]+)", alert["expr"]))
        assert used and used <= known, (name, used - known)
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert "{{ $labels" in alert["annotations"]["summary"] or "operator" in name.lower()
    # worker counts per gateway replica, never summed over replicas
    assert "by (pool, instance)" in alerts["FairpoolPoolWithoutEngines"]["expr"]


# ------------------------------------------------------------------------ Gateway API, Ingress

GATEWAY_API = ROOT / "tools" / "gateway-api"


def gateway_api_errors(obj: Doc, tmp_path: Path) -> str | None:
    """What the Gateway API's own schemas say of `obj` (None: valid); skipped without
    them (make gateway-api-schemas)."""
    node = shutil.which("node")
    if node is None or not (GATEWAY_API / "node_modules" / "@kubernetes-models").exists():
        pytest.skip("the Gateway API's schemas are not installed (make gateway-api-schemas)")
    path = tmp_path / f"{obj['kind']}.json"
    path.write_text(json.dumps(obj))
    done = subprocess.run(
        [node, str(GATEWAY_API / "validate.mjs"), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout.strip() or None if done.returncode else None


@needs_helm
def test_an_httproute_exposes_the_tenant_api_through_the_clusters_gateway(tmp_path):
    values = {
        "gateway": {
            "httpRoute": {
                "enabled": True,
                "parentRefs": [{"name": "public", "namespace": "gateways"}],
                "hostnames": ["llm.example.com"],
            }
        }
    }
    docs = render(tmp_path, values)
    route = one(docs, "HTTPRoute", "fp-gateway")
    assert gateway_api_errors(route, tmp_path) is None
    service = one(docs, "Service", "fp-gateway")
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"] == service["spec"]["ports"][0]["port"] == 8080  # never the admin
    assert rule["timeouts"] == {"request": "0s"}  # a stream lasts as long as its generation
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "gateways"}]
    broken = dict(route, spec={**route["spec"], "rules": [{"backendRefs": [{"port": "http"}]}]})
    assert "port must be integer" in (gateway_api_errors(broken, tmp_path) or "")
    refused = helm(
        "template", RELEASE, str(CHART), "--set", "gateway.httpRoute.enabled=true", tmp=tmp_path
    )
    assert refused.returncode != 0 and "gateway.httpRoute.parentRefs" in refused.stderr
    assert not by_kind(render(tmp_path), "HTTPRoute")


@needs_helm
def test_an_nginx_ingress_streams_answers_unbuffered_unless_told_otherwise(tmp_path):
    nginx = {"gateway": {"ingress": {"enabled": True, "className": "nginx"}}}
    annotations = one(render(tmp_path, nginx), "Ingress", "fp-gateway")["metadata"]["annotations"]
    assert annotations == {
        "nginx.ingress.kubernetes.io/proxy-buffering": "off",
        "nginx.ingress.kubernetes.io/proxy-read-timeout": "3600",
        "nginx.ingress.kubernetes.io/proxy-send-timeout": "3600",
    }
    mine = {"nginx.ingress.kubernetes.io/proxy-read-timeout": "600"}
    nginx["gateway"]["ingress"]["annotations"] = mine
    told = one(render(tmp_path, nginx), "Ingress", "fp-gateway")["metadata"]["annotations"]
    assert told["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "600"
    other = {"gateway": {"ingress": {"enabled": True, "className": "traefik"}}}
    assert "annotations" not in one(render(tmp_path, other), "Ingress", "fp-gateway")["metadata"]


@needs_helm
def test_the_monitors_come_with_the_dashboard_where_the_cluster_serves_their_api(tmp_path):
    """auto (the default): rendered when the cluster serves the Prometheus Operator's API
    (as `helm install` and Argo CD see it; `--api-versions` for `helm template`)."""
    monitors = {"ServiceMonitor", "PodMonitor"}
    assert not [doc for doc in render(tmp_path) if doc["kind"] in monitors]
    served = ("--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")
    served += ("--api-versions", "monitoring.coreos.com/v1/PodMonitor")
    kinds = {doc["kind"] for doc in render(tmp_path, None, *served)}
    assert monitors <= kinds
    off = {"metrics": {"serviceMonitor": {"enabled": False}, "podMonitor": {"enabled": False}}}
    assert not {doc["kind"] for doc in render(tmp_path, off, *served)} & monitors


@needs_helm
def test_the_dashboards_queries_parse_and_count_per_gateway_replica(default_docs):
    promql = pytest.importorskip("promql_parser", reason="promql-parser (x86-64 wheels only)")
    dashboard = json.loads((CHART / "dashboards" / "fairpool.json").read_text())
    grafana = {"$__rate_interval": "5m", "$__range": "1h", "$pool": ".*", "$tenant": ".*"}
    by_title = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in grafana.items():
                expr = expr.replace(variable, value)
            promql.parse(expr)
            by_title.setdefault(panel["title"], []).append(target["expr"])
    for title in ("Workers in rotation", "Workers known"):
        (expr,) = by_title[title]
        assert expr.startswith("max by (pool) (") and "by (pool, instance)" in expr, title
    (jain,) = by_title["Jain's index (service per weight)"]
    assert "fairpool_gateway_queued" in jain and "fairpool_gateway_in_flight" in jain  # active


# ------------------------------------------------------------------------------- autoscaling

#: The fields of KEDA's ScaledObject (keda.sh/v1alpha1) the chart uses (its CRD's, closed).
_SCALED_OBJECT: Doc = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                    },
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "triggers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "metadata": _STRINGS,
                        },
                    },
                },
            },
        }
    },
}


@needs_helm
def test_keda_scales_pools_through_their_scale_subresource_on_what_waits(tmp_path):
    promql = pytest.importorskip("promql_parser", reason="promql-parser (x86-64 wheels only)")
    values = {
        "autoscaling": {
            "keda": {"prometheusAddress": "http://prometheus-operated.monitoring:9090"},
            "pools": [
                {"pool": "chat", "minReplicas": 0, "maxReplicas": 8, "kvCacheUsage": 0.85},
                {"pool": "code", "maxReplicas": 3},
            ],
        }
    }
    docs = render(tmp_path, values)
    chat, code = (one(docs, "ScaledObject", f"{name}-engines") for name in ("chat", "code"))
    crd = yaml.safe_load((ROOT / "crds" / "inferencepools.fairpool.io.yaml").read_text())
    assert "scale" in crd["spec"]["versions"][0]["subresources"]  # what KEDA drives
    known = known_metric_names()
    for scaled in (chat, code):
        assert crd_errors(scaled, _SCALED_OBJECT) == []
        target = scaled["spec"]["scaleTargetRef"]
        assert (target["apiVersion"], target["kind"]) == ("fairpool.io/v1alpha1", "InferencePool")
        for trigger in scaled["spec"]["triggers"]:
            query = trigger["metadata"]["query"]
            promql.parse(query)
            used = set(re.findall(r"\b((?:fairpool_|vllm:)[a-zA-Z0-9_:]+)", query))
            assert used <= known and f'pool="{target["name"]}"' in query
    # from zero, the gateway's queue (it holds requests while the pool wakes) counts
    assert chat["spec"]["minReplicaCount"] == 0 and code["spec"]["minReplicaCount"] == 1
    waiting = chat["spec"]["triggers"][0]["metadata"]
    assert "fairpool_gateway_queued" in waiting["query"] and waiting["activationThreshold"] == "0"
    assert len(chat["spec"]["triggers"]) == 2 and len(code["spec"]["triggers"]) == 1
    no_address = {"autoscaling": {"pools": [{"pool": "chat", "maxReplicas": 2}]}}
    refused = helm("template", RELEASE, str(CHART), values=no_address, tmp=tmp_path)
    assert refused.returncode != 0 and "autoscaling.keda.prometheusAddress" in refused.stderr
