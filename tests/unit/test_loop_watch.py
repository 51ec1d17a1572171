"""The loop watch (`tests.support.loopwatch`) itself: a callback holding the loop past 100 ms
fails a coroutine test, unless the test says why it may; a callback that only waited for a CPU
(a busy machine) is not held."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.support.loopclock import SCHEDSTAT, Held, Reading, Stopwatch, WatchedLoop, split
from tests.support.loopwatch import BLOCKED, SlowCallbacks, contention, limit, watching
from tests.support.pace import REFERENCE, best_round, factor, pace

pytest_plugins = ["pytester"]

HAS_SCHEDSTAT = os.path.exists(SCHEDSTAT)
needs_schedstat = pytest.mark.skipif(not HAS_SCHEDSTAT, reason="Linux schedstat: the watch scales by load instead")


async def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # noqa: ASYNC251 - what a blocking call on the loop does: nothing else runs meanwhile


async def test_a_callback_holding_the_loop_past_the_limit_is_reported(loop_watch: SlowCallbacks) -> None:
    await asyncio.create_task(hold_the_loop(limit() * contention() * 2))
    assert len(loop_watch.found) == 1 and "hold_the_loop" in loop_watch.found[0]
    loop_watch.found.clear()  # seen: this test blocked its loop on purpose


async def test_callbacks_that_yield_are_not_reported(loop_watch: SlowCallbacks) -> None:
    for _ in range(3):
        await asyncio.sleep(BLOCKED / 2)  # the thing under test: waiting is not holding the loop
    assert loop_watch.found == []


@needs_schedstat
async def test_coroutine_tests_run_on_the_loop_that_subtracts_waiting_for_a_cpu(loop_watch: SlowCallbacks) -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, WatchedLoop) and loop_watch.loop is loop and loop_watch.allowed == limit()
    assert loop.readings, "the watched loop keeps its clock readings"


def test_a_coroutine_test_that_blocks_its_loop_fails_unless_marked(pytester: pytest.Pytester) -> None:
    wired = "loop_watch, pytest_asyncio_loop_factories, pytest_collection_modifyitems"
    pytester.makeconftest(f"from tests.conftest import {wired}  # noqa: F401\n")
    pytester.makepyfile(
        """
        import time
        import pytest
        from tests.support.loopwatch import contention, limit
        HOLD = 2.5 * limit() * contention()

        async def test_blocks():
            time.sleep(HOLD)  # holds the loop on purpose

        @pytest.mark.loop_may_block("on purpose")
        async def test_blocks_and_says_why():
            time.sleep(HOLD)  # holds the loop on purpose

        async def test_yields():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:bqemulator", "-o", "asyncio_mode=auto")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*the event loop was blocked for more than *s:*"])


def test_the_time_a_callback_waited_for_a_cpu_is_subtracted_from_what_it_took() -> None:
    readings = [
        Reading(100.0, 2.0),  # asyncio's reading before the callback
        Reading(100.05, 2.01),  # the callback read the loop's clock itself
        Reading(100.3, 2.25),  # asyncio's reading after it
    ]
    assert split(0.3, readings).waiting == pytest.approx(0.25)
    assert split(0.3, readings).held == pytest.approx(0.05)
    # asyncio's start reading no longer kept (or never sampled): nothing is subtracted
    assert split(0.3, readings[1:]).held == pytest.approx(0.3)
    assert split(0.3, []).held == pytest.approx(0.3)
    # waiting never counts for more than the callback took
    assert split(0.25, [Reading(1.0, 0.0), Reading(1.25, 9.0)]).held == 0.0


SPIN = "import time\nend = time.monotonic() + 120\nprint('spinning', flush=True)\nwhile time.monotonic() < end: pass\n"


