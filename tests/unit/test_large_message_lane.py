"""The lane that decides large messages off the event loop (`core.engine.offload`): each step
runs with the garbage collector off and the interpreter handing the GIL over often, and puts
both back as it found them, whether the step returns or raises."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest

from pubsub_filter.core.engine.offload import STEP_SWITCH_INTERVAL
from pubsub_filter.core.engine.offload import ThreadLane as Lane


def _settings() -> tuple[bool, float]:
    return gc.isenabled(), sys.getswitchinterval()


def test_a_step_runs_without_the_collector_and_with_a_short_switch_interval_then_puts_both_back() -> None:
    lane = Lane()
    before = _settings()

    async def main() -> tuple[bool, float]:
        try:
            return await lane.run(_settings)
        finally:
            lane.close()

    during = asyncio.run(main())
    assert during == (False, STEP_SWITCH_INTERVAL)
    assert _settings() == before


def test_a_step_that_raises_still_puts_the_collector_and_the_switch_interval_back() -> None:
    lane = Lane()
    before = _settings()

    def fails() -> None:
        raise ValueError("the step's own error")

    async def main() -> None:
        try:
            await lane.run(fails)
        finally:
            lane.close()

    with pytest.raises(ValueError, match="the step's own error"):
        asyncio.run(main())
    assert _settings() == before


def test_a_step_never_lengthens_a_switch_interval_set_shorter_than_its_own() -> None:
    lane = Lane()
    old = sys.getswitchinterval()
    sys.setswitchinterval(STEP_SWITCH_INTERVAL / 2)
    try:

        async def main() -> float:
            try:
                return await lane.run(sys.getswitchinterval)
            finally:
                lane.close()

        assert asyncio.run(main()) == pytest.approx(STEP_SWITCH_INTERVAL / 2)
        assert sys.getswitchinterval() == pytest.approx(STEP_SWITCH_INTERVAL / 2)
    finally:
        sys.setswitchinterval(old)


def test_overlapping_steps_of_two_lanes_leave_the_interpreter_as_they_found_it() -> None:
    import threading

    first, second = Lane(), Lane()
    before = _settings()
    inside = threading.Barrier(2)
    seen: list[tuple[bool, float]] = []

    def step() -> None:
        inside.wait(timeout=10)  # both steps are running now
        seen.append(_settings())
        inside.wait(timeout=10)

    async def main() -> None:
        try:
            await asyncio.gather(first.run(step), second.run(step))
        finally:
            first.close()
            second.close()

    asyncio.run(main())
    assert seen == [(False, STEP_SWITCH_INTERVAL)] * 2
    assert _settings() == before
