"""Row-level change detection: 5 changed players out of 450 cost downstream 5 rows, not 450."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.compare import rows
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, DecisionRecord, Message
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.payloads import injury_report, props_snapshot

INJURY = {
    "destination": "phase3",
    "key": ["payload.game_date"],
    "rows": "payload.players",
    "row_key": ["player_lookup", "game_id"],
    "include": ["player_lookup", "team", "game_date", "game_id", "injury_status", "reason", "reason_category"],
}
PROPS = {
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
}
ROUTES = [
    {"name": "injury", **INJURY, "rows_mode": "changed"},
    {"name": "injury-tombstones", **INJURY, "rows_mode": "changed", "removed_rows": "tombstone"},
    {"name": "injury-ignore-removed", **INJURY, "rows_mode": "changed", "removed_rows": "ignore"},
    {"name": "injury-whole", **INJURY},
    {"name": "injury-audited", **INJURY, "audit_sample": 1.0},
    {"name": "props", **PROPS, "rows_mode": "changed"},
]


class Rig:
    def __init__(self, tmp_path: Path):
        self.config = parse({"routes": ROUTES})
        self.publisher = MemoryPublisher()
        self.engine = Engine(
            self.config,
            GuardedStore(SqliteStore(tmp_path / "state.db"), self.config.store_errors),
            self.publisher,
            MemoryRecorder(),
            ManualClock(),
        )
        self.n = 0

    async def send(self, route: str, payload: dict[str, Any]) -> DecisionRecord:
        self.n += 1
        return (await self.engine.handle(route, Message(json.dumps(payload).encode(), {}, f"m{self.n}"))).record

    def last(self) -> tuple[dict[str, Any], dict[str, str]]:
        _, data, attributes, _ = self.publisher.published[-1]
        return json.loads(data), attributes


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def report(**kw: Any) -> dict[str, Any]:
    return injury_report(450, **kw)


def flip(report: dict[str, Any], *indexes: int) -> dict[str, Any]:
    changed = copy.deepcopy(report)
    for i in indexes:
        row = changed["players"][i]
        row["injury_status"] = "available" if row["injury_status"] != "available" else "out"
    return changed


async def test_first_report_is_forwarded_whole(rig: Rig) -> None:
    rec = await rig.send("injury", report())
    body, _ = rig.last()
    assert rec.decision is Decision.FORWARDED and len(body["players"]) == 450


async def test_shuffled_rescrape_is_suppressed(rig: Rig) -> None:
    first = report(seed=1)
    await rig.send("injury", first)
    again = report(seed=2)  # new scrape times, run ids, confidences
    again["players"] = random.Random(3).sample(again["players"], 450)
    assert (await rig.send("injury", again)).decision is Decision.SUPPRESSED


async def test_five_changed_players_forward_five_rows(rig: Rig) -> None:
    first = report()
    await rig.send("injury", first)
    rec = await rig.send("injury", flip(first, 3, 50, 120, 300, 449))
    body, attributes = rig.last()
    assert rec.decision is Decision.FORWARDED
    assert sorted(p["player_lookup"] for p in body["players"]) == [
        "player0003",
        "player0050",
        "player0120",
        "player0300",
        "player0449",
    ]
    assert (attributes["filter_rows_changed"], attributes["filter_rows_total"], attributes["filter_rows_removed"]) == (
        "5",
        "450",
        "0",
    )
    assert (
        body["game_date"] == first["game_date"] and body["run_id"] == first["run_id"]
    )  # the other top-level fields stay


async def test_forwarded_rows_keep_every_field_not_only_the_included_ones(rig: Rig) -> None:
    first = report()
    await rig.send("injury", first)
    await rig.send("injury", flip(first, 7))
    body, _ = rig.last()
    assert body["players"][0]["scrape_time"] == first["players"][7]["scrape_time"]


async def test_a_removed_row_is_listed_in_an_attribute(rig: Rig) -> None:
    first = report()
    await rig.send("injury", first)
    fewer = copy.deepcopy(first)
    gone = fewer["players"].pop(10)
    rec = await rig.send("injury", fewer)
    body, attributes = rig.last()
    assert rec.decision is Decision.FORWARDED and body["players"] == []
    assert attributes["filter_rows_removed"] == "1"
    assert json.loads(attributes["filter_rows_removed_keys"]) == [
        json.dumps([gone["player_lookup"], gone["game_id"]], separators=(",", ":"))
    ]


async def test_a_removed_row_can_be_sent_as_a_tombstone(rig: Rig) -> None:
    first = report()
    await rig.send("injury-tombstones", first)
    fewer = copy.deepcopy(first)
    gone = fewer["players"].pop(10)
    await rig.send("injury-tombstones", fewer)
    body, _ = rig.last()
    assert body["players"] == [
        {"player_lookup": gone["player_lookup"], "game_id": gone["game_id"], "filter_removed": True}
    ]


async def test_only_a_removal_with_removals_ignored_is_forwarded_with_no_rows(rig: Rig) -> None:
    # The fingerprint changed, so row mode may narrow the forward but never suppress it:
    # `ignore` leaves the removed rows' keys out, the change itself still goes downstream.
    first = report()
    await rig.send("injury-ignore-removed", first)
    fewer = copy.deepcopy(first)
    fewer["players"].pop(10)
    rec = await rig.send("injury-ignore-removed", fewer)
    body, attributes = rig.last()
    assert rec.decision is Decision.FORWARDED and body["players"] == []
    assert attributes["filter_rows_removed"] == "1" and "filter_rows_removed_keys" not in attributes


async def test_an_added_row_forwards_only_that_row(rig: Rig) -> None:
    first = injury_report(449)
    await rig.send("injury", first)
    more = injury_report(450)
    rec = await rig.send("injury", more)
    body, attributes = rig.last()
    assert rec.decision is Decision.FORWARDED and [p["player_lookup"] for p in body["players"]] == ["player0449"]
    assert rec.extra["rows_added"] == 1 and attributes["filter_rows_changed"] == "1"


async def test_only_excluded_fields_changed_is_suppressed(rig: Rig) -> None:
    await rig.send("props", props_snapshot(200, seed=1))
    prices_moved = props_snapshot(200, seed=2)  # same lines, new prices and timestamps
    assert (await rig.send("props", prices_moved)).decision is Decision.SUPPRESSED


async def test_a_line_move_forwards_that_prop_only(rig: Rig) -> None:
    first = props_snapshot(200, seed=1)
    await rig.send("props", first)
    moved = props_snapshot(200, seed=2)
    moved["props"][42]["points_line"] += 1
    await rig.send("props", moved)
    body, _ = rig.last()
    assert [(p["player_lookup"], p["bookmaker"]) for p in body["props"]] == [
        (first["props"][42]["player_lookup"], first["props"][42]["bookmaker"])
    ]


# --- explain: which rows and fields changed, on every forward ---------------------------


async def test_a_whole_mode_forward_records_which_fields_changed(rig: Rig) -> None:
    first = report()
    await rig.send("injury-whole", first)
    changed = flip(first, 5)
    changed["players"][6]["reason"] = "Rest"
    rec = await rig.send("injury-whole", changed)
    body, _ = rig.last()
    assert len(body["players"]) == 450  # whole mode forwards the whole payload
    assert rec.extra["rows_changed"] == 2 and rec.extra["rows_total"] == 450
    by_row = {c["row"]: c["fields"] for c in rec.extra["changes"]}
    assert by_row[json.dumps(["player0005", first["players"][5]["game_id"]], separators=(",", ":"))] == [
        "injury_status"
    ]
    assert by_row[json.dumps(["player0006", first["players"][6]["game_id"]], separators=(",", ":"))] == ["reason"]


async def test_the_record_names_a_bounded_number_of_rows(rig: Rig) -> None:
    first = report()
    await rig.send("injury-whole", first)
    rec = await rig.send("injury-whole", flip(first, *range(100)))
    assert rec.extra["rows_changed"] == 100 and len(rec.extra["changes"]) == rows.EXPLAIN_ROWS


async def test_row_state_too_large_to_keep_falls_back_to_whole_decisions(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rows, "MAX_STORED_BYTES", 1000)
    first = report()
    assert (await rig.send("injury", first)).extra["rows_state"].startswith("too large to keep (past the state limit")
    rec = await rig.send("injury", flip(first, 1))
    body, _ = rig.last()
    assert rec.decision is Decision.FORWARDED and len(body["players"]) == 450


async def test_a_forward_over_the_row_state_cap_computes_no_field_checksums(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing would read them: with no stored row state there is nothing to compare them with.
    monkeypatch.setattr(rows, "MAX_STORED_BYTES", 1000)
    computed = []
    checksums = rows.field_checksums
    monkeypatch.setattr(rows, "field_checksums", lambda selected: computed.append(1) or checksums(selected))
    first = report()
    for payload in (first, flip(first, 1)):
        rec = await rig.send("injury", payload)
        assert rec.decision is Decision.FORWARDED and rec.extra["rows_state"].startswith(
            "too large to keep (past the state limit"
        )
        assert len(rig.last()[0]["players"]) == 450
    state = await rig.engine.store.read("injury", first["game_date"])
    assert state is not None and state.rows is None
    assert computed == []


def _typed(route: str, payload: dict[str, Any]) -> Any:
    rules = RouteRules(next(r for r in parse({"routes": ROUTES}).routes if r.name == route))
    return rules.typed_rows(json.dumps(payload).encode())


def test_the_stored_size_bound_is_exact_when_every_row_has_every_field() -> None:
    payload = report()
    for i, row in enumerate(payload["players"][:20]):  # keys the stored blob escapes
        row["player_lookup"] = f'quote " backslash \\ accent \u00e9 newline \n {i}'
        row["game_id"] = 1.5 + i
    typed = _typed("injury", payload)
    assert rows.stored_size_at_least(typed) == len(rows.encode(rows.digest_typed(typed)) or b"")


def test_the_stored_size_bound_never_exceeds_the_size_stored() -> None:
    payload = report()
    for row in payload["players"][::2]:
        del row["reason"]  # rows without every field: the bound reads the first row's
    typed = _typed("injury", payload)
    assert 0 < rows.stored_size_at_least(typed) <= len(rows.encode(rows.digest_typed(typed)) or b"")
    payload["players"].append(dict(payload["players"][0]))  # a shared key: rows digested together
    assert rows.stored_size_at_least(_typed("injury", payload)) == 0


# --- the false-negative audit ----------------------------------------------------------


async def test_audit_counts_suppressions_that_hid_a_change_outside_the_selection(rig: Rig) -> None:
    first = report(seed=1)
    await rig.send("injury-audited", first)
    rec = await rig.send("injury-audited", report(seed=2))  # only excluded fields differ
    assert (rec.decision, rec.reason) == (Decision.NOISE_ONLY, "unchanged, but fields outside the selection changed")
    assert len(rig.publisher.published) == 1  # still suppressed: nothing published


async def test_audit_leaves_truly_identical_content_suppressed(rig: Rig) -> None:
    first = report(seed=1)
    await rig.send("injury-audited", first)
    assert (await rig.send("injury-audited", first | {"ignored": 1})).decision is Decision.SUPPRESSED


def test_realistic_row_state_fits_a_firestore_document() -> None:
    cfg = parse({"routes": ROUTES})
    payload = injury_report(450)
    blob = rows.encode(rows.digest_rows(cfg.routes[0], payload["players"]))
    assert blob is not None and len(blob) < 80_000


async def test_a_changed_row_whose_key_is_spelled_as_a_float_is_forwarded(rig: Rig) -> None:
    # The digests read `1.0` as the number 1 (canonical numbers); the rows sent must be chosen the same way.
    first = {"game_date": "2026-01-10", "players": [{"player_lookup": "a", "game_id": 1.0, "injury_status": "Out"}]}
    await rig.send("injury", first)
    changed = copy.deepcopy(first)
    changed["players"][0]["injury_status"] = "Available"
    assert (await rig.send("injury", changed)).decision is Decision.FORWARDED
    sent = json.loads(rig.publisher.published[-1].data)
    assert sent["players"] == changed["players"]
