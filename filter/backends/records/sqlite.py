"""Embedded decision records: a SQLite table, written in batches by `BatchingRecorder`."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any, Literal

from filter.backends.records.extra import encode_extra
from filter.core.model import DecisionRecord

_SCHEMA = """
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

_COLS = (
    "time, route, decision, enforced, message_id, key, reason, fingerprint, message_fingerprint, "
    "previous_fingerprint, destination, published_id, fence, publish_time, delivery_attempt, latency_ms, "
    "trace, extra"
)


def _connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SCHEMA)
    return db


class SqliteSink:
    name = "sqlite"

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._db = _connect(self.path)

    def insert(self, rows: list[DecisionRecord]) -> None:
        """Write rows now, on the calling thread (the inline recorder; `write` runs it off the loop)."""
        values = [
            (
                r.time,
                r.route,
                str(r.decision),
                int(r.enforced),
                r.message_id,
                r.key,
                r.reason,
                r.fingerprint,
                r.message_fingerprint,
                r.previous_fingerprint,
                r.destination,
                r.published_id,
                r.fence,
                r.publish_time,
                r.delivery_attempt,
                r.latency_ms,
                r.trace,
                encode_extra(r.extra) if r.extra else None,
            )
            for r in rows
        ]
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(f"INSERT INTO decisions ({_COLS}) VALUES ({', '.join('?' * 18)})", values)

    async def write(self, rows: list[DecisionRecord]) -> None:
        await asyncio.to_thread(self.insert, rows)

    async def close(self) -> None:
        self._db.close()


_BUCKETS = {
    "route": "NULL",
    "hour": "strftime('%Y-%m-%dT%H:00:00Z', time, 'unixepoch')",
    "day": "strftime('%Y-%m-%d', time, 'unixepoch')",
}


def decision_counts(path: str | Path, since: float | None, by: Literal["route", "hour", "day"]) -> list[dict[str, Any]]:
    """Counts per (route, bucket, decision, enforced): the shape every records backend returns."""
    if not Path(path).exists():
        return []
    db = _connect(str(path))
    try:
        bucket = _BUCKETS[by]
        rows = db.execute(
            f"SELECT route, {bucket} AS bucket, decision, enforced, COUNT(*) FROM decisions "
            "WHERE time >= ? GROUP BY route, bucket, decision, enforced ORDER BY route, bucket",
            (since or 0.0,),
        ).fetchall()
    finally:
        db.close()
    return [{"route": r, "bucket": b, "decision": d, "enforced": bool(e), "n": n} for r, b, d, e, n in rows]
