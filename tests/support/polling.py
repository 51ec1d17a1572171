"""Waiting for what another thread, process or task brings about when it offers nothing to await
(a flag, a log line, a row another process wrote): poll the condition with a short pause and a
generous deadline, and fail loudly naming what never happened. Where there is an event, a future
or the injected clock (`tests.support.clock`), wait on that instead.

The deadline only bounds a test that is already failing; the pause is short, so a passing test
waits about as long as the condition takes.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Seconds between two looks at the condition: in this process, and in another's files (which
#: costs a parse of its log each look).
POLL = 0.01
POLL_FILES = 0.05


def _said(what: Callable[[], str] | str) -> str:
    return what() if callable(what) else what


def wait_until(
    condition: Callable[[], Any], timeout: float, what: Callable[[], str] | str, poll: float = POLL_FILES
) -> Any:
    """Poll `condition` until it returns something truthy, and return that; fail with `what`
    after `timeout` seconds. An exception from `condition` (an assert on the way) ends the wait."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {_said(what)}")
        time.sleep(poll)


async def eventually(
    condition: Callable[[], T | Awaitable[T]], within: float, what: Callable[[], str] | str, poll: float = POLL
) -> T:
    """`wait_until` for a coroutine, `within` seconds: the loop runs other tasks between looks,
    and `condition` may be a coroutine function (a read from a store)."""
    deadline = time.monotonic() + within
    while True:
        got = condition()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within:g}s: {_said(what)}")
        await asyncio.sleep(poll)
