"""Tolerance and changed-field flags over each StateStore backend, on a realistic props snapshot
(the odds-props route of examples/filter.yaml: its prices kept, with a tolerance)."""

from __future__ import annotations

import copy
import json
from typing import Any

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, DecisionRecord, Message
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.payloads import props_snapshot

CONFIG = parse(
    {
        "routes": [
            {
                "name": "props",
                "destination": "phase5",
                "key": ["payload.game_id"],
                "rows": "payload.props",
                "row_key": ["player_lookup", "bookmaker"],
                "exclude": ["snapshot_timestamp", "bookmaker_last_update"],
                "rows_mode": "changed",
                "tolerance": {"over_price_american": 12, "over_price": "3%"},
                "changed_attributes": ["over_price_american", "points_line"],
            }
        ],
        "store_errors": {"timeout": "10s", "budget": "20s"},
    }
)


class Rig:
    def __init__(self, store: Any):
        self.publisher = MemoryPublisher()
        self.engine = Engine(CONFIG, GuardedStore(store, CONFIG.store_errors), self.publisher, MemoryRecorder())
        self.n = 0

    async def send(self, payload: dict[str, Any]) -> DecisionRecord:
        self.n += 1
        return (await self.engine.handle("props", Message(json.dumps(payload).encode(), {}, f"m{self.n}"))).record

    def flags(self) -> set[str]:
        attributes = self.publisher.published[-1].attributes
        return {k.removeprefix("filter_changed_") for k in attributes if k.startswith("filter_changed_")}


def moved(snapshot: dict[str, Any], row: int, by: int) -> dict[str, Any]:
    out = copy.deepcopy(snapshot)
    out["props"][row]["over_price_american"] += by
    return out


async def test_prices_within_tolerance_are_held_back_and_a_drift_gets_through(store: Any) -> None:
    rig = Rig(store)
    first = props_snapshot(450, seed=1)
    assert (await rig.send(first)).decision is Decision.FORWARDED
    assert rig.flags() == {"over_price_american", "points_line"}  # a new key: every field
    rec = await rig.send(moved(first, 3, 5))
    assert (rec.decision, rec.reason) == (Decision.SUPPRESSED, "moved within tolerance")
    assert rec.details["within_tolerance"] == {"over_price_american": 5}
    assert (await rig.send(moved(first, 3, 10))).decision is Decision.SUPPRESSED  # 10 from the last forward
    rec = await rig.send(moved(first, 3, 15))  # 15: beyond
    assert rec.decision is Decision.FORWARDED
    sent = json.loads(rig.publisher.published[-1].data)["props"]
    assert len(sent) == 1 and sent[0]["over_price_american"] == first["props"][3]["over_price_american"] + 15
    assert rig.flags() == {"over_price_american"}


async def test_a_line_change_forwards_with_its_flag_and_rows_moved_within_tolerance_stay_back(store: Any) -> None:
    rig = Rig(store)
    first = props_snapshot(450, seed=2)
    await rig.send(first)
    changed = moved(first, 7, 4)
    changed["props"][9]["points_line"] += 1
    rec = await rig.send(changed)
    assert rec.decision is Decision.FORWARDED and rec.details["rows_within_tolerance"] == 1
    sent = json.loads(rig.publisher.published[-1].data)["props"]
    assert [r["points_line"] for r in sent] == [changed["props"][9]["points_line"]]
    assert rig.flags() == {"points_line"}
    # row 7 still compares with the price the destination holds: +13 is beyond it
    again = moved(changed, 7, 9)
    assert (await rig.send(again)).decision is Decision.FORWARDED
    assert rig.flags() == {"over_price_american"}


async def test_the_reference_survives_another_process(open_store: Any) -> None:
    """Stored with the state, not kept in one process: a second engine on the same store compares with it."""
    first = props_snapshot(100, seed=3)
    await Rig(open_store()).send(first)
    other = Rig(open_store())
    other.n = 100  # its own message ids
    rec = await other.send(moved(first, 0, 12))
    assert (rec.decision, rec.reason) == (Decision.SUPPRESSED, "moved within tolerance")
    assert (await other.send(moved(first, 0, 13))).decision is Decision.FORWARDED
