"""Waiting in tests for something that happens elsewhere: a thread, a process, a server.

A test waits for a counted event (a request answered, a worker out of rotation, a line
logged) and then asserts; it never sleeps and hopes. The deadline only keeps a broken test
from hanging: it is generous, because a loaded machine is slow, and its expiry is a
failure that names what was awaited and the last value seen, never the thing a test
proves.

    wait_until(lambda: engine.in_flight, lambda n: n == 0, what="the engine heard the abort")
    value = await eventually(read_state, what="the operator wrote the status")
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Seconds before a wait is given up as a failure: a bound on a hang, not a measurement.
DEADLINE = 60.0
#: Seconds between two looks.
INTERVAL = 0.01

_NOTHING = object()


class _Wait:
    """The bookkeeping of one wait: its deadline and what it has seen."""

    def __init__(
        self,
        read: Callable[..., Any],
        what: str | None,
        timeout: float,
        ignoring: tuple[type[BaseException], ...],
    ) -> None:
        self.read = read
        self.what = what
        self.timeout = timeout
        self.ignoring = ignoring
        self.deadline = time.monotonic() + timeout
        self.last: object = _NOTHING
        self.looks = 0

    def saw(self, value: object) -> None:
        self.looks += 1
        self.last = value

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def failure(self) -> AssertionError:
        if self.last is _NOTHING:
            seen = "nothing"
        elif isinstance(self.last, BaseException):
            seen = f"{type(self.last).__name__}: {self.last}"
        else:
            seen = _short(repr(self.last))
        awaited = self.what or _source(self.read)
        return AssertionError(
            f"waited {self.timeout:g} s ({self.looks} looks) for {awaited}; last seen: {seen}"
        )


def wait_until(
    read: Callable[[], T],
    until: Callable[[T], object] = bool,
    *,
    what: str | None = None,
    timeout: float = DEADLINE,
    interval: float = INTERVAL,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `read` until `until` holds for what it returned, and return that value.

    Exceptions of the types in `ignoring` raised by `read` count as "not yet" (an object
    not created yet); others propagate at once. After `timeout` seconds, AssertionError
    naming `what` (or the source of `read`) and the last value seen."""
    wait = _Wait(read, what, timeout, ignoring)
    while True:
        try:
            value = read()
        except ignoring as error:
            wait.saw(error)
        else:
            wait.saw(value)
            if until(value):
                return value
        if wait.expired():
            raise wait.failure()
        time.sleep(interval)


async def eventually(
    read: Callable[[], T | Awaitable[T]],
    until: Callable[[T], object] = bool,
    *,
    what: str | None = None,
    timeout: float = DEADLINE,
    interval: float = INTERVAL,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """`wait_until` for a coroutine: the event loop runs between looks, and `read` may be
    a coroutine function."""
    wait = _Wait(read, what, timeout, ignoring)
    while True:
        try:
            value: Any = read()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as error:
            wait.saw(error)
        else:
            wait.saw(value)
            if until(value):
                return value
        if wait.expired():
            raise wait.failure()
        await asyncio.sleep(interval)


def _source(function: Callable[..., Any]) -> str:
    """The line that defines `function` (a lambda's whole call), for the failure message."""
    try:
        lines, _ = inspect.getsourcelines(function)
    except (OSError, TypeError):
        return getattr(function, "__qualname__", repr(function))
    return _short(" ".join(line.strip() for line in lines))


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
