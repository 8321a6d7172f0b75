"""Children that must not outlive their parent (local mode's engines and gateway).

`fairpool up` starts its children with FAIRPOOL_PARENT_PID set; a child calls
`die_with_parent()` first thing, which asks Linux to send it SIGTERM when the parent dies
(`PR_SET_PDEATHSIG`), then checks the parent is still the one that started it (it may
have died already). Done in the child rather than between fork and exec, where running
Python code is unsafe in a process with threads.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "FAIRPOOL_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    parent = os.environ.pop(PARENT_ENV, None)  # not for our own children
    if not parent or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != parent:  # the parent died before we asked
        os.kill(os.getpid(), signal.SIGTERM)
