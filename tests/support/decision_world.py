"""The decision table's world: one engine on the embedded SQLite store, in-memory publisher and
recorder, a manual clock, and the payloads its specifications send (`test_decisions.py`, and the
histories of `test_no_message_lost_or_published_twice.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import DecisionRecord, KeyState, Message
from pubsub_filter.core.ports import StoreUnavailable
from tests.support.clock import ManualClock, ManualSleep
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTES: list[dict[str, Any]] = [
    {
        "name": "reports",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "row_key": ["player"],
        "include": ["player", "status"],
        "window": "1h",
    },
    {"name": "shadow", "destination": "phase3", "key": ["payload.game_date"], "exclude": ["scraped"], "mode": "shadow"},
    {
        "name": "live",
        "destination": "phase3",
        "key": ["payload.game_id"],
        "exclude": ["scraped"],
        "bypass": {"field": "payload.state", "equals": "live"},
    },
    {"name": "strict", "destination": "phase3", "key": ["payload.game_date"], "on_store_error": "retry"},
    {"name": "raw", "destination": "phase3", "key": ["attributes.id"]},
    {"name": "subscribed", "destination": "phase3", "key": ["payload.game_date"], "subscription": "raw-reports"},
    {"name": "replays", "destination": "phase3", "key": ["payload.game_date"], "stale": "forward"},
    {
        "name": "keyed",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "on_missing_key": "reject",
    },
]


class World:
    def __init__(self, tmp_path: Path, lease: dict[str, Any] | None = None, store_errors: dict[str, Any] | None = None):
        self.tmp_path = tmp_path
        sections = {"lease": lease, "store_errors": store_errors}
        self.config = parse({"routes": ROUTES, **{k: v for k, v in sections.items() if v}})
        self.clock = ManualClock()
        self.sleep = ManualSleep(self.clock)  # the heartbeat's: a test wakes each beat by hand
        self.publisher = MemoryPublisher()
        self.recorder = MemoryRecorder()
        self.engine = self.make_engine("one")
        self._ids = 0

    def make_engine(self, instance: str, publisher: MemoryPublisher | None = None) -> Engine:
        store = GuardedStore(SqliteStore(self.tmp_path / "state.db"), self.config.store_errors)
        return Engine(
            self.config, store, publisher or self.publisher, self.recorder, self.clock, instance, sleep=self.sleep
        )

    def message(
        self, payload: Any, message_id: str | None = None, publish_time: float | None = None, **kw: Any
    ) -> Message:
        if message_id is None:
            self._ids += 1
            message_id = f"m{self._ids}"
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return Message(
            data=data, attributes=kw.pop("attributes", {}), message_id=message_id, publish_time=publish_time, **kw
        )

    async def send(self, route: str, payload: Any, engine: Engine | None = None, **kw: Any) -> DecisionRecord:
        return (await (engine or self.engine).handle(route, self.message(payload, **kw))).record

    async def state(self, route: str, key: str) -> KeyState | None:
        return await SqliteStore(self.tmp_path / "state.db").read(route, key)


def report(*statuses: str, scraped: str = "09:00", order: list[int] | None = None) -> dict[str, Any]:
    players = [{"player": f"p{i}", "status": s, "scraped": scraped} for i, s in enumerate(statuses)]
    if order:
        players = [players[i] for i in order]
    return {"game_date": "2025-01-10", "run": scraped, "players": players}


def game(state: str, score: int, scraped: str = "1") -> dict[str, Any]:
    return {"game_id": "g1", "game_date": "2025-01-10", "state": state, "score": score, "scraped": scraped}


class DownStore:
    """A store that cannot be reached: every read fails."""

    async def read(self, route: str, key: str) -> KeyState | None:
        raise StoreUnavailable("connection refused")

    async def close(self) -> None:
        pass
