"""Row-level change detection over each StateStore backend, on realistic injury and props payloads."""

from __future__ import annotations

import copy
import json
import random
import time
from typing import Any

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, DecisionRecord, Message
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.payloads import injury_report, props_snapshot

CONFIG: Config = parse(
    {
        "routes": [
            {
                "name": "injury",
                "destination": "phase3",
                "key": ["payload.game_date"],
                "rows": "payload.players",
                "row_key": ["player_lookup", "game_id"],
                "include": [
                    "player_lookup",
                    "team",
                    "game_date",
                    "game_id",
                    "injury_status",
                    "reason",
                    "reason_category",
                ],
                "rows_mode": "changed",
            },
            {
                "name": "props",
                "destination": "phase5",
                "key": ["payload.game_id"],
                "rows": "payload.props",
                "row_key": ["player_lookup", "bookmaker"],
                "exclude": [
                    "over_price",
                    "over_price_american",
                    "under_price",
                    "under_price_american",
                    "snapshot_timestamp",
                    "bookmaker_last_update",
                ],
                "rows_mode": "changed",
            },
        ],
        "store_errors": {"timeout": "10s", "budget": "20s"},
    }
)


class Rig:
    def __init__(self, store: Any, clock: ManualClock | None = None):
        self.publisher = MemoryPublisher()
        self.engine = Engine(
            CONFIG, GuardedStore(store, CONFIG.store_errors), self.publisher, MemoryRecorder(), clock=clock
        )
        self.n = 0

    async def send(self, route: str, payload: dict[str, Any]) -> DecisionRecord:
        self.n += 1
        return (await self.engine.handle(route, Message(json.dumps(payload).encode(), {}, f"m{self.n}"))).record

    def last_rows(self, field: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = json.loads(self.publisher.published[-1][1])[field]
        return rows


async def test_shuffled_report_is_suppressed(store: Any) -> None:
    rig = Rig(store)
    await rig.send("injury", injury_report(450, seed=1))
    again = injury_report(450, seed=2)
    again["players"] = random.Random(1).sample(again["players"], 450)
    assert (await rig.send("injury", again)).decision is Decision.SUPPRESSED


async def test_one_changed_row_forwards_one_row(store: Any) -> None:
    rig = Rig(store)
    first = injury_report(450)
    await rig.send("injury", first)
    changed = copy.deepcopy(first)
    changed["players"][200]["injury_status"] = (
        "available" if first["players"][200]["injury_status"] != "available" else "out"
    )
    rec = await rig.send("injury", changed)
    assert rec.decision is Decision.FORWARDED and rec.extra["rows_changed"] == 1
    assert [p["player_lookup"] for p in rig.last_rows("players")] == ["player0200"]


async def test_one_removed_and_one_added_row(store: Any) -> None:
    rig = Rig(store)
    first = injury_report(450)
    await rig.send("injury", first)
    removed = copy.deepcopy(first)
    removed["players"].pop(0)
    rec = await rig.send("injury", removed)
    assert (rec.decision, rec.extra["rows_removed"], rig.last_rows("players")) == (Decision.FORWARDED, 1, [])
    rec = await rig.send("injury", first)
    assert rec.extra["rows_added"] == 1 and [p["player_lookup"] for p in rig.last_rows("players")] == ["player0000"]


async def test_only_excluded_price_fields_changed_is_suppressed(store: Any) -> None:
    rig = Rig(store)
    await rig.send("props", props_snapshot(300, seed=1))
    assert (await rig.send("props", props_snapshot(300, seed=2))).decision is Decision.SUPPRESSED


async def test_row_state_survives_a_failed_publish(store: Any) -> None:
    rig = Rig(store)
    first = injury_report(450)
    await rig.send("injury", first)
    changed = copy.deepcopy(first)
    changed["players"][7]["reason"] = "Sprained ankle"
    rig.publisher.fail = True
    assert (await rig.send("injury", changed)).decision is Decision.FAILED  # claim, then release
    rig.publisher.fail = False
    rec = await rig.send("injury", changed)  # the redelivery
    assert rec.extra["rows_changed"] == 1 and len(rig.last_rows("players")) == 1


async def test_row_state_of_expired_state_stays_forgotten_after_a_failed_publish(store: Any) -> None:
    """Expired state decides nothing; a forward over it that fails (claim, then release) must not
    leave the expired row state to be diffed against by the redelivery."""
    clock = ManualClock(round(time.time(), 3))
    rig = Rig(store, clock)
    first = injury_report(450)
    await rig.send("injury", first)
    clock.advance(CONFIG.state_ttl + 60.0)
    changed = copy.deepcopy(first)
    changed["players"][7]["reason"] = "Sprained ankle"
    rig.publisher.fail = True
    assert (await rig.send("injury", changed)).decision is Decision.FAILED
    rig.publisher.fail = False
    rec = await rig.send("injury", changed)  # the redelivery: new content to a key that has no state
    assert rec.decision is Decision.FORWARDED and "rows_changed" not in rec.extra
    assert len(rig.last_rows("players")) == 450
