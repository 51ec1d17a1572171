"""Ordering keys kept by the publisher itself: the publishes of one key are sent one at a time,
each once the one before it has ended.

What google-cloud-pubsub's sequencers do for `PublisherClient`, without its threads: a publish
with a key waits for its turn (the publishes of that key before it, in the order `publish` was
called), holds it until its own attempt ends (confirmed, or failed for good), then hands it on.
A failure hands the turn on too, as the filter has always resumed a key the library paused: the
failed message is nacked and comes back, and the next one is not held hostage to it.

A publish given up while it waits (its deadline, a cancel) still hands its turn on only once
the one before it has ended, so the one after it can never overtake that one. A key with no
publish waiting or under way holds no entry: memory follows the publishes in flight, not the
keys ever seen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class Turns:
    """One queue per key (any hashable: the publisher's is (topic, ordering key))."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        #: per key, the future its latest publish sets as it ends: the one the next waits for
        self._last: dict[Hashable, asyncio.Future[None]] = {}

    def __len__(self) -> int:
        """The keys with a publish waiting or under way."""
        return len(self._last)

    @contextlib.asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        """Wait for `key`'s publishes before this one to end; hold the turn inside the block."""
        before = self._last.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last[key] = mine
        mine.add_done_callback(lambda done: self._forget(key, done))
        try:
            if before is not None and not before.done():
                await asyncio.shield(before)  # a cancel ends our wait, never the publish before us
            yield
        finally:
            if before is None or before.done():
                _end(mine)
            else:  # given up while waiting: the next one still waits for the one before us
                before.add_done_callback(lambda _: _end(mine))

    def _forget(self, key: Hashable, done: asyncio.Future[None]) -> None:
        if self._last.get(key) is done:
            del self._last[key]


def _end(turn: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_result(None)
