"""A clock the test moves by hand: lease expiry and windows without waiting."""

from __future__ import annotations

import asyncio


class ManualClock:
    def __init__(self, start: float = 1_767_225_600.0):  # 2026-01-01T00:00:00Z
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class ManualSleep:
    """An injected `asyncio.sleep` the test ends by hand: the clock moves by the delay asked for.

    `await sleep.asleep()` returns once the code under test is sleeping (so whatever it did
    before that sleep is done); `sleep.wake()` ends that sleep. Nothing waits on real time.
    """

    def __init__(self, clock: ManualClock):
        self.clock = clock
        self.delays: list[float] = []
        self._sleepers: asyncio.Queue[tuple[float, asyncio.Future[None]]] = asyncio.Queue()
        self._current: tuple[float, asyncio.Future[None]] | None = None

    async def __call__(self, delay: float) -> None:
        woken = asyncio.get_running_loop().create_future()
        self.delays.append(delay)
        await self._sleepers.put((delay, woken))
        await woken

    async def asleep(self) -> float:
        """Wait until the code sleeps; the delay it asked for."""
        if self._current is None:
            self._current = await self._sleepers.get()
        return self._current[0]

    async def wake(self) -> None:
        """End the current sleep (waiting for one first), the clock moved by its delay."""
        delay, woken = self._current or await self._sleepers.get()
        self._current = None
        self.clock.advance(delay)
        woken.set_result(None)
