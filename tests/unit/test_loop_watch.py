"""The loop watch (`tests.support.loopwatch`) itself: a callback holding the loop past 100 ms
fails a coroutine test, unless the test says why it may."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.loopwatch import BLOCKED, SlowCallbacks, contention

pytest_plugins = ["pytester"]


async def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # noqa: ASYNC251 - what a blocking call on the loop does: nothing else runs meanwhile


async def test_a_callback_holding_the_loop_past_the_limit_is_reported(loop_watch: SlowCallbacks) -> None:
    await asyncio.create_task(hold_the_loop(BLOCKED * contention() * 2))
    assert len(loop_watch.found) == 1 and "hold_the_loop" in loop_watch.found[0]
    loop_watch.found.clear()  # seen: this test blocked its loop on purpose


async def test_callbacks_that_yield_are_not_reported(loop_watch: SlowCallbacks) -> None:
    for _ in range(3):
        await asyncio.sleep(BLOCKED / 2)  # waiting is not holding the loop
    assert loop_watch.found == []


def test_a_coroutine_test_that_blocks_its_loop_fails_unless_marked(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from tests.conftest import loop_watch, pytest_collection_modifyitems  # noqa: F401\n")
    pytester.makepyfile(
        """
        import time
        import pytest
        from tests.support.loopwatch import contention
        CONTENTION = contention()

        async def test_blocks():
            time.sleep(0.25 * CONTENTION)

        @pytest.mark.loop_may_block("on purpose")
        async def test_blocks_and_says_why():
            time.sleep(0.25 * CONTENTION)

        async def test_yields():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:bqemulator", "-o", "asyncio_mode=auto")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*the event loop was blocked for more than *s:*"])
