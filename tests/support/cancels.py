"""Seeing a pull worker's stop cancel its decisions, as the cancel is made (for tests that must
act right after it, with no clock ordering the steps)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def cancels_seen(on_cancel: asyncio.Event) -> Iterator[None]:
    """Tasks made on this loop set `on_cancel` when a pulled message's decision (the worker's
    `_handle`) is cancelled: the stop's cancel, seen as it is made."""
    loop = asyncio.get_running_loop()

    class Watched(asyncio.Task[Any]):
        def cancel(self, msg: Any = None) -> bool:
            cancelling = super().cancel(msg)
            if self.get_coro().__qualname__.endswith("PullWorker._handle"):  # type: ignore[union-attr]
                on_cancel.set()
            return cancelling

    def factory(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> asyncio.Task[Any]:
        return Watched(coro, loop=loop, **kwargs)

    before = loop.get_task_factory()
    loop.set_task_factory(factory)
    try:
        yield
    finally:
        loop.set_task_factory(before)
