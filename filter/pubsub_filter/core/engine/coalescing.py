"""Coalescing as the engine does it: each message of a `coalesce` route waits in its own
`Engine.handle` call until its burst ends (then it is decided as usual) or a newer message of
its key displaces it (then it is answered `superseded`). The waits run on the engine's clock
and sleep, so a test moves time by hand; the bookkeeping is `pubsub_filter.core.engine.coalesce`'s.

The surfaces need nothing of their own: push holds the request open while its `handle` waits,
pull holds the message unanswered while the client library keeps extending its lease, and the
in-process call and replay wait as long. A message is never acked while it waits.

Not held, decided at once as without `coalesce` (`Holding.hold` is not asked, or answers
`DECIDE`): a message that cannot be decided (no key, a bad payload), a redelivery of one already
decided or in flight, one older than the key's last forward (stale), one a bypass rule forwards,
one with an ordering key (Pub/Sub delivers a key's next message only once this one is answered:
there is no burst to see), and anything past the bound.

A stop (`release_all`: the signal, `Engine.close`) ends every burst: each held message is
decided at once, within the stop's budget, or cancelled and nacked by the close.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable

import msgspec

from pubsub_filter.core.config.coalesce import Coalesce
from pubsub_filter.core.engine.coalesce import Arrival, Coalescer, Outcome
from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.model import KeyState, Message
from pubsub_filter.core.ports import Clock

log = get_logger("pubsub_filter.engine")

#: The default bounds per process: what one instance may hold at once.
MAX_HELD = 10_000
MAX_HELD_BYTES = 64 * 1024 * 1024


class Answer(msgspec.Struct, frozen=True):
    """What a held message comes to: `decide` it now, or it was `superseded` by message `by`, or
    `replaced` by a later delivery of itself (nack this one)."""

    kind: str
    by: str | None = None


DECIDE = Answer("decide")
REPLACED = Answer("replaced")


def size_of(msg: Message) -> int:
    """What a held message counts against the byte bound: its data and attributes."""
    return len(msg.data) + sum(len(k) + len(v) for k, v in msg.attributes.items())


def decided_already(msg: Message, fp: str, state: KeyState | None, now: float) -> bool:
    """Whether the stored state already answers `msg`, so holding it gains nothing: a
    redelivery of a message forwarded (or in flight) with this content, or a message older than
    the key's last forward (stale). Never held, so never superseding anything."""
    if state is None:
        return False
    if msg.has_id and (msg.message_id, fp) in state.recent:
        return True
    lease = state.lease
    if lease is not None and lease.live(now) and lease.message_id == msg.message_id:
        return True
    return msg.publish_time is not None and state.publish_time is not None and msg.publish_time < state.publish_time


class Holding:
    """The held messages of one engine: each `handle` call waits on its own answer, and one
    timer (a task on the engine's sleep) ends the bursts as they fall due."""

    def __init__(
        self,
        clock: Clock,
        sleep: Callable[[float], Awaitable[None]],
        max_held: int = MAX_HELD,
        max_bytes: int = MAX_HELD_BYTES,
    ) -> None:
        self.clock = clock
        self.sleep = sleep
        self.coalescer = Coalescer(max_held, max_bytes)
        self._waiting: dict[int, asyncio.Future[Answer]] = {}
        self._holders: dict[int, asyncio.Task[object] | None] = {}  # the task waiting for each
        self._tokens = itertools.count(1)
        self.stopping = False
        #: `full`: arrivals decided at once past the bound; `ordered`: with an ordering key
        self.counts: Counter[str] = Counter()
        self._said: set[str] = set()
        self._timer: asyncio.Task[None] | None = None
        self._timer_at: float | None = None  # when the timer wakes next

    def __len__(self) -> int:
        return len(self.coalescer)

    def waiting(self) -> set[asyncio.Task[object] | None]:
        """The tasks waiting, held, for an answer not given yet (a test's view of who is held)."""
        return {self._holders[t] for t, w in self._waiting.items() if not w.done()}

    @property
    def timer(self) -> asyncio.Task[None] | None:
        """The task that ends the bursts as they fall due, while any is held."""
        return self._timer

    async def hold(self, route: str, key: str, coalesce: Coalesce, msg: Message) -> Answer:
        """Wait while `msg` is its burst's newest; what to answer it then."""
        if self.stopping:
            return DECIDE
        if msg.ordering_key:
            self._once("ordered", route, "messages with an ordering key are delivered one at a time: never held")
            return DECIDE
        token = next(self._tokens)
        arrival = Arrival(token, msg.message_id, msg.publish_time, size_of(msg))
        offered = self.coalescer.offer(route, key, coalesce.quiet, coalesce.max_wait, arrival, self.clock.now())
        if offered.displaced is not None:
            self._answer(offered.displaced, Answer("superseded", msg.message_id))
        if offered.replaced is not None:
            self._answer(offered.replaced, REPLACED)
        if offered.outcome is Outcome.SUPERSEDED:
            return Answer("superseded", offered.by)
        if offered.outcome is Outcome.FULL:
            self._once("full", route, "the bound on held messages is reached: decided at once, not coalesced")
            return DECIDE
        answered: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting[token] = answered
        self._holders[token] = asyncio.current_task()
        self._wake_by(self.coalescer.next_end())
        try:
            return await answered
        except asyncio.CancelledError:
            self.coalescer.withdraw(token)  # nacked by the cancel's answer: Pub/Sub has it again
            raise
        finally:
            del self._waiting[token], self._holders[token]

    def release_all(self) -> int:
        """A stop: every held message is decided now, and nothing more is held. How many were held."""
        self.stopping = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        tokens = self.coalescer.release_all()
        for token in tokens:
            self._answer(token, DECIDE)
        if tokens:
            log.info("coalesce_released", held=len(tokens))
        return len(tokens)

    def _wake_by(self, at: float | None) -> None:
        """Have the timer wake by `at` (a burst that ends earlier than it would look next)."""
        if at is None or (self._timer is not None and self._timer_at is not None and self._timer_at <= at):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().create_task(self._ends(at))

    async def _ends(self, at: float) -> None:
        """The timer: sleep until the next burst may end, decide what ended, again while any is held."""
        while True:
            now = self.clock.now()
            if at > now:
                await self.sleep(at - now)
            for token in self.coalescer.due(self.clock.now()):
                self._answer(token, DECIDE)
            following = self.coalescer.next_end()
            if following is None:
                self._timer = self._timer_at = None
                return
            at = self._timer_at = following

    def _answer(self, token: int, answer: Answer) -> None:
        waiting = self._waiting.get(token)
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)

    def _once(self, event: str, route: str, why: str) -> None:
        self.counts[event] += 1
        if event not in self._said:
            self._said.add(event)
            log.warning(f"coalesce_{event}", route=route, reason=why, max_held=self.coalescer.max_held)