@contextmanager
def every_cpu_busy() -> Iterator[None]:
    """Two processes spinning on each CPU, at the default priority, until the block ends (each
    also ends itself after two minutes, should this process be killed first)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    try:
        for spinner in spinners:
            assert spinner.stdout is not None and spinner.stdout.readline() == "spinning\n"
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
            if spinner.stdout is not None:
                spinner.stdout.close()


def run_kept_off_the_cpu(callback: Callable[[], None]) -> SlowCallbacks:
    """Run `callback` once on a watched loop whose thread has a low priority while every CPU is
    busy: it gets at most 110/2158 of a CPU (weights of nice 10 and 0), so it waits for one most of
    the time it is runnable. (Not the lowest: at nice 19 Linux 6.18 counted up to 0.19 s of a
    0.2 s sleep as waiting, 2 times in 30; at nice 0 and 10, never.)"""
    watched: list[SlowCallbacks] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with watching(loop) as handler:
            ran = loop.create_future()
            loop.call_soon(lambda: (callback(), ran.set_result(None)))
            await ran
        watched.append(handler)

    def thread() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # Linux: this thread only
        loop = WatchedLoop()
        try:
            loop.run_until_complete(main())
        finally:
            loop.close()

    with every_cpu_busy():
        runner = threading.Thread(target=thread, name="kept-off-the-cpu")
        runner.start()
        runner.join(timeout=120)
    assert not runner.is_alive() and len(watched) == 1
    return watched[0]


def burn(cpu_seconds: float) -> None:
    """Run (never sleep) until this thread has had `cpu_seconds` of CPU."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


@needs_schedstat
def test_a_callback_that_only_waited_for_a_cpu_is_not_reported() -> None:
    watched = run_kept_off_the_cpu(lambda: burn(BLOCKED / 4))  # at most 5 % of a CPU: 0.5 s or more
    assert len(watched.reported) == 1, "precondition: asyncio saw the callback take past the limit"
    assert watched.found == [], watched.found


@needs_schedstat
def test_a_callback_asleep_on_the_loop_is_reported_though_it_also_waited_for_a_cpu() -> None:
    watched = run_kept_off_the_cpu(lambda: time.sleep(limit() * 2))  # holds the loop on purpose
    assert len(watched.found) == 1 and "waiting for a CPU" in watched.found[0], watched.reported


@needs_schedstat
def test_a_stopwatch_counts_what_a_step_ran_not_what_it_waited_for_a_cpu() -> None:
    timed: list[tuple[float, float]] = []

    def thread() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # Linux: this thread only
        started, watch = time.perf_counter(), Stopwatch()
        burn(BLOCKED / 4)
        timed.append((time.perf_counter() - started, watch.held()))

    with every_cpu_busy():
        runner = threading.Thread(target=thread, name="kept-off-the-cpu")
        runner.start()
        runner.join(timeout=120)
    [(wall, held)] = timed
    assert wall >= BLOCKED, "precondition: the step took past the limit by the wall clock"
    assert held < BLOCKED, (wall, held)


# --- the machine's pace ------------------------------------------------------------------------


def test_a_machine_slower_than_where_the_limits_were_set_grows_them_by_as_much_and_a_faster_keeps_them() -> None:
    assert factor(REFERENCE * 2) == pytest.approx(2.0)
    assert factor(REFERENCE) == 1.0
    assert factor(REFERENCE / 3) == 1.0


def test_the_pace_is_measured_from_work_that_takes_this_machine_a_measurable_time() -> None:
    best = best_round(rounds=3)
    assert 0.001 < best < 10, best
    assert pace() >= 1.0


def test_a_callback_on_a_cpu_past_the_limit_but_within_the_machines_pace_is_not_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a machine twice as slow, 150 ms on a CPU is what 75 ms was where the limit was set; 250 ms
    is past it still."""
    monkeypatch.setattr("tests.support.loopwatch.pace", lambda: 2.0)

    def run(cpu_seconds: float) -> SlowCallbacks:
        async def main() -> SlowCallbacks:
            loop = asyncio.get_running_loop()
            with watching(loop) as handler:
                ran = loop.create_future()
                loop.call_soon(lambda: (burn(cpu_seconds), ran.set_result(None)))
                await ran
            return handler

        loop = WatchedLoop()
        try:
            return loop.run_until_complete(main())
        finally:
            loop.close()

    within, past = run(BLOCKED * 1.5), run(BLOCKED * 2.5)
    assert within.allowed == pytest.approx(BLOCKED * 2.0 * (1 if HAS_SCHEDSTAT else contention()))
    assert within.found == [], within.found  # asyncio itself times callbacks against the allowed limit
    assert len(past.found) == 1, past.reported


def test_a_found_callback_is_judged_again_at_the_pace_by_its_time_on_a_cpu_and_in_full_by_its_time_asleep() -> None:
    handler = SlowCallbacks()
    handler.found += ["ran", "slept", "not split"]
    handler.times += [Held(0.16, 0.0, 0.16), Held(0.16, 0.0, 0.01), None]
    assert handler.still_held(2.0) == ["slept", "not split"]  # 0.16 s on a CPU at half speed: 0.08 s
    assert handler.still_held(1.0) == ["ran", "slept", "not split"]
