"""The policy an engine runs, following its configuration file while the engine runs.

The operator mounts the file from a ConfigMap; Kubernetes swaps the file atomically when
the ConfigMap changes, so a changed (inode, size, mtime) is a new version (`fairpool.files`).
A version that fails to validate is logged and ignored: the engine keeps the last good
configuration.
A change of tenant weights, groups or bands keeps the policy's state (the fair tree takes
the new shape, its counters kept); any other change builds the new policy and hands it the
waiting and running requests (`LocalPolicy.take_over`). A policy
given on the command line (`policy_override`) replaces the file's in every version.

An engine that lets a policy order its waiting queue and nothing else (`queue_only`:
vLLM) refuses a policy that decides the shape of each batch (RAD: a batch of decodes or
one prefill chunk, never both), at start and in every later version of the file.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from fairpool.api.scheduler_config import (
    CONFIG_ENV,
    POLICY_ENV,
    SchedulerConfig,
    flow_of,
    load_scheduler_config,
    parse_scheduler_config,
)
from fairpool.files import FileWatch
from fairpool.sched.errors import ConfigError
from fairpool.sched.policy import LocalPolicy
from fairpool.sched.registry import mixes_phases

log = logging.getLogger("fairpool.engine")

#: How often, at most, the file's metadata is looked at (seconds).
CHECK_INTERVAL = 1.0


class LiveScheduler:
    """Holds `policy` and `config`; call `maybe_reload()` often (it is cheap)."""

    def __init__(
        self,
        path: str | Path | None = None,
        check_interval: float = CHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        policy_override: str | None = None,
        queue_only: bool = False,
    ) -> None:
        self.path = Path(path) if path else None
        self.queue_only = queue_only
        self.check_interval = check_interval
        self.policy_override = policy_override
        self._clock = clock
        # A bad file at start is fatal (ConfigError names the field): better than serving
        # with a configuration nobody asked for.
        self.config = self._load()
        self.policy: LocalPolicy = self.config.make_policy()
        self.reloads = {"applied": 0, "rejected": 0}
        self.last_error: str | None = None
        self._file = FileWatch(self.path) if self.path else None
        self._checked_at = clock()

    @classmethod
    def from_environment(cls, queue_only: bool = False) -> LiveScheduler:
        return cls(
            os.environ.get(CONFIG_ENV) or None,
            policy_override=os.environ.get(POLICY_ENV) or None,
            queue_only=queue_only,
        )

    def flow_of(self, extra_args: object) -> str:
        """The flow a request with these `vllm_xargs` runs in (its tenant, or
        `tenant@band` below the tenant's band), under the bands in force: what both
        engines queue a request as."""
        return flow_of(extra_args, self.policy.weights)

    def maybe_reload(self) -> bool:
        """Re-read the file if it changed; True when a new configuration took effect."""
        if self._file is None:
            return False
        now = self._clock()
        if now - self._checked_at < self.check_interval:
            return False
        self._checked_at = now
        if not self._file.changed():
            return False
        try:
            config = self._load()
        except ConfigError as error:
            self.reloads["rejected"] += 1
            self.last_error = str(error)
            log.warning("scheduler config not applied, keeping the last good one: %s", error)
            return False
        self.apply(config)
        return True

    def apply(self, config: SchedulerConfig) -> None:
        if config.same_policy(self.config):
            self.policy.weights = config.weights()
        else:
            policy = config.make_policy()
            policy.take_over(self.policy)
            self.policy = policy
        self.config = config
        self.reloads["applied"] += 1
        self.last_error = None
        log.info(
            "scheduler config applied: policy=%s, %d tenant weight(s)",
            config.policy_name,
            len(config.tenants),
        )

    def _load(self) -> SchedulerConfig:
        config = load_scheduler_config(self.path) if self.path else SchedulerConfig()
        if self.policy_override is not None:
            document = config.model_dump(by_alias=True)
            document["policy"] = self.policy_override
            config = parse_scheduler_config(document, "--policy")
        if self.queue_only and not mixes_phases(config.policy_name):
            raise ConfigError(
                "policy",
                f"{config.policy!r} decides the shape of every batch (decodes or one prefill "
                "chunk, never both), and vLLM's scheduler lets a plugin order only its "
                "waiting queue: it always runs the running requests' decodes alongside "
                "prefills. Run it on the simulated engine (engine kind sim) or in "
                "fairpool sim",
            )
        return config
