"""In-memory stand-ins for OUR interfaces (`core.ports.Publisher`, `DecisionRecorder`, a switchable store).

They fake the engine's collaborators, never a Google client: tests that claim to cover
Pub/Sub or Firestore run against the emulators.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from collections import Counter
from collections.abc import Mapping
from typing import Any, NamedTuple

from pubsub_filter.core.model import Decision, DecisionRecord, KeyState
from pubsub_filter.core.ports import PublishFailed, StateStore, StoreUnavailable


class Published(NamedTuple):
    """One confirmed publish; unpacks as (destination, data, attributes, ordering_key)."""

    destination: str
    data: bytes
    attributes: dict[str, str]
    ordering_key: str | None


class MemoryPublisher:
    """Keeps what was published, in order.

    - `fail = True` makes every publish raise `PublishFailed`; `fail_next = n` only the next n.
    - `gate`: an `asyncio.Event` each publish waits for before confirming (holds it in flight).
    - `delay`: seconds each publish takes.
    - `started` is set when a publish starts; `in_flight` / `max_in_flight` count overlap,
      overall and per value of the `track` attribute (e.g. the entity key).
    """

    def __init__(
        self,
        *,
        fail: bool = False,
        gate: asyncio.Event | None = None,
        delay: float = 0.0,
        track: str | None = None,
    ):
        self.fail = fail
        self.fail_next = 0
        self.gate = gate
        self.delay = delay
        self.track = track
        self.published: list[Published] = []
        self.ids: list[str] = []  # the id returned for each entry of `published`
        self.attempts = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.in_flight_by: Counter[str] = Counter()
        self.max_in_flight_by: Counter[str] = Counter()
        self.started = asyncio.Event()
        self.closed = False
        self._ids = itertools.count(1)

    async def publish(
        self,
        destination: str,
        data: bytes,
        attributes: Mapping[str, str],
        ordering_key: str | None = None,
    ) -> str:
        self.attempts += 1
        tag = attributes.get(self.track, "") if self.track else ""
        self.in_flight += 1
        self.in_flight_by[tag] += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.max_in_flight_by[tag] = max(self.max_in_flight_by[tag], self.in_flight_by[tag])
        self.started.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail or self.fail_next > 0:
                self.fail_next = max(0, self.fail_next - 1)
                raise PublishFailed("MemoryPublisher: failure switched on")
            pid = str(next(self._ids))
            self.published.append(Published(destination, data, dict(attributes), ordering_key))
            self.ids.append(pid)
            return pid
        finally:
            self.in_flight -= 1
            self.in_flight_by[tag] -= 1

    @property
    def data(self) -> list[bytes]:
        return [p.data for p in self.published]

    async def ping(self) -> None:
        if self.closed:
            raise PublishFailed("MemoryPublisher: closed")

    async def close(self) -> None:
        self.closed = True


class MemoryRecorder:
    """Keeps every decision record in a list."""

    def __init__(self) -> None:
        self.records: list[DecisionRecord] = []
        self.flushes = 0
        self.closed = False

    def record(self, record: DecisionRecord) -> None:
        self.records.append(record)

    def committing(self) -> None:
        return None

    def outcomes(self) -> Mapping[str, int]:
        return {"written": len(self.records), "retried": 0, "dropped": 0}

    @property
    def decisions(self) -> list[Decision]:
        return [r.decision for r in self.records]

    async def flush(self) -> None:
        self.flushes += 1

    async def close(self, deadline: float | None = None) -> None:
        self.closed = True


class KeptSink:
    """A records `Sink` (`pubsub_filter.backends.records.batch`) that keeps every row it was given."""

    name = "kept"

    def __init__(self) -> None:
        self.rows: list[DecisionRecord] = []

    async def write(self, rows: list[DecisionRecord]) -> None:
        self.rows.extend(rows)

    async def close(self) -> None:
        pass


def suppressed_record(message_id: str, route: str = "r", **fields: Any) -> DecisionRecord:
    """A decision record of a suppression, as the recorders take it."""
    return DecisionRecord(
        time=1.0, route=route, decision=Decision.SUPPRESSED, enforced=True, message_id=message_id, **fields
    )


class PassingStore:
    """A `StateStore` that passes every call to `inner`: a test overrides the calls it watches or holds."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner

    async def read(self, route: str, key: str) -> KeyState | None:
        return await self.inner.read(route, key)

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        return await self.inner.claim(route, key, seen, new)

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        return await self.inner.extend(route, key, held, expires_at)

    async def commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        return await self.inner.commit(route, key, held, new)

    async def release(self, route: str, key: str, held: KeyState) -> None:
        await self.inner.release(route, key, held)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()


class SwitchStore:
    """Any `StateStore`, with switches: `down` (every call fails), `commit_fails`, `commit_refused`.

    A store that is down answers `StoreUnavailable`; with `raw` it fails half the time as a
    backend really does, with its own exception (a corrupt SQLite page), so it must then sit
    beneath `GuardedStore`, whose job is to turn any store error into `StoreUnavailable`.
    """

    def __init__(self, inner: StateStore, raw: bool = False) -> None:
        self.inner = inner
        self.raw = raw
        self.down = False
        self.commit_fails = False
        self.commit_refused = False
        self._calls = itertools.count()

    def _check(self) -> None:
        if self.down:
            if self.raw and next(self._calls) % 2:
                raise sqlite3.DatabaseError("database disk image is malformed (injected)")
            raise StoreUnavailable("connection refused")

    async def read(self, route: str, key: str) -> KeyState | None:
        self._check()
        return await self.inner.read(route, key)

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        self._check()
        return await self.inner.claim(route, key, seen, new)

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        self._check()
        return await self.inner.extend(route, key, held, expires_at)

    async def commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        self._check()
        if self.commit_fails:
            raise StoreUnavailable("deadline exceeded")
        if self.commit_refused:
            return False
        return await self.inner.commit(route, key, held, new)

    async def release(self, route: str, key: str, held: KeyState) -> None:
        self._check()
        await self.inner.release(route, key, held)

    async def ping(self) -> None:
        self._check()
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()
