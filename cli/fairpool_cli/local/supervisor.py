"""Child processes of local mode: started, watched, restarted, stopped — never orphaned.

- Each child runs in its own process group, so stopping it also stops what it started
  (vLLM's engine-core process, for one).
- On Linux each child asks the kernel for SIGTERM when its parent dies
  (`fairpool_cli.parent`): even a `fairpool up` killed with SIGKILL leaves nothing running.
- A child that exits is reported with its last output lines and restarted after a back-off
  that doubles (1 s, 2 s, 4 s, … 30 s) and resets once it has run for a minute.
- `stop()` sends SIGTERM to every group, waits, then SIGKILLs what is left.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fairpool_cli.local.plan import ProcessSpec
from fairpool_cli.parent import PARENT_ENV

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
STABLE_AFTER = 60.0
STOP_GRACE = 10.0

Report = Callable[[str], None]


@dataclass
class Child:
    spec: ProcessSpec
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff: float = FIRST_BACKOFF
    restart_at: float | None = None
    restarts: int = 0
    output: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=20))


class Supervisor:
    def __init__(self, specs: list[ProcessSpec], report: Report) -> None:
        self.children = [Child(spec) for spec in specs]
        self.report = report
        self._lock = threading.Lock()
        self._stopping = False

    def start(self) -> None:
        for child in self.children:
            self._spawn(child)

    def check(self) -> None:
        """Report children that exited and restart those whose back-off is over."""
        now = time.monotonic()
        with self._lock:
            if self._stopping:
                return
            for child in self.children:
                if child.process is not None and child.process.poll() is not None:
                    self._exited(child, now)
                if child.process is None and child.restart_at is not None:
                    if now >= child.restart_at:
                        child.restarts += 1
                        self._spawn(child)
                elif child.process is not None and now - child.started > STABLE_AFTER:
                    child.backoff = FIRST_BACKOFF

    def stop(self) -> None:
        """Stop every child and everything it started."""
        with self._lock:
            self._stopping = True
            running = [c.process for c in self.children if c.process and c.process.poll() is None]
            for process in running:
                _signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            for process in running:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            for process in running:
                _signal_group(process, signal.SIGKILL)  # stragglers and grandchildren
                process.wait()

    def pids(self) -> list[int]:
        return [c.process.pid for c in self.children if c.process and c.process.poll() is None]

    # ------------------------------------------------------------------ internals

    def _spawn(self, child: Child) -> None:
        child.process = subprocess.Popen(
            child.spec.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, PARENT_ENV: str(os.getpid())},
        )
        child.started = time.monotonic()
        child.restart_at = None
        child.output.clear()
        threading.Thread(target=_collect, args=(child.process, child.output), daemon=True).start()

    def _exited(self, child: Child, now: float) -> None:
        assert child.process is not None
        code = child.process.returncode
        _signal_group(child.process, signal.SIGKILL)  # whatever it left behind
        child.process = None
        last = " | ".join(list(child.output)[-3:]) or "no output"
        self.report(
            f"{child.spec.name} exited with {_describe(code)} ({last}); "
            f"restarting in {child.backoff:g} s"
        )
        child.restart_at = now + child.backoff
        child.backoff = min(child.backoff * 2, MAX_BACKOFF)


def _collect(process: subprocess.Popen[bytes], lines: collections.deque[str]) -> None:
    assert process.stdout is not None
    for raw in process.stdout:
        lines.append(raw.decode(errors="replace").rstrip())


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"
