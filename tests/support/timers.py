"""An injected `sleep` on a `ManualClock` whose sleepers wake as the test moves the clock past them.

`Timers.advance(seconds)` moves the clock, waking each sleeper whose time has come, in time order
(the clock stands at each wake-up as it happens). `Timers.settled(tasks)` returns once each of
`tasks` is done, asleep here, or held (waiting on an answer no sleep gives: `held`), looking again
after each step of the loop: what they do before then is done. Nothing waits on
real time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Any

from tests.support.clock import ManualClock


class Timers:
    def __init__(self, clock: ManualClock, held: Callable[[], set[Any]] = set) -> None:
        self.clock = clock
        self.held = held  # the tasks waiting on something other than a sleep that needs a wake-up (held messages)
        self._heap: list[tuple[float, int, asyncio.Future[None], asyncio.Task[Any]]] = []
        self._woken: set[asyncio.Task[Any]] = set()  # woken by `advance`: until they sleep again or end
        self._seq = itertools.count()
        self._asleep: dict[asyncio.Task[Any], asyncio.Future[None]] = {}

    async def __call__(self, delay: float) -> None:
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.current_task()
        assert task is not None
        heapq.heappush(self._heap, (self.clock.now() + max(delay, 0.0), next(self._seq), woken, task))
        self._woken.discard(task)
        self._asleep[task] = woken
        try:
            await woken
        finally:
            self._asleep.pop(task, None)

    def _sleeping(self, task: asyncio.Task[Any]) -> bool:
        woken = self._asleep.get(task)
        return woken is not None and not woken.done()

    async def settled(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        """Until every task is done or asleep here."""
        tasks = list(tasks)
        while True:
            held = self.held()
            self._woken = {t for t in self._woken if not t.done()}
            pending = [t for t in {*tasks, *self._woken} if not t.done() and not self._sleeping(t) and t not in held]
            if not pending:
                return
            # a task becomes held without completing anything: look again after each loop step
            await asyncio.sleep(0)

    async def advance(self, seconds: float, tasks: Iterable[asyncio.Task[Any]] = ()) -> None:
        """Move the clock by `seconds`, waking the sleepers on the way; settle `tasks` after each wake."""
        tasks = list(tasks)
        target = self.clock.now() + seconds
        while self._heap and self._heap[0][0] <= target:
            at, _, woken, sleeper = heapq.heappop(self._heap)
            if woken.done():
                continue  # its sleeper was cancelled
            self.clock.t = max(self.clock.t, at)
            self._woken.add(sleeper)
            woken.set_result(None)
            await asyncio.sleep(0)
            await self.settled(tasks)
        self.clock.t = max(self.clock.t, target)
        await self.settled(tasks)
