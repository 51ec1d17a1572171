"""What a decision records about which fields changed: what `pubsub-filter tune` reads."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.compare import fields
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.judge import Decided, decide
from pubsub_filter.core.engine.transitions import forwarded
from pubsub_filter.core.model import Decision, KeyState, Message
from tests.support.fakes import MemoryPublisher, MemoryRecorder


def rules(**route: Any) -> RouteRules:
    route = {"name": "r", "destination": "downstream", "key": ["payload.id"], **route}
    return RouteRules(parse({"routes": [route]}).routes[0])


def step(r: RouteRules, payload: dict[str, Any], state: KeyState | None, n: int) -> tuple[Decided, KeyState | None]:
    data = json.dumps(payload).encode()
    msg = Message(data, {}, f"m{n}", publish_time=float(n))
    decoded, fp = r.scheme(data)
    decided = decide(r, msg, fp, state, float(n), False, random.Random(0), decoded)
    if decided.verdict.decision is Decision.FORWARDED:
        state = forwarded(decided.state, msg, fp, 1, decided.out, float(n), 1e12)
        r.remember(decided.kept)  # as the engine does once the forward's commit landed
    return decided, state


def test_a_forward_names_the_selected_fields_that_changed_and_those_that_increased() -> None:
    r = rules()
    first, state = step(r, {"id": 1, "status": "out", "scraped": "2026-11-25T10:00:00Z", "n": 3}, None, 1)
    assert "fields_changed" not in first.details  # a new key: nothing to compare with
    second, _ = step(r, {"id": 1, "status": "in", "scraped": "2026-11-25T10:05:00Z", "n": 2}, state, 2)
    assert second.details["fields_changed"] == ["n", "scraped", "status"]
    assert second.details["fields_increased"] == ["scraped"]


def test_a_suppression_names_the_excluded_fields_that_changed() -> None:
    r = rules(exclude=["scraped", "seq"])
    _, state = step(r, {"id": 1, "status": "out", "scraped": "a", "seq": 1}, None, 1)
    held, _ = step(r, {"id": 1, "status": "out", "scraped": "b", "seq": 1}, state, 2)
    assert held.verdict.decision is Decision.SUPPRESSED
    assert held.details == {"excluded_changed": ["scraped"]}


def test_suppressions_after_one_forward_each_name_the_excluded_fields_that_came_went_or_changed() -> None:
    r = rules(exclude=["scraped", "seq", "gone"])
    _, state = step(r, {"id": 1, "status": "out", "scraped": "a", "gone": 0}, None, 1)
    came, _ = step(r, {"id": 1, "status": "out", "scraped": "a", "gone": 0, "seq": 1}, state, 2)
    went, _ = step(r, {"id": 1, "status": "out", "scraped": "b"}, state, 3)
    same, _ = step(r, {"id": 1, "status": "out", "scraped": "a", "gone": 0}, state, 4)
    assert [d.verdict.decision for d in (came, went, same)] == [Decision.SUPPRESSED] * 3
    assert came.details == {"excluded_changed": ["seq"]}
    assert went.details == {"excluded_changed": ["gone", "scraped"]}
    assert same.details == {"excluded_changed": []}


def test_a_route_that_selects_everything_records_nothing_on_a_suppression() -> None:
    r = rules()
    _, state = step(r, {"id": 1, "status": "out"}, None, 1)
    held, _ = step(r, {"id": 1, "status": "out"}, state, 2)
    assert held.verdict.decision is Decision.SUPPRESSED and held.details == {}


def test_state_stored_before_field_tracking_gives_fields_unknown_then_known() -> None:
    r = rules()
    old = KeyState(fingerprint="sha256:old", forwarded_at=1.0, message_id="m0", publish_time=1.0)
    first, state = step(r, {"id": 1, "status": "in"}, old, 2)
    assert first.details == {"fields_changed": None}
    second, _ = step(r, {"id": 1, "status": "out"}, state, 3)
    assert second.details == {"fields_changed": ["status"]}


def test_the_recorded_names_are_capped_with_a_count_of_the_rest() -> None:
    r = rules()
    _, state = step(r, {"id": 1, **{f"f{i:02}": 0 for i in range(40)}}, None, 1)
    second, _ = step(r, {"id": 1, **{f"f{i:02}": 1 for i in range(40)}}, state, 2)
    assert len(second.details["fields_changed"]) == fields.MAX_NAMED
    assert second.details["fields_changed_more"] == 40 - fields.MAX_NAMED


def test_the_field_state_is_read_by_the_row_state_reader_and_not_mistaken_for_rows() -> None:
    blob = fields.Now({"a": 5}, None, None).blob("sha256:" + "a" * 64)
    assert blob is not None
    before = fields.decode(blob)
    assert before is not None and before.names == ["a"] and before.clocks == {"a": 5.0}
    from pubsub_filter.core.compare import rows

    assert rows.decode(blob) is not None  # a row route reading it (config changed) does not fail
    assert fields.decode(rows.encode({'["k"]': ("f" * 16, {"a": "00000001"})})) is None


async def test_the_engine_decodes_each_message_once_for_its_fingerprint_and_its_field_changes(tmp_path: Path) -> None:
    cfg = parse({"routes": [{"name": "r", "destination": "downstream", "key": ["payload.id"], "exclude": ["scraped"]}]})
    store = SqliteStore(tmp_path / "state.db")
    engine = Engine(cfg, store, MemoryPublisher(), MemoryRecorder())
    r = engine.rules["r"]
    decoded: list[bytes] = []

    def counting(data: bytes) -> Any:
        decoded.append(data)
        return decode(data)

    decode = r.scheme.decode
    r.scheme = dataclasses.replace(r.scheme, decode=counting)
    try:
        payloads = [{"id": 1, "status": s, "scraped": t} for s, t in [("out", "a"), ("out", "b"), ("in", "c")]]
        records = [
            (await engine.handle("r", Message(json.dumps(p).encode(), {}, f"m{i}"))).record
            for i, p in enumerate(payloads)
        ]
    finally:
        await store.close()
    assert [str(rec.decision) for rec in records] == ["forwarded", "suppressed", "forwarded"]
    assert [dict(rec.details) for rec in records[1:]] == [
        {"excluded_changed": ["scraped"]},
        {"fields_changed": ["status"]},
    ]
    assert len(decoded) == 3


def test_a_number_beyond_float_range_is_a_field_like_any_other_not_a_clock() -> None:
    r = rules()
    huge = 10**400
    _, state = step(r, {"id": 1, "n": huge, "x": 1e308}, None, 1)
    second, _ = step(r, {"id": 1, "n": huge + 1, "x": 1e308}, state, 2)
    assert second.details == {"fields_changed": ["n"]}  # changed; not comparable as a clock


def test_a_route_switched_from_whole_payload_to_rows_starts_its_row_state_afresh() -> None:
    whole = rules()
    doc = {"id": 1, "players": [{"p": "a", "s": "out"}]}
    _, state = step(whole, doc, None, 1)
    assert state is not None and fields.decode(state.rows) is not None  # field checksums stored
    by_rows = rules(rows="payload.players", row_key=["p"], rows_mode="changed", removed_rows="tombstone")
    changed = {"id": 1, "players": [{"p": "a", "s": "in"}]}
    decided, _ = step(by_rows, changed, state, 2)
    assert decided.verdict.decision is Decision.FORWARDED
    assert "rows_removed" not in decided.details  # the field state is not a row that went away
    assert json.loads(decided.out.data) == changed


def test_the_field_state_a_forward_keeps_is_the_one_its_blob_decodes_to() -> None:
    before = fields.decode(fields.Now({"a": 1, "t": "2026-11-25T10:00:00Z"}, None, None).blob("sha256:" + "a" * 64))
    now = fields.Now({"a": 2, "t": "2026-11-25T10:05:00Z", "b": [1, {"y": 1, "x": None}]}, None, before)
    blob = now.blob("sha256:" + "b" * 64)
    assert blob is not None
    kept, read = now.stored(), fields.decode(blob)
    assert read is not None
    assert (kept.names, kept.packed, kept.clocks, kept.crcs) == (read.names, read.packed, read.clocks, read.crcs)
    assert kept.by_name() == read.by_name() == {n: int(read.as_dict()[n], 16) for n in read.names}


def test_the_next_decision_for_a_key_finds_the_field_state_its_forward_kept_without_decoding_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = rules(exclude=["scraped"])
    _, state = step(r, {"id": 1, "status": "out", "scraped": "a"}, None, 1)
    monkeypatch.setattr(fields, "decode", lambda blob: pytest.fail("the stored field state was decoded again"))
    held, _ = step(r, {"id": 1, "status": "out", "scraped": "b"}, state, 2)
    assert held.details == {"excluded_changed": ["scraped"]}
    forward, _ = step(r, {"id": 1, "status": "in", "scraped": "c"}, state, 3)
    assert forward.details == {"fields_changed": ["status"]}


def test_a_stored_field_state_with_a_checksum_marked_missing_still_compares_by_name() -> None:
    before = fields.Before(["a", "b"], "0000000a" + "-" * 8, {})
    assert before.crcs is None and before.by_name() == {"a": 10}
    now = fields.Now({"a": 1, "b": 2}, None, before)
    assert now.changed_all == ["a", "b"]


def test_excluded_fields_compared_by_the_values_the_forward_kept_change_as_their_checksums_do() -> None:
    values: list[Any] = [None, True, False, 0, 1, -1, 1.5, 2.5, "", "1", "true", "a" * 300, [1], [True], {"a": 1}]
    names = [f"f{i:02}" for i in range(len(values))]
    r = rules(exclude=names)
    counts = fields.selector(r.route)
    assert counts is not None
    first = {"id": 1, **dict(zip(names, values, strict=True))}
    for shift in range(1, len(values)):
        then = {"id": 1, **dict(zip(names, values[shift:] + values[:shift], strict=True))}
        del then[names[shift]]  # and one field gone
        read = fields.decode(fields.Now(first, counts, None).blob("sha256:" + "a" * 64))
        kept = fields.Now(first, counts, None).stored(fields.kept_values(first, names))
        assert read is not None and read.values is None and kept.values is not None
        by_checksum = fields.excluded_changed(then, read, r.unselected, counts)
        by_value = fields.excluded_changed(then, kept, r.unselected, counts)
        assert (
            by_value
            == by_checksum
            == [n for n in names if n not in then or json.dumps(first[n]) != json.dumps(then[n])]
        )
