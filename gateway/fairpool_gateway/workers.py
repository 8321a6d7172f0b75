"""Which workers of a pool are in rotation, and how busy each one is.

`WorkerMonitor` polls every worker's `GET /health` every `interval` seconds; a worker is in
rotation ("healthy") while that answers 200 within `timeout`. After each good answer it
reads the worker's load from `GET /metrics`, by vLLM's metric names:
`vllm:num_requests_waiting`, `vllm:num_requests_running` and `vllm:kv_cache_usage_perc`
(`vllm:gpu_cache_usage_perc` before vLLM 0.10).

Timing: a worker that stops answering leaves rotation within `interval + timeout` (1.5 s
with the defaults): each worker's health check starts on a fixed beat, independently of
the other workers and of its own, slower, metrics read. A dead worker (connection refused)
leaves at its next check.

**The gateway's own delays are not the worker's.** A check that timed out while the
gateway's event loop ran late (`fairpool.runtime.LoopLag`: a burst of work held it for
at least a quarter of the timeout) proves nothing about the worker: it changes nothing,
and the next check decides. Otherwise a client that keeps the loop busy for a second would
eject every worker of every pool. The proxy can take a worker out at once with `report_failure`;
the first check that starts after such a report brings it back, if it is good.

Logs go to the logger "fairpool.gateway": a worker leaving or entering rotation, once per
transition; repeated failures at debug level. Worker URLs are logged without credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fairpool.runtime import LoopLag

log = logging.getLogger("fairpool.gateway")

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_BEFORE_V0_10 = "vllm:gpu_cache_usage_perc"
#: A timed-out check is the loop's fault when the loop was late this share of the timeout.
LOOP_LATE_SHARE = 0.25
LOAD_METRICS = frozenset({WAITING, RUNNING, KV_USAGE, KV_USAGE_BEFORE_V0_10})


@dataclass
class WorkerHealth:
    """What the monitor knows of one worker's health. Its load is not kept here: each read
    goes to `on_change`, and the pool's router owns it (`fairpool.sched.routers.WorkerState`)."""

    url: str
    healthy: bool = False  # in rotation
    consecutive_failures: int = 0  # failed health checks (and proxy reports) since the last good
    last_error: str | None = None  # the most recent failure; kept after recovery
    last_ok: float | None = None  # monotonic time of the last good health check


@dataclass(frozen=True)
class Load:
    """A worker's load, as its /metrics page reports it: requests waiting and running,
    summed over label sets (engines), and the KV cache's use (0..1), averaged."""

    waiting: int
    running: int
    kv_usage: float


def parse_load(text: str) -> Load:
    """The load in a Prometheus text page of vLLM's metrics.

    Queue lengths are summed over label sets (a data-parallel vLLM labels each engine), KV
    usage is averaged. Raises ValueError when the page does not parse or lacks a metric.
    """
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in LOAD_METRICS:
                if not math.isfinite(sample.value):
                    raise ValueError(f"{sample.name} is {sample.value}")
                values.setdefault(sample.name, []).append(sample.value)
    kv_usage = values.get(KV_USAGE) or values.get(KV_USAGE_BEFORE_V0_10)
    missing = [name for name in (WAITING, RUNNING) if name not in values]
    if kv_usage is None:
        missing.append(KV_USAGE)
    if missing or kv_usage is None:
        raise ValueError(f"no {', '.join(missing)} among the metrics")
    return Load(
        waiting=round(sum(values[WAITING])),
        running=round(sum(values[RUNNING])),
        kv_usage=min(1.0, max(0.0, sum(kv_usage) / len(kv_usage))),
    )


