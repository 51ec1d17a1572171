"""Large bodies decoded one per turn of the event loop.

Decoding a 10 MB push envelope holds the loop for 10-25 ms (msgspec's scan of the data holds
the GIL, so a thread does not free the loop). Bodies a burst sends together end together, and
their requests' next steps would decode back to back in one turn of the loop, while the health
probe and every other connection wait for all of them. A request with a large body waits here
for its turn: the first takes it and yields once, so its decode runs in a later turn, after the
loop has polled its sockets; the next is woken when it is done, in the turn after that.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Turns:
    """One holder at a time, each starting in a turn of the loop of its own."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Enter when the loop has polled since the last holder left; a cancel while waiting
        leaves nothing held."""
        async with self._lock:
            await asyncio.sleep(0)
            yield
