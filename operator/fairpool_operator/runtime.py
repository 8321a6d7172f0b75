"""The reconciler as the kopf handlers share it: one at a time, bursts coalesced.

kopf runs handlers concurrently (one worker per object, sync handlers in threads), but every
reconcile reads and writes the whole namespace — above all the one gateway Secret — so they
run one at a time. A request for a full reconcile is skipped when a full reconcile started
after it was made: that one already read the change. So a burst of events (a restart's
resumes, a rollout) costs one or two reconciles, not one each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from fairpool_operator import metrics
from fairpool_operator.reconcile import Reconciler, Write
from fairpool_operator.served import Served, fetch_served

log = logging.getLogger("fairpool.operator")


def count_writes(writes: list[Write]) -> list[Write]:
    for write in writes:
        metrics.WRITES.labels(verb=write.verb, kind=write.kind).inc()
    return writes


class Resync:
    """`Operator.resync` every `period` seconds in a thread of its own, whatever exists
    (kopf's timers belong to objects: a namespace without tenants would have none)."""

    def __init__(self, operator: Operator, period: float, max_age: float) -> None:
        self.operator = operator
        self.period = period
        self.max_age = max_age
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fairpool-resync", daemon=True)

    def start(self) -> Resync:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                writes = self.operator.resync(self.max_age)
            except Exception:  # the next period tries again; kopf's handlers go on
                log.exception("resync failed")
                continue
            if writes:
                log.info("resync wrote %s", ", ".join(str(write) for write in writes))


class Operator:
    def __init__(
        self,
        reconciler: Reconciler,
        served: Callable[[], Mapping[str, Served] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reconciler = reconciler
        self.served = served
        self.clock = clock
        self._lock = threading.Lock()  # one reconcile at a time
        self._counter = threading.Lock()  # guards the request numbers
        self._requested = 0
        self._covered = 0  # requests a full reconcile started after
        self._finished_at: float | None = None
        self._served_at: float | None = None

    @classmethod
    def for_config(cls, reconciler: Reconciler) -> Operator:
        """With the gateway's admin API as the source of served numbers, if configured."""
        url = reconciler.config.gateway_admin_url
        token_file = reconciler.config.gateway_admin_token_file
        return cls(reconciler, (lambda: fetch_served(url, token_file)) if url else None)

    @property
    def referenced_secrets(self) -> frozenset[str]:
        return self.reconciler.referenced_secrets

    def reconcile(self, max_age: float | None = None) -> list[Write] | None:
        """A full reconcile, unless one started since this request (or, with `max_age`,
        finished less than `max_age` seconds ago). None when skipped."""
        with self._counter:
            self._requested += 1
            ticket = self._requested
        with self._lock:
            if ticket <= self._covered:
                return None
            recent = self._finished_at is not None and max_age is not None
            if recent and self.clock() - (self._finished_at or 0.0) < (max_age or 0.0):
                return None
            with self._counter:
                self._covered = self._requested
            started = time.perf_counter()
            try:
                writes = self.reconciler.reconcile()
            except Exception:
                metrics.RECONCILES.labels(result="error").inc()
                raise
            finally:
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
                metrics.REFUSED.set(len(self.reconciler.refusals))
            metrics.RECONCILES.labels(result="ok").inc()
            count_writes(writes)
            self._finished_at = self.clock()
            return writes

    def resync(self, max_age: float) -> list[Write] | None:
        """The safety net for lost events and edits nobody is told about (the gateway's
        Secret, Nodes): a full reconcile when none finished for `max_age` seconds, or when
        an object the API server refused is due again."""
        due = self.reconciler.retry_in()
        return self.reconcile(max_age=None if due == 0.0 else max_age)

    def refresh_pool_status(self, name: str) -> list[Write]:
        with self._lock:
            return count_writes(self.reconciler.refresh_pool_status(name))

    def poll_served(self, max_age: float) -> list[Write] | None:
        """The gateway's numbers onto the tenants, at most once per `max_age` seconds."""
        if self.served is None:
            return None
        with self._counter:
            now = self.clock()
            if self._served_at is not None and now - self._served_at < max_age:
                return None
            self._served_at = now
        report = self.served()  # outside the lock: the gateway may be slow to answer
        if report is None:
            return None
        with self._lock:
            return count_writes(self.reconciler.record_served(report))
