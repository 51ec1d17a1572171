"""In-memory stand-ins for OUR interfaces (`filter.ports.Publisher`, `DecisionRecorder`).

They fake the engine's collaborators, never a Google client: tests that claim to cover
Pub/Sub or Firestore run against the emulators.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Mapping
from typing import NamedTuple

from filter.model import Decision, DecisionRecord
from filter.ports import PublishFailed


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

    @property
    def decisions(self) -> list[Decision]:
        return [r.decision for r in self.records]

    async def flush(self) -> None:
        self.flushes += 1

    async def close(self, deadline: float | None = None) -> None:
        self.closed = True
