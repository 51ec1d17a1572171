"""One or two engines on one SQLite store with a `coalesce` route, on a manual clock whose
sleepers wake as a test moves it (`Timers`): the world of the coalescing specifications."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import DecisionRecord, Message
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.timers import Timers

COALESCE = {"quiet": "1s", "max_wait": "4s"}


def routes(mode: str = "enforce") -> list[dict[str, Any]]:
    return [
        {"name": "odds", "destination": "odds-out", "key": ["payload.line"], "coalesce": COALESCE, "mode": mode},
        {"name": "plain", "destination": "odds-out", "key": ["payload.line"]},
        {
            "name": "live",
            "destination": "odds-out",
            "key": ["payload.line"],
            "coalesce": COALESCE,
            "bypass": {"field": "payload.state", "equals": "live"},
        },
    ]


class CoalesceWorld:
    def __init__(self, tmp_path: Path, mode: str = "enforce") -> None:
        self.config = parse({"routes": routes(mode)})
        self.clock = ManualClock()
        self.timers = Timers(self.clock, self.held)
        self.publisher = MemoryPublisher()
        self.recorder = MemoryRecorder()
        self.path = tmp_path / "state.db"
        self.engines: list[Engine] = []
        self.engine = self.make_engine("one")
        self.tasks: list[asyncio.Task[Any]] = []

    def make_engine(self, instance: str) -> Engine:
        store = SqliteStore(self.path)
        engine = Engine(self.config, store, self.publisher, self.recorder, self.clock, instance, sleep=self.timers)
        self.engines.append(engine)
        return engine

    def held(self) -> set[Any]:
        return set().union(*(e.holding.waiting() for e in self.engines))

    def message(self, message_id: str, price: float, published: float, line: str = "L1", **payload: Any) -> Message:
        data = json.dumps({"line": line, "price": price, **payload}).encode()
        return Message(data=data, attributes={}, message_id=message_id, publish_time=published)

    async def arrive(self, msg: Message, route: str = "odds", engine: Engine | None = None) -> asyncio.Task[Any]:
        """Hand `msg` to the engine; return once it is answered or held."""
        task = asyncio.ensure_future((engine or self.engine).handle(route, msg))
        self.tasks.append(task)
        await self.settled()
        return task

    def running(self) -> list[asyncio.Task[Any]]:
        """The handle calls, and each engine's burst timer."""
        return [*self.tasks, *(e.holding.timer for e in self.engines if e.holding.timer is not None)]

    async def settled(self) -> None:
        await self.timers.settled(self.running())

    async def advance(self, seconds: float) -> None:
        await self.timers.advance(seconds, self.running())

    def record_of(self, task: asyncio.Task[Any]) -> DecisionRecord:
        assert task.done(), "still held"
        rec: DecisionRecord = task.result().record
        return rec

    def forwarded_prices(self) -> list[float]:
        return [json.loads(p.data)["price"] for p in self.publisher.published]
