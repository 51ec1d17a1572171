"""The loop is watched: an async test fails when one callback held its event loop for more than
`BLOCKED` seconds, which is what stalls every other request and `/healthz` in a server.

asyncio's own slow-callback detection does the measuring (debug mode, `slow_callback_duration`):
it times each callback the loop runs, so time the loop spent waiting for its next event is not
counted, only code that ran that long without yielding. On a machine asked for more than its
CPUs the limit grows by that much (`contention`): a callback that waited for a CPU did not hold
the loop any longer in what it ran. What it reports
(`Executing <Handle ...> took 0.123 seconds` on the `asyncio` logger) is collected here, and
the test fails at teardown naming each callback.

A test whose loop was held is run once more (pytest-rerunfailures, `--only-rerun` on this
message, set in pyproject's `addopts`) and fails only if it holds its loop again: the blocking
this watch is for is deterministic (a lock waited out, a purge of everything at once) and comes
back on the rerun; a CPU spike on a shared machine does not.

A test whose loop may block on purpose says why, and is not watched:
`@pytest.mark.loop_may_block("reason")`. Debug mode makes a loop several times slower (a test
of 50,000 requests took 10x as long): such a test opts out too, naming that.
Wired from `tests/conftest.py`: every coroutine test gets the `loop_watch` fixture.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import AsyncIterator

import pytest

#: Seconds one callback may hold the event loop.
BLOCKED = 0.1

MARKER = "loop_may_block"


class SlowCallbacks(logging.Handler):
    """Collects asyncio's slow-callback reports."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing ") and " took " in message:
            self.found.append(message)


@pytest.fixture
async def loop_watch(request: pytest.FixtureRequest) -> AsyncIterator[SlowCallbacks]:
    """Fails the test when its event loop ran a callback longer than `BLOCKED` seconds. A test
    marked `loop_may_block` is not watched at all (debug mode costs a test of 50,000 requests 10x)."""
    handler = SlowCallbacks()
    if request.node.get_closest_marker(MARKER) is not None or unwatched(request.node):
        yield handler
        return
    loop = asyncio.get_running_loop()
    logger = logging.getLogger("asyncio")
    debug, duration, level = loop.get_debug(), loop.slow_callback_duration, logger.level
    loop.set_debug(True)
    loop.slow_callback_duration = allowed = BLOCKED * contention()
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        loop.slow_callback_duration = duration
        loop.set_debug(debug)
    if handler.found:
        shown = "\n".join(f"  {m[:300]}" for m in handler.found)
        pytest.fail(f"the event loop was blocked for more than {allowed:.2f}s:\n{shown}", pytrace=False)


def contention() -> float:
    """How many times over the machine's CPUs are asked for (the last minute's load), at least 1.

    A callback that waited its turn for a CPU took longer by about that much without holding the
    loop any longer; on a shared machine (two cores, several suites) a 40 ms step measured 100-150
    ms. The blocking this watch is for (a lock waited out on the loop, a purge of everything at
    once) is seconds long, far above either limit."""
    cpus = os.cpu_count() or 1
    return max(1.0, os.getloadavg()[0] / cpus)


#: Tiers not watched yet: their tests drive Google's clients against emulators, some of whose calls
#: block by design (a publish's `.result()`), and have not been measured under the watch.
UNWATCHED_TIERS = ("emulator", "e2e")


def on_firestore(item: pytest.Item) -> bool:
    """A contract test's Firestore half: Google's client does synchronous work of its own (channel
    and credentials set-up, protobuf marshalling) on the loop that we cannot move; its SQLite half
    is watched. (A mark on a fixture's param does not reach the item at collection: read the id.)"""
    _, _, params = item.name.partition("[")
    return "firestore" in params.rstrip("]").split("-")


def unwatched(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(tier) is not None for tier in UNWATCHED_TIERS) or on_firestore(item)


def watch_coroutine_tests(items: list[pytest.Item]) -> None:
    """Give every coroutine test the `loop_watch` fixture (from `pytest_collection_modifyitems`),
    but those of `UNWATCHED_TIERS`."""
    for item in items:
        function = getattr(item, "function", None)
        coroutine = function is not None and inspect.iscoroutinefunction(function)
        # Parametrized items share one fixture list: the fixture itself skips an unwatched item too.
        watched = coroutine and not unwatched(item) and isinstance(item, pytest.Function)
        if watched and "loop_watch" not in item.fixturenames:
            item.fixturenames.insert(0, "loop_watch")
