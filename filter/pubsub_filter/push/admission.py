"""What the push endpoint takes in at once, and whose time a body's wait is.

`BytesInFlight`: the bodies admitted and not yet answered, in bytes, at most
`server.max_bytes_in_flight`. A large message costs many times its body while it is decided
(`pubsub_filter.core.engine.offload`), and its body and data while it waits for its turn. Past
the bound a push waits for room, unread, up to `server.admission_wait`, and is answered 429 with
`Retry-After` if none came, rather than read and held until memory runs out or its wait outlasts
`server.body_timeout`. One push is always admitted, whatever its size, so the largest valid push
is decided when nothing else is in flight.

`LoopLag`: how long the event loop was held, so that `server.body_timeout` measures the sender
and never the server's own delay: while the loop is busy (a decision's step, a garbage
collection, the CPU taken by another process) no byte of any body is read, and that time is
not the sender's.
"""

from __future__ import annotations

import asyncio
from collections import deque

#: Seconds between the lag watch's ticks: how late a tick runs is how long the loop was held.
TICK = 0.025


class BytesInFlight:
    """Push bodies admitted and not yet answered, in bytes (`admit` or `admit_within`, then
    `release` the same size).

    A push that does not fit may wait for room (`admit_within`), its body unread: the sender's
    bytes wait in its connection, where they cost this process nothing, instead of a 429 whose
    body is sent again at once. Room is offered to the waiting pushes in the order they came, as
    it is released."""

    __slots__ = ("bound", "held", "waiting")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.held = 0
        #: each waiting push's size, and the future `release` resolves once it is admitted
        self.waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, size: int) -> bool:
        return not self.held or self.held + size <= self.bound

    def admit(self, size: int) -> bool:
        """Whether a body of `size` bytes is admitted now: within the bound, or the only one in flight."""
        if not self._fits(size):
            return False
        self.held += size
        return True

    async def admit_within(self, size: int, seconds: float) -> bool:
        """Whether a body of `size` bytes was admitted within `seconds`: at once, or as room was
        released to it. A wait cancelled or timed out leaves nothing held."""
        if self.admit(size):
            return True
        if seconds <= 0:
            return False
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, turn)
        self.waiting.append(entry)
        try:
            async with asyncio.timeout(seconds):
                # shielded: a timeout or a cancel must not cancel `turn`, which says whether room
                # was given meanwhile (`release` admits in the same step that wakes this one)
                await asyncio.shield(turn)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if turn.done():  # admitted as it was cancelled: the room goes back
                self.release(size)
            raise
        finally:
            if not turn.done():  # only `release` resolves it
                self.waiting.remove(entry)
        return turn.done()

    def release(self, size: int) -> None:
        self.held -= size
        if not self.waiting:  # every push's answer: nobody waits, as a rule
            return
        for entry in list(self.waiting):  # a few at most: one per push waiting
            if self._fits(entry[0]):
                self.waiting.remove(entry)
                self.held += entry[0]
                entry[1].set_result(None)


class LoopLag:
    """The seconds the running event loop was held, in total, while anyone watches (`watch`/`unwatch`).

    A tick every `TICK` seconds: how late it runs is time the loop did not answer. `held()`
    counts a tick that is overdue right now, so a deadline checked right after a long hold
    already sees it."""

    __slots__ = ("_due", "_handle", "_loop", "_total", "watchers")

    def __init__(self) -> None:
        self._total = 0.0
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.watchers = 0

    def watch(self) -> float:
        """Start watching (the loop this runs on); the reading to subtract from a later `held()`."""
        self.watchers += 1
        loop = asyncio.get_running_loop()
        if self._handle is None or self._loop is not loop:
            self._loop = loop
            self._schedule(loop.time())
        return self.held()

    def unwatch(self) -> None:
        self.watchers -= 1

    def held(self) -> float:
        if self._handle is None or self._loop is None:
            return self._total
        return self._total + max(0.0, self._loop.time() - self._due)

    def _schedule(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + TICK
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self._total += max(0.0, now - self._due)
        if self.watchers > 0:
            self._schedule(now)
        else:
            self._handle = None


class SenderDeadline:
    """Expires `timeout` (an `asyncio.timeout` entered `within` seconds of the sender's ago at its
    `when()`) once the sender has had `within` seconds: the time `lag` says the loop was held
    meanwhile moves the deadline. `close` when the body is read."""

    __slots__ = ("_deadline", "_handle", "_lag", "_loop", "_since", "_timeout")

    def __init__(self, timeout: asyncio.Timeout, lag: LoopLag, within: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout
        self._lag = lag
        when = timeout.when()
        self._deadline = when if when is not None else self._loop.time() + within
        self._since = lag.watch()
        timeout.reschedule(None)  # `_expire` decides when it fires
        self._handle = self._loop.call_at(self._deadline, self._expire)

    def _expire(self) -> None:
        now = self._loop.time()
        left = self._deadline + self._lag.held() - self._since - now  # the sender's time still left
        if left > 0:
            self._handle = self._loop.call_at(now + left, self._expire)
        else:
            self._timeout.reschedule(now)

    def close(self) -> None:
        self._handle.cancel()
        self._lag.unwatch()