def shown(url: str) -> str:
    """A worker URL fit for logs: without user name or password."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(userinfo=b"")) if parsed.userinfo else url


def describe(error: BaseException) -> str:
    """An exception in a few words (httpx's timeouts have no message of their own)."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


class WorkerMonitor:
    """Polls the health and load of a pool's workers; see the module's docstring.

    `on_change(worker, load)` is called, on the event loop, when a worker enters or leaves
    rotation (also when a worker in rotation is removed from the pool), and after every
    read of a healthy worker's load; `load` is the load just read (None when the call is
    about rotation only). A worker enters rotation with its load. Give the monitor an
    `httpx.AsyncClient` of its own, or one whose connection limits the proxy's streams
    cannot exhaust: a check waiting for a free connection counts against its timeout.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        interval: float = 0.5,
        timeout: float = 1.0,
        on_change: Callable[[WorkerHealth, Load | None], None] | None = None,
        lag: LoopLag | None = None,
    ) -> None:
        self.workers: dict[str, WorkerHealth] = {}
        self.lag = lag
        self.inconclusive = 0  # checks that timed out while the loop itself was late
        self._client = client
        self.interval = interval
        self.timeout = timeout
        self._on_change = on_change
        self._checks: dict[str, asyncio.Task[None]] = {}  # health checks under way, by URL
        self._reads: dict[str, asyncio.Task[None]] = {}  # metrics reads under way, by URL
        self._reported: dict[str, float] = {}  # monotonic time of the proxy's last report
        self._metrics_failing: set[str] = set()
        self._new: set[str] = set()  # workers added since run() last looked
        self._wake = asyncio.Event()

    def set_workers(self, urls: Iterable[str]) -> None:
        """Make `urls` the pool's members. New ones start out of rotation and are checked at
        once (by `run`); removed ones are forgotten."""
        wanted = dict.fromkeys(url.rstrip("/") for url in urls)
        for url in [url for url in self.workers if url not in wanted]:
            self._remove(url)
        for url in wanted:
            if url not in self.workers:
                self.workers[url] = WorkerHealth(url)
                self._new.add(url)
                log.info("worker %s joined the pool", shown(url))
        if self._new:
            self._wake.set()

    def healthy(self) -> list[str]:
        """The workers in rotation."""
        return [url for url, worker in self.workers.items() if worker.healthy]

    def report_failure(self, url: str, error: str) -> None:
        """The proxy could not reach `url` or got a 5xx: out of rotation now, back after the
        next good health check that starts after this report. `error` is logged."""
        worker = self.workers.get(url.rstrip("/"))
        if worker is None:
            return
        self._reported[worker.url] = time.monotonic()
        self._mark_down(worker, error, reported=True)

    async def poll_once(self) -> None:
        """Check every worker once, concurrently, reading the load of the good ones."""
        workers = list(self.workers.values())
        await asyncio.gather(
            *(self._poll_guarded(worker, read_load_now=True) for worker in workers)
        )

    async def run(self) -> None:
        """Check every worker each `interval` seconds, and new ones at once, until cancelled."""
        next_round = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if now >= next_round:
                    self._start_checks(list(self.workers.values()))
                    next_round = now + self.interval
                else:
                    self._start_checks(
                        [self.workers[url] for url in self._new if url in self.workers]
                    )
                self._new.clear()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(next_round - time.monotonic()):
                        await self._wake.wait()
        finally:
            await self._stop_tasks()

    def _start_checks(self, workers: list[WorkerHealth]) -> None:
        """Start a health check of each worker that has none under way."""
        for worker in workers:
            if worker.url not in self._checks:
                check = asyncio.create_task(self._poll_guarded(worker, read_load_now=False))
                self._track(self._checks, worker.url, check)

    def _track(
        self, tasks: dict[str, asyncio.Task[None]], url: str, task: asyncio.Task[None]
    ) -> None:
        """Remember a task under way for `url` until it ends."""
        tasks[url] = task

        def forget(ended: asyncio.Task[None]) -> None:
            if tasks.get(url) is ended:
                del tasks[url]

        task.add_done_callback(forget)

    async def _stop_tasks(self) -> None:
        tasks = [*self._checks.values(), *self._reads.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _poll_guarded(self, worker: WorkerHealth, read_load_now: bool) -> None:
        """`_poll`, logging instead of raising whatever a worker's answer may cause."""
        try:
            await self._poll(worker, read_load_now)
        except Exception:
            log.exception("checking worker %s failed unexpectedly", shown(worker.url))

    async def _poll(self, worker: WorkerHealth, read_load_now: bool) -> None:
        """One health check, then the load: awaited when asked to, or when the worker is about
        to enter rotation (so that it enters with its load known); else read in the background."""
        started = time.monotonic()
        error = await self._health_error(worker.url)
        if not self._is_member(worker):
            return
        if error is _LOOP_WAS_LATE:
            self.inconclusive += 1
            log.debug("worker %s: check inconclusive, the gateway was late", shown(worker.url))
            return
        if error is not None:
            self._mark_down(worker, error)
            return
        if self._reported_since(worker.url, started):
            return  # the proxy saw it fail after this check began: wait for the next one
        worker.consecutive_failures = 0
        worker.last_ok = time.monotonic()
        if read_load_now or not worker.healthy:
            load = await self._read_load(worker)
            if self._is_member(worker) and not self._reported_since(worker.url, started):
                self._mark_up(worker, load)
        elif worker.url not in self._reads:
            self._track(
                self._reads, worker.url, asyncio.create_task(self._read_load_guarded(worker))
            )

    async def _health_error(self, url: str) -> str | None:
        """None when `GET /health` answers 200 within the timeout, else what went wrong
        (`_LOOP_WAS_LATE` for a timeout the gateway's own loop caused)."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                response = await self._client.get(f"{url}/health")
        except TimeoutError:
            if self._loop_was_late(started):
                return _LOOP_WAS_LATE
            return f"/health gave no answer within {self.timeout:g} s"
        except httpx.HTTPError as error:
            return f"/health: {describe(error)}"
        if response.status_code != 200:
            return f"/health answered {response.status_code}"
        return None

    def _loop_was_late(self, started: float) -> bool:
        return (
            self.lag is not None and self.lag.late_since(started) >= self.timeout * LOOP_LATE_SHARE
        )

    async def _read_load_guarded(self, worker: WorkerHealth) -> None:
        """Read the load in the background and tell on_change."""
        try:
            load = await self._read_load(worker)
            if load is not None and self._is_member(worker) and worker.healthy:
                self._notify(worker, load)
        except Exception:
            log.exception("reading the load of worker %s failed unexpectedly", shown(worker.url))

    async def _read_load(self, worker: WorkerHealth) -> Load | None:
        """Read `GET /metrics`; None when that failed (logged: the last known load stays)."""
        try:
            async with asyncio.timeout(self.timeout):
                response = await self._client.get(f"{worker.url}/metrics")
            response.raise_for_status()
            load = parse_load(response.text)
        except TimeoutError:
            self._metrics_failed(worker, f"/metrics gave no answer within {self.timeout:g} s")
            return None
        except (httpx.HTTPError, ValueError) as error:
            self._metrics_failed(worker, f"/metrics: {describe(error)}")
            return None
        if worker.url in self._metrics_failing:
            self._metrics_failing.discard(worker.url)
            log.info("worker %s: /metrics readable again", shown(worker.url))
        return load

    def _metrics_failed(self, worker: WorkerHealth, error: str) -> None:
        worker.last_error = error
        first = worker.url not in self._metrics_failing
        self._metrics_failing.add(worker.url)
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "worker %s: %s; keeping its last known load", shown(worker.url), error)

    def _mark_up(self, worker: WorkerHealth, load: Load | None) -> None:
        entered = not worker.healthy
        worker.healthy = True
        if entered:
            log.info("worker %s is healthy: in rotation", shown(worker.url))
        if entered or load is not None:
            self._notify(worker, load)

    def _mark_down(self, worker: WorkerHealth, error: str, reported: bool = False) -> None:
        worker.consecutive_failures += 1
        worker.last_error = error
        source = "the proxy reported" if reported else "health check"
        if worker.healthy:
            worker.healthy = False
            log.warning("worker %s out of rotation: %s: %s", shown(worker.url), source, error)
            self._notify(worker, None)
        elif worker.consecutive_failures == 1:
            log.info("worker %s not healthy yet: %s: %s", shown(worker.url), source, error)
        else:
            log.debug("worker %s still unhealthy: %s: %s", shown(worker.url), source, error)

    def _remove(self, url: str) -> None:
        worker = self.workers.pop(url)
        for tasks in (self._checks, self._reads):
            task = tasks.pop(url, None)
            if task is not None:
                task.cancel()
        self._reported.pop(url, None)
        self._metrics_failing.discard(url)
        self._new.discard(url)
        log.info("worker %s left the pool", shown(url))
        if worker.healthy:
            worker.healthy = False
            self._notify(worker, None)

    def _is_member(self, worker: WorkerHealth) -> bool:
        """Whether `worker` is still the pool's record for its URL (not removed meanwhile)."""
        return self.workers.get(worker.url) is worker

    def _reported_since(self, url: str, moment: float) -> bool:
        return self._reported.get(url, -math.inf) >= moment

    def _notify(self, worker: WorkerHealth, load: Load | None) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(worker, load)
        except Exception:
            log.exception("on_change failed for worker %s", shown(worker.url))


#: What `_health_error` says of a check that timed out because the loop was late.
_LOOP_WAS_LATE = "the gateway's event loop was late"
