"""An event loop whose clock readings also record how long its thread had been waiting for a CPU,
so the loop watch (`tests.support.loopwatch`) can tell a callback that held its loop from one
that a busy machine merely kept off the CPU.

Linux keeps, per thread, the time it ran and the time it was runnable but waiting for a CPU
(`/proc/thread-self/schedstat`, nanoseconds). asyncio's debug mode times each callback between
two readings of `loop.time()` and reports only the difference, after the fact; `WatchedLoop.time`
(the loop's public clock, overridden) keeps each reading with the thread's waiting time beside
it, so the report's duration finds the reading it started from. Time spent asleep in a syscall
(a lock, a file, `time.sleep`) is not waiting for a CPU: it counts in full, which is what the
watch is for. (One exception, measured on Linux 6.18: a thread at the lowest priority, nice 19,
had up to 0.19 s of a 0.2 s sleep counted as waiting, 2 times in 30; at nice 0, where tests
run, and at nice 10, never in 30.)
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

SCHEDSTAT = "/proc/thread-self/schedstat"

#: Clock readings kept: a callback that reads the loop's clock more often than this while it runs
#: loses its start, and then counts in full.
READINGS = 10_000

#: Two readings of the clock `took` apart: the float subtraction may differ in its last bits.
SAME_READING = 1e-9


@dataclass(frozen=True)
class Reading:
    clock: float  # what `loop.time()` returned
    waiting: float  # seconds the loop's thread had been runnable without a CPU, so far
    running: float = 0.0  # seconds it had been on a CPU, so far


@dataclass(frozen=True)
class Held:
    """One callback's time, as asyncio measured it, and the part of it spent waiting for a CPU."""

    took: float
    waiting: float
    running: float = 0.0  # of it, on a CPU (the rest of what it held: asleep in a call)

    @property
    def held(self) -> float:
        """What the callback itself held the loop for: running, or asleep in a call it made."""
        return self.took - self.waiting


def split(took: float, readings: Sequence[Reading]) -> Held:
    """The callback that ended at the last reading and took `took` seconds by the clock: its
    waiting for a CPU is the difference from the reading it started at. A start no longer kept
    (or never sampled) subtracts nothing: the whole time counts."""
    if not readings:
        return Held(took, 0.0)
    end = readings[-1]
    start = end.clock - took
    for reading in reversed(readings):
        if abs(reading.clock - start) <= SAME_READING:
            return Held(took, min(took, max(0.0, end.waiting - reading.waiting)), end.running - reading.running)
        if reading.clock < start:
            break
    return Held(took, 0.0)


def parse(schedstat: bytes) -> float:
    """Seconds waited for a CPU, from schedstat's `on-cpu-ns waiting-ns timeslices`."""
    return int(schedstat.split()[1]) / 1e9


def reading(clock: float, schedstat: bytes) -> Reading:
    running, waiting = schedstat.split()[:2]
    return Reading(clock, int(waiting) / 1e9, int(running) / 1e9)


def waited_for_cpu() -> float:
    """Seconds this thread has been runnable without a CPU so far; 0.0 where the system keeps no
    schedstat (a `Stopwatch` then subtracts nothing)."""
    try:
        with open(SCHEDSTAT, "rb") as stats:
            return parse(stats.read())
    except (OSError, ValueError, IndexError):
        return 0.0


class Stopwatch:
    """For a test that times a step on its loop itself: the wall time since it was made, less the
    time this thread waited for a CPU meanwhile (what a busy machine took, not the step)."""

    def __init__(self) -> None:
        self._started, self._waited = time.perf_counter(), waited_for_cpu()

    def held(self) -> float:
        return (time.perf_counter() - self._started) - (waited_for_cpu() - self._waited)


class WatchedLoop(asyncio.SelectorEventLoop):
    """The event loop of coroutine tests (`pytest_asyncio_loop_factories` in tests/conftest.py).
    It behaves as the default loop; between `watch()` and `unwatch()` every reading of its clock
    from its own thread is kept with that thread's waiting time."""

    def __init__(self) -> None:
        self._schedstat: int | None = None
        self._thread = 0
        self.readings: deque[Reading] = deque(maxlen=READINGS)
        super().__init__()

    def watch(self) -> bool:
        """Start keeping readings (call it from the loop's thread). False where the system keeps
        no schedstat: nothing is kept then."""
        self.unwatch()
        try:
            fd = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            return False
        try:
            parse(os.pread(fd, 64, 0))
        except (OSError, ValueError, IndexError):
            os.close(fd)
            return False
        self._schedstat, self._thread = fd, threading.get_ident()
        return True

    def unwatch(self) -> None:
        fd, self._schedstat = self._schedstat, None
        if fd is not None:
            os.close(fd)
        self.readings.clear()

    def watched_thread(self) -> int | None:
        """The thread whose readings are kept (`threading.get_ident()`), while watched."""
        return self._thread if self._schedstat is not None else None

    def time(self) -> float:
        now = super().time()
        fd = self._schedstat
        if fd is not None and threading.get_ident() == self._thread:
            self.readings.append(reading(now, os.pread(fd, 64, 0)))
        return now

    def close(self) -> None:
        self.unwatch()
        super().close()
