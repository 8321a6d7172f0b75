"""The gateway's worker monitor against real `fairpool engine-sim` servers on loopback: health,
load from /metrics, workers that die, hang, come back, or are reported by the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from fake_worker import FakeWorker, vllm_metrics
from polling import DEADLINE, eventually, wait_until

from fairpool.runtime import LoopLag
from fairpool_engine.sim.options import SimOptions
from fairpool_engine.sim.server import ServerThread
from fairpool_gateway.workers import Load, WorkerHealth, WorkerMonitor, parse_load, shown

pytestmark = pytest.mark.subprocess

LEAVE_DEADLINE = 2.0  # seconds: "a failing worker leaves rotation within 2 s"


def test_the_leave_deadline_is_one_check_interval_and_one_check_timeout() -> None:
    """A worker leaves rotation at the first health check that fails (the tests below
    count that), and checks start every `interval` and fail after `timeout`: so within
    interval + timeout of failing. The deadline is this sum, not a measured time."""
    monitor = WorkerMonitor(httpx.AsyncClient())
    assert monitor.interval + monitor.timeout <= LEAVE_DEADLINE


def closed_port_url() -> str:
    """A loopback URL where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


class Transitions:
    """The monitor's `on_change` calls: (healthy, consecutive failed checks) each time."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, int]] = []

    def __call__(self, worker: WorkerHealth, load: Load | None) -> None:
        self.seen.append((worker.healthy, worker.consecutive_failures))

    def left_at_first_failure(self) -> bool:
        """Out of rotation at its first failed check since it was last in."""
        return self.seen[-1] == (False, 1)


@contextlib.asynccontextmanager
async def running(monitor: WorkerMonitor) -> AsyncIterator[asyncio.Task[None]]:
    """`monitor.run()` in the background for the block."""
    task = asyncio.create_task(monitor.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def in_rotation(monitor: WorkerMonitor, url: str) -> Callable[[], bool]:
    return lambda: url in monitor.healthy()


def out_of_rotation(monitor: WorkerMonitor, url: str) -> Callable[[], bool]:
    return lambda: url not in monitor.healthy()


# --- parsing ----------------------------------------------------------------------------------


def test_load_sums_queues_over_engines_and_averages_kv_usage() -> None:
    load = parse_load(vllm_metrics())
    assert (load.waiting, load.running, load.kv_usage) == (4, 7, 0.375)


def test_load_reads_the_kv_usage_name_of_older_vllm() -> None:
    assert parse_load(vllm_metrics("vllm:gpu_cache_usage_perc")).kv_usage == 0.375


def test_load_of_a_page_without_vllm_metrics_is_an_error() -> None:
    with pytest.raises(ValueError, match="vllm:num_requests_waiting"):
        parse_load("# TYPE up gauge\nup 1\n")
    with pytest.raises(ValueError):
        parse_load("this is not {prometheus text\n")


def test_logged_urls_leave_out_credentials() -> None:
    assert shown("http://user:secret@10.0.0.5:8000") == "http://10.0.0.5:8000"
    assert shown("http://10.0.0.5:8000") == "http://10.0.0.5:8000"


# --- live engines -----------------------------------------------------------------------------


def test_a_live_engine_is_healthy_with_its_load_from_metrics() -> None:
    # A small KV memory, slow model time: of six 300-token requests two run, the rest wait.
    options = SimOptions(speedup=0.2, max_model_len=512, memory_tokens=640, access_log=False)
    changes: list[tuple[bool, int, int]] = []
    loads: list[Load] = []

    def record(worker: WorkerHealth, load: Load | None) -> None:
        assert load is not None, "a live engine enters rotation with its load"
        loads.append(load)
        changes.append((worker.healthy, load.waiting, load.running))

    async def scenario(url: str) -> None:
        async with httpx.AsyncClient() as client:
            # A generous check timeout: this test is not about slow answers, and a loaded
            # machine may take over a second to answer one.
            monitor = WorkerMonitor(client, timeout=DEADLINE, on_change=record)
            monitor.set_workers([url + "/"])
            assert monitor.healthy() == [] and list(monitor.workers) == [url]
            await monitor.poll_once()
            worker = monitor.workers[url]
            assert monitor.healthy() == [url] and changes == [(True, 0, 0)]
            assert worker.last_ok is not None and worker.consecutive_failures == 0

            body = {"prompt": "word " * 200, "max_tokens": 300}
            requests = [
                asyncio.create_task(client.post(f"{url}/v1/completions", json=body, timeout=60))
                for _ in range(6)
            ]

            async def busy() -> bool:
                await monitor.poll_once()
                queues = (loads[-1].waiting, loads[-1].running)
                return min(queues) > 0 and sum(queues) == 6 and loads[-1].kv_usage > 0

            await eventually(busy, what="the six requests in the monitored load")
            assert changes[-1] == (True, loads[-1].waiting, loads[-1].running)

            for request in requests:  # the clients leave: the engine aborts their requests
                request.cancel()
            await asyncio.gather(*requests, return_exceptions=True)

            async def idle() -> bool:
                await monitor.poll_once()
                return (loads[-1].waiting, loads[-1].running) == (0, 0)

            await eventually(idle, what="the load gone after the clients left")
            assert worker.healthy and changes[-1] == (True, 0, 0)

    with ServerThread(options) as server:
        asyncio.run(scenario(server.url))


def test_a_stopped_engine_leaves_rotation_at_its_first_failed_check() -> None:
    changes = Transitions()

    async def scenario(server: ServerThread) -> None:
        async with httpx.AsyncClient() as client:
            monitor = WorkerMonitor(client, on_change=changes)
            monitor.set_workers([server.url])
            async with running(monitor):
                await eventually(in_rotation(monitor, server.url))
                stopping = asyncio.create_task(asyncio.to_thread(server.__exit__, None, None, None))
                await eventually(out_of_rotation(monitor, server.url))
                await stopping
                worker = monitor.workers[server.url]
                assert changes.left_at_first_failure(), changes.seen
                assert "/health" in (worker.last_error or "")

    server = ServerThread(SimOptions(speedup=100, access_log=False)).__enter__()
    try:
        asyncio.run(scenario(server))
    finally:
        server.__exit__(None, None, None)  # a second exit is harmless


def test_an_engine_answering_503_leaves_rotation_and_returns_when_healthy_again() -> None:
    changes = Transitions()

    async def scenario(url: str) -> None:
        async with httpx.AsyncClient() as client:
            monitor = WorkerMonitor(client, on_change=changes)
            monitor.set_workers([url])
            async with running(monitor):
                await eventually(in_rotation(monitor, url))
                await client.post(f"{url}/admin/health", json={"healthy": False})
                await eventually(out_of_rotation(monitor, url))
                assert changes.left_at_first_failure(), changes.seen
                assert monitor.workers[url].last_error == "/health answered 503"
                await client.post(f"{url}/admin/health", json={"healthy": True})
                await eventually(in_rotation(monitor, url))
                assert monitor.workers[url].consecutive_failures == 0

    with ServerThread(SimOptions(speedup=100, access_log=False)) as server:
        asyncio.run(scenario(server.url))


class EngineProcess:
    """`fairpool engine-sim` in a process of its own, on a port that outlives the process:
    it can hang (SIGSTOP), thaw (SIGCONT), die (SIGKILL) and be started again."""

    def __init__(self) -> None:
        self.url = closed_port_url()
        self.port = int(self.url.rsplit(":", 1)[1])
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "fairpool_cli", "engine-sim", "--port", str(self.port)]
        command += ["--speedup", "100", "--disable-uvicorn-access-log"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_until(self._answers, what="engine-sim answering /health")

    def _answers(self) -> bool:
        assert self.process is not None and self.process.poll() is None, "engine-sim exited"
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def signal(self, number: signal.Signals) -> None:
        assert self.process is not None
        os.kill(self.process.pid, number)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()


@pytest.fixture()
def engine_process() -> Iterator[EngineProcess]:
    engine = EngineProcess()
    engine.start()
    try:
        yield engine
    finally:
        engine.kill()


def test_a_hung_engine_leaves_rotation_at_its_first_failed_check_and_returns(
    engine_process,
) -> None:
    engine = engine_process
    url = engine.url
    changes = Transitions()

    async def scenario() -> None:
        async with httpx.AsyncClient() as client:
            monitor = WorkerMonitor(client, on_change=changes)
            monitor.set_workers([url])
            async with running(monitor):
                await eventually(in_rotation(monitor, url))
                engine.signal(signal.SIGSTOP)  # accepts connections, answers nothing
                await eventually(out_of_rotation(monitor, url))
                assert changes.left_at_first_failure(), changes.seen
                assert "no answer within 1 s" in (monitor.workers[url].last_error or "")
                engine.signal(signal.SIGCONT)
                await eventually(in_rotation(monitor, url))

                engine.kill()  # dead: refuses connections
                await eventually(out_of_rotation(monitor, url))
                assert changes.left_at_first_failure(), changes.seen
                await asyncio.to_thread(engine.start)  # a new process on the same port
                await eventually(in_rotation(monitor, url))

    asyncio.run(scenario())


def test_report_failure_takes_a_worker_out_until_a_check_that_starts_after_it() -> None:
    changes: list[bool] = []

    def transition(worker: WorkerHealth, load: Load | None) -> None:
        if not changes or changes[-1] != worker.healthy:  # loads of a healthy worker too
            changes.append(worker.healthy)

    async def scenario(fake: FakeWorker) -> None:
        url = fake.url
        async with httpx.AsyncClient() as client:
            # The check the test holds must not time out while it is held.
            monitor = WorkerMonitor(client, timeout=DEADLINE, on_change=transition)
            monitor.set_workers([url])
            await monitor.poll_once()
            assert monitor.healthy() == [url]

            fake.health_answers.clear()  # the next /health waits for the test
            fake.health_asked.clear()
            check = asyncio.create_task(monitor.poll_once())
            assert await asyncio.to_thread(fake.health_asked.wait, DEADLINE)
            monitor.report_failure(url, "connect error")
            assert monitor.healthy() == [] and changes == [True, False]
            fake.health_answers.set()
            await check  # it began before the report: it does not bring the worker back
            worker = monitor.workers[url]
            assert not worker.healthy and worker.last_error == "connect error"

            await monitor.poll_once()
            assert monitor.healthy() == [url] and changes == [True, False, True]
            assert worker.consecutive_failures == 0

            monitor.report_failure("http://127.0.0.1:1", "not a member")  # ignored
            assert list(monitor.workers) == [url]

    with FakeWorker() as fake:
        asyncio.run(scenario(fake))


def test_a_metrics_failure_keeps_the_worker_in_rotation_with_its_last_load(caplog) -> None:
    loads: list[Load | None] = []

    async def scenario(fake: FakeWorker) -> None:
        async with httpx.AsyncClient() as client:
            monitor = WorkerMonitor(
                client, timeout=DEADLINE, on_change=lambda worker, load: loads.append(load)
            )
            monitor.set_workers([fake.url])
            await monitor.poll_once()
            worker = monitor.workers[fake.url]
            assert worker.healthy and loads == [Load(4, 7, 0.375)]
            for status, body in [(500, ""), (200, "# TYPE up gauge\nup 1\n")]:
                fake.metrics_status, fake.metrics_body = status, body
                await monitor.poll_once()
                # No new load is reported: whoever keeps the last one keeps it.
                assert worker.healthy and loads == [Load(4, 7, 0.375)]
                assert (worker.last_error or "").startswith("/metrics")

    with caplog.at_level("DEBUG", logger="fairpool.gateway"), FakeWorker() as fake:
        asyncio.run(scenario(fake))
    warnings = [record for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1 and "keeping its last known load" in warnings[0].getMessage()


def test_new_workers_are_checked_at_once_and_removed_ones_forgotten(caplog) -> None:
    seen: list[tuple[str, bool]] = []

    def fragile(worker: WorkerHealth, load: Load | None) -> None:
        seen.append((worker.url, worker.healthy))
        raise RuntimeError("a broken listener must not stop the monitor")

    async def scenario(first: str, second: str) -> None:
        dead = closed_port_url()
        async with httpx.AsyncClient() as client:
            # One round of checks when run() starts, the next in an hour: a worker added
            # later is in rotation within the test only if it was checked at once.
            monitor = WorkerMonitor(client, interval=3600, timeout=DEADLINE, on_change=fragile)
            monitor.set_workers([first, dead])
            async with running(monitor):
                await eventually(in_rotation(monitor, first))
                monitor.set_workers([first, second, dead])
                await eventually(in_rotation(monitor, second))
                await eventually(lambda: monitor.workers[dead].consecutive_failures == 1)
                assert not monitor.workers[dead].healthy
                assert "ConnectError" in (monitor.workers[dead].last_error or "")
                monitor.set_workers([second])
                assert list(monitor.workers) == [second] and monitor.healthy() == [second]
                assert seen == [(first, True), (second, True), (first, False)]

    with (
        caplog.at_level("INFO", logger="fairpool.gateway"),
        ServerThread(SimOptions(speedup=100, access_log=False)) as one,
        ServerThread(SimOptions(speedup=100, access_log=False)) as two,
    ):
        asyncio.run(scenario(one.url, two.url))
    assert any("on_change failed" in record.getMessage() for record in caplog.records)


def test_a_check_that_timed_out_because_the_gateways_loop_was_late_changes_nothing() -> None:
    """A check whose timeout the gateway's own event loop overran (a large body parsed on
    it, a burst of work) proves nothing about the worker: it stays in rotation. The same
    hang with the loop on time takes it out."""

    async def scenario(fake: FakeWorker) -> None:
        lag = LoopLag(interval=0.01)
        lagging = asyncio.create_task(lag.run())
        async with httpx.AsyncClient() as client:
            monitor = WorkerMonitor(client, timeout=1.0, lag=lag)
            monitor.set_workers([fake.url])
            await monitor.poll_once()
            assert monitor.healthy() == [fake.url]

            fake.health_answers.clear()  # hung: accepts, never answers
            fake.health_asked.clear()
            check = asyncio.create_task(monitor.poll_once())
            assert await asyncio.to_thread(fake.health_asked.wait, DEADLINE)
            time.sleep(1.5)  # the loop is held past the check's timeout
            await check
            assert monitor.healthy() == [fake.url] and monitor.inconclusive == 1

            # On time, the hang is the worker's (a loaded machine may make a check late:
            # check again until one is not).
            for _ in range(int(DEADLINE)):
                await monitor.poll_once()
                if not monitor.healthy():
                    break
            assert monitor.healthy() == []
            assert "no answer within 1 s" in (monitor.workers[fake.url].last_error or "")
        lagging.cancel()

    with FakeWorker() as fake:
        asyncio.run(scenario(fake))
