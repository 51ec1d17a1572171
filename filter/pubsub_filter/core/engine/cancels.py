"""Work that must not be cut short by a cancel: what has been acted on, and a lease's release."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def despite_one_cancel(work: Awaitable[T]) -> T:
    """`work`'s result, even when cancelled meanwhile: the first cancel is taken back and
    `work` waited for; a second cancel goes through to `work`.

    For what has been acted on, or is being: a publish handed to the publisher (it may land
    after a cancel; the publisher's close flushes it), the commit that records it (the
    commit holding a decision's record is waited for so too, by `Engine.recorded`, without a
    shield: its wait is the caller's own). A shutdown's cancel landing there would nack a
    message whose copy is published, or published again on redelivery. Each is bounded by
    its own timeout (the publisher's, the store's), so the wait ends; a shutdown that cannot
    wait cancels twice. `Engine.close` waits for such decisions before it closes anything.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if task.cancelled() or (current := asyncio.current_task()) is None:
            raise
        current.uncancel()
        return await task


async def to_the_end(work: Awaitable[None]) -> None:
    """Run `work` to its end through any cancel, then let the cancel go on. For a release: the
    store call is bounded by the store's own budget, and a cancel that cut it short would
    answer (and let a shutdown close the store) with the key still leased."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled or task.cancelled():
        raise asyncio.CancelledError
    task.result()
