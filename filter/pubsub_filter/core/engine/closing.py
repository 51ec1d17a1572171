"""The decisions under way, and the one close sequence that waits for them.

`Deciding` is the one registry of work in flight: `Engine.handle` enters each call in it, and
the close below, the pull worker's drain and the in-process `Filter.close` wait on it.
`close` is the ordered exit every surface ends with, inside one budget (`pubsub_filter.core.engine.stopping`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from pubsub_filter.core.engine.stopping import CLOSE, DRAIN, PUBLISHER, RECORDS, RELEASE, Stop
from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.ports import DecisionObserver, DecisionRecorder, Publisher, StateStore

log = get_logger("pubsub_filter.engine")


class Deciding:
    """Every decision under way (an `Engine.handle` call): a future, done as it ends, by the task running it."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: dict[asyncio.Future[None], asyncio.Task[Any] | None] = {}

    def under_way(self) -> set[asyncio.Future[None]]:
        """A future for each decision under way in a task other than this one."""
        current = asyncio.current_task()
        return {done for done, task in self.calls.items() if task is not current}

    def here(self) -> bool:
        """Whether this task is inside a decision (a body calling back in)."""
        current = asyncio.current_task()
        return any(task is current for task in self.calls.values())

    async def wait(self, grace: float) -> bool:
        """Wait up to `grace` seconds for the decisions under way; whether none is left."""
        if pending := self.under_way():
            await asyncio.wait(pending, timeout=grace)
        return not self.under_way()

    async def abandon(self, stop: Stop) -> None:
        """Cancel the decisions still under way; wait for their releases until the stop's share for them."""
        if await self.wait(stop.left(PUBLISHER)):
            return
        current = asyncio.current_task()
        left = [task for task in self.calls.values() if task is not None and task is not current]
        log.warning("cancelling_decisions", count=len(left), budget_s=stop.budget)
        for task in left:
            task.cancel()  # a publish that does not end: release the lease, record it, nack
        await asyncio.sleep(0)  # the cancels land; one past its publish is taken back...
        for task in left:
            if not task.done() and not task.cancelling():
                task.cancel()  # ...unless a surface's cancel was that one: this one goes through
        # a release slower than this (a store outage at the stop) is left to lapse by itself
        if not await self.wait(stop.left(RELEASE)):
            log.error("decisions_abandoned", count=len(self.calls))


async def close(
    deciding: Deciding,
    publisher: Publisher | None,
    recorder: DecisionRecorder,
    store: StateStore,
    telemetry: DecisionObserver,
    stop: Stop,
) -> None:
    """`Engine.close`: each step in its order, ending at its share of `stop`. Each step runs
    even when one before it failed or ran out of time."""
    async with contextlib.AsyncExitStack() as steps:  # run last to first
        steps.callback(telemetry.shutdown)
        steps.push_async_callback(within, "store", store.close, stop, CLOSE)
        steps.push_async_callback(lambda: recorder.close(stop.left(RECORDS)))
        steps.push_async_callback(deciding.abandon, stop)
        # Pub/Sub's close flushes what it holds: a stalled publish lands or fails now, and its
        # decision commits or releases, rather than be abandoned and published again.
        if publisher is not None:
            steps.push_async_callback(within, "publisher", publisher.close, stop, PUBLISHER)
        # A surface may have cancelled them once already: past their publish a cancel is taken
        # back (`cancels.despite_one_cancel`), so their commits and records come first.
        await deciding.wait(stop.left(DRAIN))


async def within(step: str, close: Callable[[], Awaitable[None]], stop: Stop, share: float) -> None:
    """`close()`, given up at the stop's `share`: a step that hangs costs only its own share."""
    try:
        async with asyncio.timeout(stop.left(share)):
            await close()
    except TimeoutError:
        log.error("close_step_cut", step=step, budget_s=stop.budget)
