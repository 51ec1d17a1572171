"""The coalescer: per route and key, the newest message of a burst held, every older one superseded.

Pure: no I/O, no clock of its own, no awaiting. Each call is given the time (the engine's
clock), and says what to answer; `pubsub_filter.core.engine.coalescing` does the waiting for the engine.

A **burst** is the messages of one route and key that arrive within `quiet` of each other. Of
its messages only the newest (by publish time, as the stale guard orders them; equal or unknown
times: the later arrival) is held. A newer arrival displaces the held one, which is answered
`superseded` by it; an older arrival is answered `superseded` by the held one at once. Either
way a message is superseded only by one that is held here, not yet decided and so not yet
acked: if this process dies, Pub/Sub still has the newest content and redelivers it.

The burst ends (`due_at`) once its key was quiet for `quiet`, or `max_wait` after its first
message, whichever comes first; its held message is then `take`n and decided as usual. What
arrives after that begins a new burst.

Bounded: at most `max_held` messages and `max_bytes` of their data and attributes are held at
once; past either bound an arrival is not held (`FULL`: decided at once, as without coalesce).
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass


class Outcome(enum.Enum):
    HELD = "held"  # held as its burst's newest: wait until `due_at`, or until displaced
    SUPERSEDED = "superseded"  # older than the burst's held message: answer `superseded` now
    FULL = "full"  # the bound is reached: decide it at once


@dataclass(frozen=True, slots=True)
class Arrival:
    """One message offered: `token` names it in the answers (unique per arrival, even for a
    redelivery of the same message id)."""

    token: int
    message_id: str
    publish_time: float | None
    size: int


@dataclass(frozen=True, slots=True)
class Offered:
    """What to answer the arrival, and the earlier arrival it displaced, if any."""

    outcome: Outcome
    #: SUPERSEDED: the id of the held message that supersedes this arrival
    by: str | None = None
    #: HELD: the arrival this one displaced, to answer `superseded` by this one
    displaced: int | None = None
    #: HELD: an earlier delivery of this same message, held until now: nack it, this one is held instead
    replaced: int | None = None


@dataclass(slots=True)
class _Burst:
    held: Arrival
    first_at: float
    last_at: float
    quiet: float
    max_wait: float

    def due_at(self) -> float:
        return min(self.last_at + self.quiet, self.first_at + self.max_wait)


def newer(a: Arrival, than: Arrival) -> bool:
    """`a` orders after `than`: not published before it (the stale guard's order; a time that is
    unknown orders by arrival, so the later arrival is the newer)."""
    return a.publish_time is None or than.publish_time is None or a.publish_time >= than.publish_time


class Coalescer:
    """Every burst under way in this process, bounded by count and bytes."""

    __slots__ = ("_bursts", "_ends", "_where", "held_bytes", "max_bytes", "max_held")

    def __init__(self, max_held: int, max_bytes: int) -> None:
        self.max_held = max_held
        self.max_bytes = max_bytes
        self._bursts: dict[tuple[str, str], _Burst] = {}
        self._where: dict[int, tuple[str, str]] = {}  # held token -> its burst
        # (when a burst ends, as far as known when it was pushed; its key): a burst that went
        # on since ends later, and is pushed again when its entry comes up (`due`)
        self._ends: list[tuple[float, tuple[str, str]]] = []
        self.held_bytes = 0

    def __len__(self) -> int:
        return len(self._bursts)

    def offer(self, route: str, key: str, quiet: float, max_wait: float, arrival: Arrival, now: float) -> Offered:
        """`arrival` on (route, key) at `now`: hold it, supersede it, or say it cannot be held."""
        at = (route, key)
        burst = self._bursts.get(at)
        if burst is None:
            if len(self._bursts) >= self.max_held or self.held_bytes + arrival.size > self.max_bytes:
                return Offered(Outcome.FULL)
            burst = self._bursts[at] = _Burst(arrival, now, now, quiet, max_wait)
            heapq.heappush(self._ends, (burst.due_at(), at))
            self._where[arrival.token] = at
            self.held_bytes += arrival.size
            return Offered(Outcome.HELD)
        held = burst.held
        burst.last_at = max(burst.last_at, now)  # any arrival keeps the key from being quiet
        if arrival.message_id == held.message_id:
            # Pub/Sub delivered the held message again (its deadline passed): hold the newer
            # delivery, whose ack still counts, and nack the older one (never ack it: that would
            # ack the message itself, undecided).
            self._swap(burst, at, arrival)
            return Offered(Outcome.HELD, replaced=held.token)
        if not newer(arrival, held):
            return Offered(Outcome.SUPERSEDED, by=held.message_id)
        if self.held_bytes - held.size + arrival.size > self.max_bytes:
            return Offered(Outcome.FULL)  # decided now; the held older one is decided later (stale, at worst)
        self._swap(burst, at, arrival)
        return Offered(Outcome.HELD, displaced=held.token)

    def _swap(self, burst: _Burst, at: tuple[str, str], arrival: Arrival) -> None:
        old = burst.held
        del self._where[old.token]
        self.held_bytes += arrival.size - old.size
        burst.held = arrival
        self._where[arrival.token] = at

    def due_at(self, token: int) -> float | None:
        """When the burst `token` is held in ends; None when it is not held (any more)."""
        at = self._where.get(token)
        return self._bursts[at].due_at() if at is not None else None

    def take(self, token: int, now: float) -> bool:
        """Hand `token` over to be decided if its burst has ended by `now`: it is then no longer
        held, and what arrives for its key next begins a new burst."""
        at = self._where.get(token)
        if at is None or self._bursts[at].due_at() > now:
            return False
        self._drop(at)
        return True

    def next_end(self) -> float | None:
        """The earliest a burst may end (a burst that went on since ends later): when to look again."""
        return self._ends[0][0] if self._ends else None

    def due(self, now: float) -> list[int]:
        """Every burst that has ended by `now`: its held token, taken (no longer held)."""
        taken: list[int] = []
        ends = self._ends
        while ends and ends[0][0] <= now:
            _, at = heapq.heappop(ends)
            burst = self._bursts.get(at)
            if burst is None:
                continue  # taken, withdrawn or released since; a later burst of the key has its own entry
            end = burst.due_at()
            if end > now:
                heapq.heappush(ends, (end, at))  # it went on
                continue
            taken.append(burst.held.token)
            self._drop(at)
        return taken

    def withdraw(self, token: int) -> None:
        """`token` is no longer waiting (its caller was cancelled: its message is nacked)."""
        if (at := self._where.get(token)) is not None:
            self._drop(at)

    def release_all(self) -> list[int]:
        """Every held token, no longer held: a stop decides them now (the newest of each key)."""
        tokens = list(self._where)
        self._bursts.clear()
        self._where.clear()
        self._ends.clear()
        self.held_bytes = 0
        return tokens

    def _drop(self, at: tuple[str, str]) -> None:
        burst = self._bursts.pop(at)
        del self._where[burst.held.token]
        self.held_bytes -= burst.held.size
