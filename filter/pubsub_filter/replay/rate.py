"""`--rate`: replays paced to at most N a second.

aiolimiter's leaky bucket, one message deep: the first replay goes at once and each next
one waits its share of a second, so a run never bursts above the rate the operator gave
(the destination's subscribers see a steady stream, not a second's worth at once).
"""

from __future__ import annotations

from aiolimiter import AsyncLimiter


class Pace:
    """At most `rate` a second; no limit when `rate` is None."""

    def __init__(self, rate: float | None):
        self._limiter = AsyncLimiter(1, 1.0 / rate) if rate is not None else None

    async def take(self) -> None:
        if self._limiter is not None:
            await self._limiter.acquire()
