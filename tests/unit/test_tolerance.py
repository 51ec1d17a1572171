"""Tolerance (a deadband per numeric field) and changed-field flags, decided on the embedded SQLite store."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.judge import decide
from pubsub_filter.core.model import Decision, DecisionRecord, KeyState, Lease, Message
from pubsub_filter.core.ports import StoreUnavailable
from tests.support.clock import ManualClock, ManualSleep
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.tolerance_routes import props_route

ROUTES: list[dict[str, Any]] = [
    {
        "name": "odds",
        "destination": "phase3",
        "key": ["payload.game_id"],
        "exclude": ["scraped"],
        "tolerance": {"price": 12, "total": "3%"},
        "changed_attributes": ["price", "status", "total"],
    },
    {"name": "plain", "destination": "phase3", "key": ["payload.game_id"], "exclude": ["scraped"]},
    props_route("props", "phase3"),
    props_route("props-changed", "phase3", rows_mode="changed"),
    {
        "name": "windowed",
        "destination": "phase3",
        "key": ["payload.game_id"],
        "window": "1h",
        "tolerance": {"price": 12},
    },
    {
        "name": "live",
        "destination": "phase3",
        "key": ["payload.game_id"],
        "tolerance": {"price": 12},
        "changed_attributes": ["price", "status"],
        "bypass": {"field": "payload.state", "equals": "live"},
    },
    {
        "name": "props-windowed",
        "destination": "phase3",
        "key": ["payload.game_id"],
        "rows": "payload.props",
        "row_key": ["player"],
        "rows_mode": "changed",
        "window": "1h",
        "tolerance": {"price": 12},
        "changed_attributes": ["price", "status"],
    },
    {
        "name": "shadowed",
        "destination": "phase3",
        "key": ["payload.game_id"],
        "mode": "shadow",
        "tolerance": {"price": 12},
        "changed_attributes": ["price", "status"],
    },
    {"name": "raw", "destination": "phase3", "key": ["attributes.id"], "changed_attributes": ["price"]},
]


class World:
    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.config = parse({"routes": ROUTES})
        self.clock = ManualClock()
        self.publisher = MemoryPublisher()
        self.recorder = MemoryRecorder()
        self.store = GuardedStore(SqliteStore(tmp_path / "state.db"), self.config.store_errors)
        self.engine = Engine(
            self.config, self.store, self.publisher, self.recorder, self.clock, "one", sleep=ManualSleep(self.clock)
        )
        self._ids = 0

    async def send(self, route: str, payload: Any, message_id: str | None = None, **kw: Any) -> DecisionRecord:
        if message_id is None:
            self._ids += 1
            message_id = f"m{self._ids}"
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        msg = Message(data=data, attributes=kw.pop("attributes", {}), message_id=message_id, **kw)
        return (await self.engine.handle(route, msg)).record

    async def decisions(self, route: str, *payloads: Any) -> list[str]:
        out = []
        for p in payloads:
            rec = await self.send(route, p)
            out.append(str(rec.decision) if rec.decision is not Decision.SUPPRESSED else f"suppressed: {rec.reason}")
        return out

    def flags(self, n: int = -1) -> set[str]:
        attributes = self.publisher.published[n].attributes
        return {k.removeprefix("filter_changed_") for k in attributes if k.startswith("filter_changed_")}

    async def state(self, route: str, key: str) -> KeyState | None:
        return await SqliteStore(self.tmp_path / "state.db").read(route, key)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    yield World(tmp_path)


def odds(price: Any = 100, total: Any = 50.0, status: str = "open", scraped: str = "1", **more: Any) -> dict[str, Any]:
    return {"game_id": "g1", "price": price, "total": total, "status": status, "scraped": scraped, **more}


def props(*prices: Any, status: str = "open", game: str = "g1") -> dict[str, Any]:
    return {"game_id": game, "props": [{"player": f"p{i}", "price": p, "status": status} for i, p in enumerate(prices)]}


WITHIN = "suppressed: moved within tolerance"


async def test_three_moves_of_5_against_12_forward_on_the_third(world: World) -> None:
    got = await world.decisions("odds", odds(100), odds(105), odds(110), odds(115))
    assert got == ["forwarded", WITHIN, WITHIN, "forwarded"]
    assert [json.loads(p.data)["price"] for p in world.publisher.published] == [100, 115]


async def test_the_forwarded_values_become_the_reference(world: World) -> None:
    got = await world.decisions("odds", odds(100), odds(113), odds(120), odds(126))
    # 113 forwards (13 > 12); 120 is 7 from 113; 126 is 13 from 113
    assert got == ["forwarded", "forwarded", WITHIN, "forwarded"]


async def test_a_move_of_exactly_the_amount_is_within(world: World) -> None:
    assert await world.decisions("odds", odds(100), odds(112), odds(88)) == ["forwarded", WITHIN, WITHIN]


async def test_a_percentage_is_of_the_value_last_forwarded(world: World) -> None:
    got = await world.decisions("odds", odds(total=200), odds(total=206), odds(total=193.9), odds(total=199.5))
    assert got == ["forwarded", WITHIN, "forwarded", WITHIN]  # 3% of 200 is 6; then 3% of 193.9 is 5.817


async def test_the_record_says_which_fields_moved_and_by_how_much(world: World) -> None:
    await world.send("odds", odds(100, 50))
    rec = await world.send("odds", odds(96, 51))
    assert rec.reason == "moved within tolerance"
    assert rec.details["within_tolerance"] == {"price": 4, "total": 1.0}
    assert rec.previous_fingerprint is not None and rec.fingerprint != rec.previous_fingerprint


async def test_another_field_changing_with_a_small_move_forwards(world: World) -> None:
    assert await world.decisions("odds", odds(100), odds(101, status="closed")) == ["forwarded", "forwarded"]


async def test_an_excluded_field_changing_with_a_small_move_is_within(world: World) -> None:
    assert await world.decisions("odds", odds(100), odds(101, scraped="2")) == ["forwarded", WITHIN]


@pytest.mark.parametrize(
    ("before", "after"),
    [(100, "100"), ("100", "101"), (100, None), (None, 100), (True, 1), (100, [100]), (100, {"v": 100})],
)
async def test_values_that_are_not_both_numbers_compare_exactly(world: World, before: Any, after: Any) -> None:
    assert await world.decisions("odds", odds(before), odds(after)) == ["forwarded", "forwarded"]


async def test_a_missing_field_is_a_change(world: World) -> None:
    gone = {k: v for k, v in odds(100).items() if k != "price"}
    assert await world.decisions("odds", odds(100), gone, odds(100)) == ["forwarded", "forwarded", "forwarded"]


async def test_numbers_compare_by_value(world: World) -> None:
    await world.send("odds", odds(25.5))
    rec = await world.send("odds", b'{"game_id":"g1","price":25.50,"total":50.0,"status":"open","scraped":"2"}')
    assert (rec.decision, rec.reason) == (Decision.SUPPRESSED, "unchanged since last forward")


async def test_very_large_integers_compare_exactly(world: World) -> None:
    big = 10**30
    got = await world.decisions("odds", odds(big), odds(big + 12), odds(big + 13), odds(big + 0.5))
    # big + 0.5 is the double nearest: a fraction against an integer compares as doubles
    assert got[:3] == ["forwarded", WITHIN, "forwarded"]


async def test_an_integer_beyond_double_range_against_a_fraction_is_a_change(world: World) -> None:
    huge = 10**400
    assert await world.decisions("odds", odds(huge), odds(1.5)) == ["forwarded", "forwarded"]


async def test_a_redelivery_stays_a_redelivery(world: World) -> None:
    await world.send("odds", odds(100), message_id="a")
    rec = await world.send("odds", odds(100), message_id="a")
    assert rec.decision is Decision.DUPLICATE


async def test_the_fingerprint_does_not_depend_on_the_tolerance(world: World) -> None:
    a = await world.send("odds", odds(100))
    b = await world.send("plain", odds(100))
    assert a.fingerprint == b.fingerprint


async def test_past_the_window_a_move_within_tolerance_forwards(world: World) -> None:
    await world.send("windowed", odds(100))
    world.clock.advance(3601)
    rec = await world.send("windowed", odds(101))
    assert rec.decision is Decision.FORWARDED


async def test_the_reference_is_written_only_with_a_confirmed_forward(world: World) -> None:
    await world.send("odds", odds(100))
    world.publisher.fail_next = 1
    failed = await world.send("odds", odds(130))  # beyond: its publish fails, nothing is committed
    assert failed.decision is Decision.FAILED
    # still compared with 100: 110 is within, 113 is not
    assert await world.decisions("odds", odds(110), odds(113)) == [WITHIN, "forwarded"]


# --- rows ---------------------------------------------------------------------------


async def test_rows_are_compared_row_by_row(world: World) -> None:
    got = await world.decisions("props", props(100, 200), props(110, 190), props(110, 187))
    assert got == ["forwarded", WITHIN, "forwarded"]


async def test_a_row_added_or_removed_is_a_change(world: World) -> None:
    got = await world.decisions("props", props(100, 200), props(101, 200, 300), props(101, 200))
    assert got == ["forwarded", "forwarded", "forwarded"]


async def test_rows_changed_only_within_tolerance_are_not_sent_and_keep_their_reference(world: World) -> None:
    await world.send("props-changed", props(100, 200))
    rec = await world.send("props-changed", props(105, 250))  # p0 within, p1 beyond
    assert rec.decision is Decision.FORWARDED and rec.details["rows_within_tolerance"] == 1
    sent = json.loads(world.publisher.published[-1].data)["props"]
    assert [r["player"] for r in sent] == ["p1"]
    # p0 is still compared with 100, the value the destination holds
    assert await world.decisions("props-changed", props(110, 250), props(113, 250)) == [WITHIN, "forwarded"]
    assert [r["player"] for r in json.loads(world.publisher.published[-1].data)["props"]] == ["p0"]


# --- changed attributes ---------------------------------------------------------------


async def test_a_new_key_flags_every_listed_field(world: World) -> None:
    await world.send("odds", odds(100))
    assert world.flags() == {"price", "status", "total"}


async def test_a_forward_flags_the_fields_that_changed_beyond_tolerance(world: World) -> None:
    await world.send("odds", odds(100))
    rec = await world.send("odds", odds(105, status="closed"))
    assert world.flags() == {"status"}
    assert rec.details["changed_flagged"] == ["status"]
    await world.send("odds", odds(120, status="closed"))
    assert world.flags() == {"price"}


async def test_rows_flag_a_field_changed_in_any_row(world: World) -> None:
    await world.send("props", props(100, 200))
    await world.send("props", {"game_id": "g1", "props": [{"player": "p0", "price": 100, "status": "out"}]})
    assert world.flags() == {"price", "status"}  # a row removed: every field
    await world.send("props", {"game_id": "g1", "props": [{"player": "p0", "price": 120, "status": "out"}]})
    assert world.flags() == {"price"}


async def test_a_bypass_flags_every_listed_field(world: World) -> None:
    await world.send("live", odds(100))
    await world.send("live", odds(100, state="live"))
    assert world.flags() == {"price", "status"}


async def test_a_fail_open_forward_flags_every_listed_field(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    await world.send("odds", odds(100))

    async def down(*_: Any) -> None:
        raise StoreUnavailable("down")

    monkeypatch.setattr(world.engine.store, "read", down)
    rec = await world.send("odds", odds(101))
    assert rec.decision is Decision.FAIL_OPEN
    assert world.flags() == {"price", "status", "total"}


async def test_a_producers_own_flags_never_pass(world: World) -> None:
    await world.send("plain", odds(100), attributes={"filter_changed_price": "true", "mine": "1"})
    attributes = world.publisher.published[-1].attributes
    assert "filter_changed_price" not in attributes and attributes["mine"] == "1"


async def test_a_lapsed_forward_of_other_content_leaves_nothing_to_compare_with(world: World) -> None:
    """Its holder may have published it: the destination may hold that, not the last forward."""
    await world.send("odds", odds(100))
    state = await world.state("odds", "g1")
    assert state is not None
    lapsed = Lease("dead/1", state.fence + 1, world.clock.now() - 1, "sha256:" + "0" * 64, "m-dead")
    rules = world.engine.rules["odds"]
    data = json.dumps(odds(101)).encode()
    payload, fp = rules.scheme(data)
    decided = decide(
        rules,
        Message(data, {}, "m9"),
        fp,
        replace(state, lease=lapsed),
        world.clock.now(),
        False,
        random.Random(0),
        payload,
    )
    assert decided.verdict.decision is Decision.FORWARDED
    assert {k for k in decided.out.attributes if k.startswith("filter_changed_")} == {
        "filter_changed_price",
        "filter_changed_status",
        "filter_changed_total",
    }


async def test_a_move_beyond_tolerance_is_flagged_beside_another_change(world: World) -> None:
    await world.send("odds", odds(100))
    await world.send("odds", odds(113, status="closed"))
    assert world.flags() == {"price", "status"}


async def test_past_the_row_state_cap_no_reference_is_kept_and_every_change_forwards(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pubsub_filter.core.compare import rows

    big = props(*range(100, 140))
    await world.send("props", big)
    state = await world.state("props", "g1")
    assert state is not None and state.rows is not None
    kept = state.rows.rindex(b",{}") if b",{}," in state.rows else len(state.rows)
    monkeypatch.setattr(rows, "MAX_STORED_BYTES", kept + 8)  # the row state fits, its reference does not
    moved = props(*range(200, 240))
    rec = await world.send("props", moved)
    assert rec.decision is Decision.FORWARDED
    assert rec.details["tolerance_state"].startswith("too large to keep (past the state limit")
    again = props(201, *range(201, 240))  # within tolerance of the last forward, but nothing to compare with
    rec = await world.send("props", again)
    assert (rec.decision, rec.reason) == (Decision.FORWARDED, "content changed")
    # no reference to compare with, but the row digests say only prices changed: a flag never
    # says a field changed when the filter knows it did not
    assert world.flags() == {"price"}


async def test_a_payload_with_nothing_to_compare_field_by_field_flags_every_listed_field(world: World) -> None:
    await world.send("raw", b"\x00 not json", attributes={"id": "1"})
    await world.send("raw", b"\x00 other bytes", attributes={"id": "1"})
    assert world.flags() == {"price"}
    await world.send("raw", [1, 2], attributes={"id": "1"})  # JSON, not an object
    assert world.flags() == {"price"}


async def test_past_the_window_a_rows_forward_holds_nothing_back_and_flags_every_field(world: World) -> None:
    await world.send("props-windowed", props(100, 200))
    world.clock.advance(3601)
    rec = await world.send("props-windowed", props(105, 200))  # within tolerance, but the window expired
    assert rec.decision is Decision.FORWARDED and "rows_within_tolerance" not in rec.details
    assert [r["price"] for r in json.loads(world.publisher.published[-1].data)["props"]] == [105]
    assert world.flags() == {"price", "status"}


async def test_a_shadow_routes_publish_of_what_enforce_would_hold_back_flags_every_field(world: World) -> None:
    await world.send("shadowed", odds(100))
    rec = await world.send("shadowed", odds(104))
    assert (rec.decision, rec.reason, rec.enforced) == (Decision.SUPPRESSED, "moved within tolerance", False)
    assert len(world.publisher.published) == 2 and world.flags() == {"price", "status"}


async def test_the_flags_count_among_the_attributes_a_forward_may_carry(world: World) -> None:
    """The odds route adds up to 7 attributes of its own and 3 flags: 90 of the producer's fit, 91 do not."""
    fits = {f"a{i}": "v" for i in range(90)}
    assert (await world.send("odds", odds(100), attributes=fits)).decision is Decision.FORWARDED
    rec = await world.send("odds", odds(200), attributes={**fits, "one_more": "v"})
    assert rec.decision is Decision.REJECTED and "at most 90 can be forwarded" in (rec.reason or "")
