"""The loop is watched: an async test fails when one callback held its event loop for more than
`BLOCKED` seconds, which is what stalls every other request and `/healthz` in a server.

asyncio's own slow-callback detection does the timing (debug mode, `slow_callback_duration`):
it times each callback the loop runs, so time the loop spent waiting for its next event is not
counted, only code that ran that long without yielding. Of that time, what the loop's thread
spent runnable but waiting for a CPU is the machine's, not the code's: coroutine tests run on
`tests.support.loopclock.WatchedLoop`, whose clock readings carry the thread's waiting time
(Linux schedstat), and a report is a block only if what is left reaches the limit: `BLOCKED`,
times how much slower than the machines it was set on this one runs Python (`tests.support.pace`). A callback
asleep in a call it made (a lock waited out, a file, `time.sleep`) counts in full, and so does
what the thread's own counters cannot tell apart from that: the GIL held by another thread of
the process that is itself waiting for a CPU, a write throttled by other processes' dirty pages.
(At a load of 5-9 on 2 CPUs, test_telemetry's pushes were seen holding 0.1-0.24 s with under
10 ms on a CPU; at a load of 2, never.) Where the system keeps no schedstat, the limit grows
instead by how many times over the CPUs are asked for (`contention`). What asyncio reports
(`Executing <Handle ...> took 0.123 seconds` on the
`asyncio` logger) and holds is collected here, and the test fails at teardown naming each
callback and how much of its time was spent waiting for a CPU. While a test is watched, what
the suite made before it is frozen out of the garbage collector's passes (`watching`).

A test whose loop may block on purpose says why, and is not watched:
`@pytest.mark.loop_may_block("reason")`. Debug mode makes a loop several times slower (a test
of 50,000 requests took 10x as long): such a test opts out too, naming that.
Wired from `tests/conftest.py`: every coroutine test gets the `loop_watch` fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.loopclock import Held, WatchedLoop, split
from tests.support.pace import pace, pace_now

#: Seconds one callback may hold the event loop, on the machines the suite's limits were set on:
#: here, `limit()` (this times how much slower this machine runs Python, `tests.support.pace`).
BLOCKED = 0.1

MARKER = "loop_may_block"


class SlowCallbacks(logging.Handler):
    """Collects asyncio's slow-callback reports of callbacks that held the loop `allowed` seconds
    or more, less what `loop` (when it keeps readings) says they spent waiting for a CPU."""

    def __init__(self, allowed: float = BLOCKED, loop: WatchedLoop | None = None) -> None:
        super().__init__(logging.WARNING)
        self.allowed = allowed
        self.loop = loop
        self.found: list[str] = []
        self.times: list[Held | None] = []  # each found callback's time split, where the loop kept one
        self.reported: list[str] = []  # every slow-callback report asyncio made, held or not

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not (message.startswith("Executing ") and " took " in message):
            return
        self.reported.append(message)
        held = self.held(record)
        if held is None:
            self.found.append(message)
            self.times.append(None)
        elif held.held >= self.allowed:
            times = f"held {held.held:.3f}s ({held.running:.3f}s on a CPU) of {held.took:.3f}s, "
            times += f"{held.waiting:.3f}s waiting for a CPU"
            self.found.append(f"{times}: {message[:300]}")
            self.times.append(held)

    def still_held(self, pace_now: float) -> list[str]:
        """The callbacks found that held the loop `BLOCKED` seconds or more at the machine's pace
        now: their time on a CPU divided by `pace_now`, their time asleep in a call in full. One
        whose time was not split counts in full."""
        kept = []
        for message, held in zip(self.found, self.times, strict=True):
            if held is None or max(0.0, held.held - held.running) + held.running / pace_now >= BLOCKED:
                kept.append(message)
        return kept

    def held(self, record: logging.LogRecord) -> Held | None:
        """The reported callback's time split, when its loop kept readings: asyncio logs the
        report from the loop's thread right after its closing clock reading, with the duration
        as the report's last argument."""
        args = record.args
        took = args[-1] if isinstance(args, tuple) and args else None
        if self.loop is None or not isinstance(took, float) or record.thread != self.loop.watched_thread():
            return None
        return split(took, self.loop.readings)


@contextlib.contextmanager
def watching(loop: asyncio.AbstractEventLoop) -> Iterator[SlowCallbacks]:
    """Collect the callbacks that hold `loop` (entered from the loop's thread)."""
    sampled = loop if isinstance(loop, WatchedLoop) and loop.watch() else None
    handler = SlowCallbacks(limit(), sampled) if sampled is not None else SlowCallbacks(limit() * contention())
    logger = logging.getLogger("asyncio")
    debug, duration, level = loop.get_debug(), loop.slow_callback_duration, logger.level
    loop.set_debug(True)
    loop.slow_callback_duration = handler.allowed
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    # The collector's full passes walk every object the whole suite keeps alive (0.2-0.5 s late in
    # a run of tests/unit): the suite's heap, not the code's. Frozen, a pass during the test walks
    # only what the test made, as in a server's own process.
    gc.freeze()
    try:
        yield handler
    finally:
        gc.unfreeze()
        logger.removeHandler(handler)
        logger.setLevel(level)
        loop.slow_callback_duration = duration
        loop.set_debug(debug)
        if sampled is not None:
            sampled.unwatch()


@pytest.fixture
async def loop_watch(request: pytest.FixtureRequest) -> AsyncIterator[SlowCallbacks]:
    """Fails the test when its event loop ran a callback that held it `BLOCKED` seconds or more.
    A test marked `loop_may_block` is not watched at all (debug mode costs a test of 50,000
    requests 10x)."""
    if request.node.get_closest_marker(MARKER) is not None or unwatched(request.node):
        yield SlowCallbacks()
        return
    with watching(asyncio.get_running_loop()) as handler:
        yield handler
    if not handler.found:
        return
    # Found past the limit at the pace the suite began at: judged again at the machine's pace now,
    # which another process of the test (a server, the large-message process) or a neighbour of
    # the machine's may have slowed since (seen: the same work's best round 19.5-32 ms from one run
    # to the next on an idle machine, and up to 41 ms beside a suite).
    now = pace_now()
    held = handler.still_held(now) if handler.loop is not None else handler.found
    if held:
        shown = "\n".join(f"  {m[:400]}" for m in held)
        scaled = f" (time on a CPU divided by {now:.2f}, this machine's pace)" if now > 1 else ""
        pytest.fail(f"the event loop was blocked for more than {BLOCKED:.2f}s:{scaled}\n{shown}", pytrace=False)


def limit() -> float:
    """Seconds one callback may hold the loop on this machine: `BLOCKED`, times how much slower
    than the machines it was set on this one runs Python (`tests.support.pace`)."""
    return BLOCKED * pace()


def contention() -> float:
    """How many times over the machine's CPUs are asked for (the last minute's load), at least 1:
    the limit's factor where the system keeps no schedstat to subtract the waiting exactly.

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
