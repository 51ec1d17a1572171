"""The decision columns, defined once in `pubsub_filter.core.model`: the SQLite table, the BigQuery
rows and the log line's fields derived from them are the ones written before they were."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec

from pubsub_filter.backends.records.bigquery import to_row
from pubsub_filter.backends.records.sqlite import SqliteReader, SqliteSink
from pubsub_filter.core.model import COLUMN_NAMES, Decision, DecisionRecord

#: The table as the code before the column specs created it, byte for byte.
TODAYS_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    time REAL NOT NULL,
    route TEXT NOT NULL,
    decision TEXT NOT NULL,
    enforced INTEGER NOT NULL,
    message_id TEXT,
    key TEXT,
    reason TEXT,
    fingerprint TEXT,
    message_fingerprint TEXT,
    previous_fingerprint TEXT,
    destination TEXT,
    published_id TEXT,
    fence INTEGER,
    publish_time REAL,
    delivery_attempt INTEGER,
    latency_ms REAL,
    trace TEXT,
    extra TEXT
);
CREATE INDEX IF NOT EXISTS decisions_time ON decisions (time, route);
"""

FULL = DecisionRecord(
    time=1_767_225_600.25,
    route="injuries",
    decision=Decision.FORWARDED,
    enforced=False,
    message_id="m1",
    key="2026-01-01",
    reason="changed",
    fingerprint="sha256:aa",
    message_fingerprint="sha256:bb",
    previous_fingerprint="sha256:cc",
    destination="phase3",
    published_id="p1",
    fence=7,
    publish_time=1_767_225_599.5,
    delivery_attempt=2,
    latency_ms=0.41,
    trace="t1",
    details={"rows_changed": 3},
)


def created_sql(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [row[0] for row in db.execute("SELECT sql FROM sqlite_master ORDER BY name")]
    finally:
        db.close()


def test_the_columns_are_the_decision_records_fields_in_order() -> None:
    # the last column, `extra`, holds the fields after `trace`: the details, then what acting came to
    fields = tuple(f.name for f in msgspec.structs.fields(DecisionRecord))
    assert (*fields[: len(COLUMN_NAMES) - 1], "extra") == COLUMN_NAMES
    assert fields[len(COLUMN_NAMES) - 1 :] == ("details", "heartbeats", "committed", "cause")


def test_a_new_sqlite_table_is_created_as_before(tmp_path: Path) -> None:
    before = sqlite3.connect(tmp_path / "before.db")
    before.executescript(TODAYS_SCHEMA)
    before.close()
    SqliteSink(tmp_path / "after.db")._db.close()
    assert created_sql(tmp_path / "after.db") == created_sql(tmp_path / "before.db")


async def test_a_table_created_before_is_written_and_read(tmp_path: Path) -> None:
    path = tmp_path / "decisions.db"
    db = sqlite3.connect(path)
    db.executescript(TODAYS_SCHEMA)
    db.execute("INSERT INTO decisions (time, route, decision, enforced) VALUES (1767225600.0, 'injuries', 'stale', 1)")
    db.commit()
    db.close()
    sink = SqliteSink(path)
    sink.insert([FULL])
    await sink.close()
    counts = SqliteReader(path).decision_counts(None, "route")
    got = sorted((r["decision"], r["enforced"], r["n"]) for r in counts)
    assert got == [("forwarded", False, 1), ("stale", True, 1)]


async def test_sqlite_stores_each_column_with_its_old_type_and_value(tmp_path: Path) -> None:
    sink = SqliteSink(tmp_path / "decisions.db")
    sink.insert([FULL, DecisionRecord(0.0, "r", Decision.SUPPRESSED, True, "m2")])
    rows = sink._db.execute(f"SELECT {', '.join(f'typeof({n}), {n}' for n in COLUMN_NAMES)} FROM decisions").fetchall()
    await sink.close()
    full, bare = (dict(zip(COLUMN_NAMES, zip(row[::2], row[1::2], strict=True), strict=True)) for row in rows)
    assert full["enforced"] == ("integer", 0) and bare["enforced"] == ("integer", 1)
    assert full["decision"] == ("text", "forwarded") and full["fence"] == ("integer", 7)
    assert full["time"] == ("real", 1_767_225_600.25) and full["latency_ms"] == ("real", 0.41)
    assert full["extra"] == ("text", '{"rows_changed":3}') and bare["extra"] == ("null", None)
    assert full["trace"] == ("text", "t1") and bare["key"] == ("null", None)


def test_the_bigquery_row_is_every_column_in_order() -> None:
    assert to_row(FULL) == {
        "time": "2026-01-01T00:00:00.250000Z",
        "route": "injuries",
        "decision": "forwarded",
        "enforced": False,
        "message_id": "m1",
        "key": "2026-01-01",
        "reason": "changed",
        "fingerprint": "sha256:aa",
        "message_fingerprint": "sha256:bb",
        "previous_fingerprint": "sha256:cc",
        "destination": "phase3",
        "published_id": "p1",
        "fence": 7,
        "publish_time": "2025-12-31T23:59:59.500000Z",
        "delivery_attempt": 2,
        "latency_ms": 0.41,
        "trace": "t1",
        "extra": '{"rows_changed":3}',
    }
    assert list(to_row(FULL)) == list(COLUMN_NAMES)
    assert type(to_row(FULL)["decision"]) is str


def test_the_log_line_fields_are_the_columns_with_extra_spread_before_trace() -> None:
    fields = FULL.line_fields()
    assert list(fields) == [*(n for n in COLUMN_NAMES if n not in ("trace", "extra")), "rows_changed", "trace"]
    assert type(fields["decision"]) is str and fields["decision"] == "forwarded"
    assert fields["rows_changed"] == 3 and fields["publish_time"] == FULL.publish_time
