"""Fingerprints: deterministic over content, blind to what the route says does not count."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from pubsub_filter.core.compare.fingerprint import NOT_JSON, PayloadError, compile_scheme, message_fingerprint
from pubsub_filter.core.config.schema import Route
from tests.support.payloads import injury_report, props_snapshot
from tests.support.seeds import SmartIdempotencyMixin, TransactionEvent, hash_events

INJURY_FIELDS = ["player_lookup", "team", "game_date", "game_id", "injury_status", "reason", "reason_category"]


def route(**kw: Any) -> Route:
    base: dict[str, Any] = {"name": "r", "destination": "phase3", "key": ["payload.game_date"]}
    base.update(kw)
    return Route.model_validate(base)


def fp(r: Route, payload: Any) -> str:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return compile_scheme(r)(data)[1]


INJURY = route(rows="payload.players", row_key=["player_lookup", "game_id"], include=INJURY_FIELDS)


def test_value_is_sha256_prefixed_hex() -> None:
    value = fp(INJURY, injury_report(3))
    assert value.startswith("sha256:") and len(value) == 7 + 64
    int(value[7:], 16)


def test_same_content_any_key_order_same_fingerprint() -> None:
    report = injury_report(20)
    reordered = {k: report[k] for k in reversed(list(report))}
    reordered["players"] = [dict(reversed(list(p.items()))) for p in report["players"]]
    assert fp(INJURY, report) == fp(INJURY, reordered)


def test_same_content_any_row_order_same_fingerprint() -> None:
    report = injury_report(50)
    shuffled = dict(report, players=random.Random(7).sample(report["players"], 50))
    assert fp(INJURY, report) == fp(INJURY, shuffled)


def test_rows_with_equal_row_keys_still_order_independent() -> None:
    r = route(rows="payload.rows", row_key=["team"])
    rows = [{"team": "LAL", "v": 1}, {"team": "LAL", "v": 2}, {"team": "BOS", "v": 3}]
    assert fp(r, {"rows": rows}) == fp(r, {"rows": list(reversed(rows))})


def test_whitespace_does_not_count() -> None:
    report = injury_report(5)
    assert fp(INJURY, json.dumps(report).encode()) == fp(INJURY, json.dumps(report, indent=4).encode())


def test_rescrape_with_new_metadata_same_fingerprint() -> None:
    # seeds 1 and 2 differ only in scrape times, run ids, confidence: none of them included
    assert fp(INJURY, injury_report(30, seed=1)) == fp(INJURY, injury_report(30, seed=2))


def test_a_status_change_changes_the_fingerprint() -> None:
    report = injury_report(30)
    changed = json.loads(json.dumps(report))
    changed["players"][17]["injury_status"] = (
        "available" if report["players"][17]["injury_status"] != "available" else "out"
    )
    assert fp(INJURY, report) != fp(INJURY, changed)


def test_excluded_field_changes_do_not_count() -> None:
    r = route(
        rows="payload.props", row_key=["player_lookup", "bookmaker"], exclude=["over_price", "snapshot_timestamp"]
    )
    a = props_snapshot(10, seed=1)
    b = json.loads(json.dumps(a))
    for row in b["props"]:
        row["over_price"] = 9.99
        row["snapshot_timestamp"] = "later"
    assert fp(r, a) == fp(r, b)


def test_included_field_outside_the_list_does_not_count() -> None:
    a = injury_report(5)
    b = json.loads(json.dumps(a))
    b["players"][0]["confidence_score"] = 0.01
    assert fp(INJURY, a) == fp(INJURY, b)


def test_line_move_counts_when_prices_are_excluded() -> None:
    r = route(
        rows="payload.props", exclude=["over_price", "over_price_american", "under_price", "under_price_american"]
    )
    a = props_snapshot(10, seed=1)
    b = json.loads(json.dumps(a))
    b["props"][3]["points_line"] += 1.0
    assert fp(r, a) != fp(r, b)


@pytest.mark.parametrize(
    ("left", "right"), [("1", "1.0"), ("1", "1e0"), ("0", "-0.0"), ("25.5", "25.50"), ("100", "1E2")]
)
def test_numbers_equal_in_value_are_equal(left: str, right: str) -> None:
    r = route(key=["payload.k"])
    assert fp(r, f'{{"k": 1, "v": {left}}}'.encode()) == fp(r, f'{{"k": 1, "v": {right}}}'.encode())


@pytest.mark.parametrize(
    ("left", "right"), [("1", "1.5"), ("25.5", "25.05"), ('"1"', "1"), ("0.1", "0.10000000000000002")]
)
def test_numbers_different_in_value_differ(left: str, right: str) -> None:
    r = route(key=["payload.k"])
    assert fp(r, f'{{"k": 1, "v": {left}}}'.encode()) != fp(r, f'{{"k": 1, "v": {right}}}'.encode())


def test_non_json_payload_is_fingerprinted_as_raw_bytes() -> None:
    payload, value = compile_scheme(route(key=["attributes.id"]))(b"\x00\xffnot json")
    assert payload is NOT_JSON
    assert value == message_fingerprint.__globals__["raw_fingerprint"](b"\x00\xffnot json")


def test_missing_rows_path_is_a_payload_error() -> None:
    with pytest.raises(PayloadError, match=r"payload\.players is missing"):
        fp(INJURY, {"game_date": "x"})


def test_rows_path_not_a_list_is_a_payload_error() -> None:
    with pytest.raises(PayloadError, match="not a list"):
        fp(INJURY, {"players": {"a": 1}})


def test_same_value_in_a_fresh_interpreter() -> None:
    report = injury_report(40)
    code = (
        "import json,sys; sys.path.insert(0, '.');"
        "from tests.unit.test_fingerprint import INJURY, fp;"
        "from tests.support.payloads import injury_report;"
        "print(fp(INJURY, injury_report(40)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "12345"}
    )
    assert out.stdout.strip() == fp(INJURY, report)


def test_message_fingerprint_covers_data_and_attributes() -> None:
    base = message_fingerprint(b"abc", {"a": "1"})
    assert base == message_fingerprint(b"abc", {"a": "1"})
    assert base != message_fingerprint(b"abd", {"a": "1"})
    assert base != message_fingerprint(b"abc", {"a": "2"})
    assert base != message_fingerprint(b"abc", {})


def test_message_fingerprint_ignores_attribute_order() -> None:
    assert message_fingerprint(b"x", {"a": "1", "b": "2"}) == message_fingerprint(b"x", {"b": "2", "a": "1"})


# --- seed schemes: the seeds' own algorithms on data we build -----------------------


def test_data_hash_scheme_reproduces_seed_002() -> None:
    rows = injury_report(25)["players"]
    unique = ["player_lookup", "game_id"]
    expected = SmartIdempotencyMixin(unique).compute_data_hash(rows)
    r = route(
        rows="payload.players",
        row_key=unique,
        scheme="data_hash",
        exclude=["processed_at", "data_hash", "last_updated"],
    )
    assert fp(r, {"players": rows}) == "sha256:" + expected


def test_data_hash_scheme_reproduces_seed_002_with_floats_and_nulls() -> None:
    rows = [
        {"id": "2", "game_date": "2025-11-20", "value": 25.0, "note": None, "processed_at": "t1"},
        {"id": "1", "game_date": "2025-11-20", "value": 100, "flag": True, "last_updated": "t2"},
    ]
    expected = SmartIdempotencyMixin(["id", "game_date"]).compute_data_hash(rows)
    r = route(
        rows="payload",
        row_key=["id", "game_date"],
        scheme="data_hash",
        exclude=["processed_at", "data_hash", "last_updated"],
    )
    assert fp(r, rows) == "sha256:" + expected


def test_event_scheme_reproduces_seed_001() -> None:
    t0 = datetime(2025, 1, 9, 10, 0, tzinfo=UTC)
    events = [
        TransactionEvent(
            t0 + timedelta(seconds=i),
            f"acct{i % 3}",
            "P1",
            "buy" if i % 2 else "sell",
            Decimal(f"{100 + i}.50"),
            i,
            "fill",
        )
        for i in range(12)
    ]
    expected = hash_events(events)
    payload = {
        "request_id": "req-1",
        "events": [
            {
                "timestamp": e.timestamp.isoformat(),
                "account_id": e.account_id,
                "product_id": e.product_id,
                "side": e.side,
                "price": str(e.price),
                "quantity": e.quantity,
                "event_type": e.event_type,
                "ingested_at": "ignored",
            }
            for e in reversed(events)
        ],
    }
    r = route(key=["payload.request_id"], rows="payload.events", scheme="event")
    assert fp(r, payload) == "sha256:" + expected


def test_event_scheme_float_prices_match_seed_float_prices() -> None:
    t0 = datetime(2025, 1, 9, 10, 0, tzinfo=UTC)
    events = [
        TransactionEvent(t0, "a", "p", "buy", 101.5, 3, "fill"),
        TransactionEvent(t0, "b", "p", "sell", 99.0, 1, "fill"),
    ]
    payload = {"events": [{**e.__dict__, "timestamp": e.timestamp.isoformat()} for e in events]}
    r = route(key=["attributes.request"], rows="payload.events", scheme="event")
    assert fp(r, payload) == "sha256:" + hash_events(events)


@pytest.mark.parametrize("number", ["1e400", "-1e400"])
def test_numbers_beyond_double_range_never_collide_with_null(number: str) -> None:
    r = route(key=["payload.k"])
    big = compile_scheme(r)(f'{{"k": 1, "v": {number}}}'.encode())
    assert big[0] is NOT_JSON  # fingerprinted over the raw bytes
    assert big[1] != fp(r, b'{"k": 1, "v": null}')
