"""The operator's settings, from its environment (the Helm chart sets them)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fairpool.api.inference_pool import EngineKind
from fairpool.sched.errors import ConfigError
from fairpool_operator import contract

#: The namespace of the pod, where Kubernetes mounts the service account.
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class GeneratedSecret:
    """A Secret the operator makes when it is missing: one key, a random alphanumeric
    value of `length` characters. The chart renders no random Secret (a renderer without
    cluster access, Argo CD's, would make a new one at every sync)."""

    name: str
    key: str
    length: int


@dataclass(frozen=True)
class OperatorConfig:
    """What rendering and reconciling need beyond the pools and tenants themselves."""

    namespace: str = "default"
    engine_image: str = contract.DEFAULT_ENGINE_IMAGE
    engine_sim_image: str = contract.DEFAULT_ENGINE_SIM_IMAGE
    #: Image pull Secrets the engine pods use (the chart's `images.pullSecrets`).
    pull_secrets: tuple[str, ...] = ()
    gateway_secret: str = contract.DEFAULT_GATEWAY_SECRET
    gateway_admin_url: str | None = None
    #: The file holding the gateway's admin token, sent as a bearer token to its /metrics.
    gateway_admin_token_file: str | None = None
    served_interval: float = 30.0
    #: Render multi-stage chains as LeaderWorkerSets: True, False, or None to detect the
    #: LeaderWorkerSet API when the operator starts (FAIRPOOL_LEADER_WORKER_SET).
    leader_worker_set: bool | None = None
    #: Several gateway pods share tenant state here (None: one gateway, its own state).
    shared_state_url: str | None = None
    gateway_replicas: int = 1
    #: Whether the gateway pods have the server's password (contract.SHARED_STATE_PASSWORD_PATH).
    shared_state_password: bool = False
    #: The server's ACL user the gateways log in as (None: the default user), and the prefix
    #: of their keys (None: the gateway's default).
    shared_state_username: str | None = None
    shared_state_key_prefix: str | None = None
    #: Secrets to make when missing (the gateway's admin token, the shared state's password).
    generated_secrets: tuple[GeneratedSecret, ...] = ()
    #: Watch the cluster's Nodes (placement pools that discover theirs; needs the chart's
    #: ClusterRole, rbac.readNodes).
    watch_nodes: bool = False

    def shared_state(self) -> dict[str, object] | None:
        """gateway.yaml's `sharedState`, or None for one gateway."""
        if self.shared_state_url is None:
            return None
        state: dict[str, object] = {"url": self.shared_state_url, "replicas": self.gateway_replicas}
        if self.shared_state_password:
            state["passwordFile"] = contract.SHARED_STATE_PASSWORD_PATH
        if self.shared_state_username is not None:
            state["username"] = self.shared_state_username
        if self.shared_state_key_prefix is not None:
            state["keyPrefix"] = self.shared_state_key_prefix
        return state

    def image(self, kind: EngineKind) -> str:
        """The default image of an engine kind (a pool's `engine.image` overrides it)."""
        return self.engine_sim_image if kind == "sim" else self.engine_image

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, namespace: str | None = None
    ) -> OperatorConfig:
        """From FAIRPOOL_* variables; `namespace` (the --namespace option) wins over
        FAIRPOOL_NAMESPACE, which wins over the pod's own namespace, then `default`."""
        env = os.environ if environ is None else environ
        return cls(
            namespace=namespace or env.get(contract.NAMESPACE_ENV) or pod_namespace() or "default",
            engine_image=env.get(contract.ENGINE_IMAGE_ENV) or contract.DEFAULT_ENGINE_IMAGE,
            engine_sim_image=env.get(contract.ENGINE_SIM_IMAGE_ENV)
            or contract.DEFAULT_ENGINE_SIM_IMAGE,
            pull_secrets=tuple(
                name.strip()
                for name in env.get(contract.PULL_SECRETS_ENV, "").split(",")
                if name.strip()
            ),
            gateway_secret=env.get(contract.GATEWAY_SECRET_ENV) or contract.DEFAULT_GATEWAY_SECRET,
            gateway_admin_url=(env.get(contract.GATEWAY_ADMIN_URL_ENV) or "").rstrip("/") or None,
            gateway_admin_token_file=env.get(contract.GATEWAY_ADMIN_TOKEN_FILE_ENV) or None,
            served_interval=_seconds(env, contract.SERVED_INTERVAL_ENV, 30.0),
            leader_worker_set=_auto_flag(env, contract.LEADER_WORKER_SET_ENV),
            shared_state_url=env.get(contract.SHARED_STATE_URL_ENV) or None,
            gateway_replicas=_count(env, contract.GATEWAY_REPLICAS_ENV, 1),
            shared_state_password=_auto_flag(env, contract.SHARED_STATE_PASSWORD_ENV) is True,
            shared_state_username=env.get(contract.SHARED_STATE_USERNAME_ENV) or None,
            shared_state_key_prefix=env.get(contract.SHARED_STATE_KEY_PREFIX_ENV) or None,
            generated_secrets=_generated_secrets(env, contract.GENERATED_SECRETS_ENV),
            watch_nodes=_auto_flag(env, contract.WATCH_NODES_ENV) is True,
        )


def pod_namespace() -> str | None:
    """The namespace this pod runs in, if it runs in one."""
    try:
        return POD_NAMESPACE_FILE.read_text().strip() or None
    except OSError:
        return None


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(name, f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise ConfigError(name, f"must be > 0, got {text!r}")
    return value


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(name, f"must be a whole number >= 1, got {text!r}")
    return int(text)


def _generated_secrets(env: Mapping[str, str], name: str) -> tuple[GeneratedSecret, ...]:
    """`NAME/KEY/LENGTH,...` (the chart writes it)."""
    found = []
    for item in (part.strip() for part in env.get(name, "").split(",")):
        if not item:
            continue
        fields = item.split("/")
        valid = len(fields) == 3 and all(fields) and fields[2].isdigit()
        if not valid or not 16 <= int(fields[2]) <= 256:
            raise ConfigError(name, f"expected NAME/KEY/LENGTH (16 to 256), got {item!r}")
        found.append(GeneratedSecret(fields[0], fields[1], int(fields[2])))
    return tuple(found)


def _auto_flag(env: Mapping[str, str], name: str) -> bool | None:
    """`true`/`false`, or None for `auto` or unset."""
    text = (env.get(name) or "auto").strip().lower()
    choices = {"auto": None, "true": True, "false": False}
    if text not in choices:
        raise ConfigError(name, f"must be auto, true or false, got {env.get(name)!r}")
    return choices[text]
