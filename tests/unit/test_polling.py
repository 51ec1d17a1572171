"""The deadline helpers tests wait with (`tests.support.polling`): they return what the condition
found, fail loudly naming what never happened, and let an assert in the condition end the wait."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support.polling import eventually, wait_until


def test_wait_until_returns_what_the_condition_found() -> None:
    looks = itertools.count()
    assert wait_until(lambda: next(looks) >= 3 and "found", 10, "never", poll=0) == "found"


def test_wait_until_fails_naming_what_never_happened() -> None:
    with pytest.raises(AssertionError, match=r"not within 0\.01s: the flag was never set"):
        wait_until(lambda: False, 0.01, lambda: "the flag was never set", poll=0.001)


async def test_eventually_awaits_a_coroutine_condition_and_lets_other_tasks_run() -> None:
    flag = asyncio.Event()
    setter = asyncio.get_running_loop().call_soon(flag.set)  # runs only if eventually yields

    async def is_set() -> bool:
        return flag.is_set()

    assert await eventually(is_set, 10, "the other task never ran") is True
    setter.cancel()


async def test_eventually_fails_naming_what_never_happened_and_an_assert_ends_it() -> None:
    with pytest.raises(AssertionError, match=r"not within 0\.01s: no lease"):
        await eventually(lambda: None, 0.01, "no lease", poll=0.001)

    def gone() -> bool:
        raise AssertionError("the worker exited")

    with pytest.raises(AssertionError, match="the worker exited"):
        await eventually(gone, 10, "never reached")
