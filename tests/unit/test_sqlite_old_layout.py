"""State files written before the row state moved to its own table keep working.

Until the row state moved to its own table, `key_state.rows` held each key's row state. The statements
below are that code's own (f5b9c28), verbatim: they build an old file here, and stand in
for a process still running that code on a shared file.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, KeyState, Lease, Message
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.payloads import injury_report

OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS key_state (
    route TEXT NOT NULL,
    key TEXT NOT NULL,
    version INTEGER NOT NULL,
    fingerprint TEXT,
    forwarded_at REAL,
    message_id TEXT,
    publish_time REAL,
    recent TEXT NOT NULL DEFAULT '[]',
    fence INTEGER NOT NULL DEFAULT 0,
    lease_holder TEXT,
    lease_fence INTEGER,
    lease_expires REAL,
    lease_fingerprint TEXT,
    lease_message_id TEXT,
    expires_at REAL,
    rows BLOB,
    full_fingerprint TEXT,
    PRIMARY KEY (route, key)
) WITHOUT ROWID
"""
OLD_COLUMNS = (
    "version, fingerprint, forwarded_at, message_id, publish_time, recent, fence, "
    "lease_holder, lease_fence, lease_expires, lease_fingerprint, lease_message_id, expires_at, rows, full_fingerprint"
)
OLD_INSERT = (
    f"INSERT INTO key_state (route, key, {OLD_COLUMNS}) VALUES (?, ?, 1, {', '.join('?' * 14)}) "
    "ON CONFLICT (route, key) DO NOTHING"
)
OLD_COMMIT = (
    "UPDATE key_state SET version = version + 1, "
    + ", ".join(f"{c} = ?" for c in OLD_COLUMNS.split(", ")[1:])
    + " WHERE route = ? AND key = ? AND lease_fence = ? AND lease_holder = ?"
)

CONFIG: Config = parse(
    {
        "routes": [
            {
                "name": "injury",
                "destination": "phase3",
                "key": ["payload.game_date"],
                "rows": "payload.players",
                "row_key": ["player_lookup", "game_id"],
                "include": ["player_lookup", "team", "game_id", "injury_status", "reason"],
                "rows_mode": "changed",
            }
        ]
    }
)
KEY = "2025-01-10"


def old_values(s: KeyState) -> tuple[Any, ...]:
    """The previous code's `_values`: the state as that code bound it, row state included."""
    le = s.lease
    return (
        s.fingerprint,
        s.forwarded_at,
        s.message_id,
        s.publish_time,
        msgspec.json.encode([list(p) for p in s.recent]).decode(),
        s.fence,
        le.holder if le else None,
        le.fence if le else None,
        le.expires_at if le else None,
        le.fingerprint if le else None,
        le.message_id if le else None,
        s.expires_at,
        s.rows,
        s.full_fingerprint,
    )


def old_file(path: Path, state: KeyState) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(OLD_SCHEMA)
    db.execute("CREATE INDEX IF NOT EXISTS key_state_expiry ON key_state (expires_at)")
    db.execute(OLD_INSERT, ("injury", KEY, *old_values(state)))
    db.commit()
    db.close()


def where_rows_are(path: Path) -> tuple[bool, bool]:
    """(the old column holds them, the row table holds them)."""
    db = sqlite3.connect(path)
    try:
        (column,) = db.execute("SELECT rows IS NOT NULL FROM key_state").fetchone()
        (table,) = db.execute("SELECT count(*) FROM key_rows").fetchone()
    finally:
        db.close()
    return bool(column), bool(table)


class Rig:
    def __init__(self, path: Path):
        self.store = SqliteStore(path)
        self.publisher = MemoryPublisher()
        self.engine = Engine(
            CONFIG, GuardedStore(self.store, CONFIG.store_errors), self.publisher, MemoryRecorder(), ManualClock()
        )
        self.n = 0

    async def send(self, payload: dict[str, Any]) -> tuple[Decision, dict[str, Any], bytes | None]:
        self.n += 1
        sent = len(self.publisher.published)
        rec = (await self.engine.handle("injury", Message(json.dumps(payload).encode(), {}, f"m{self.n}"))).record
        data = self.publisher.published[-1][1] if len(self.publisher.published) > sent else None
        return rec.decision, dict(rec.extra), data


def changed(report: dict[str, Any], rows: range, status: str) -> dict[str, Any]:
    out = json.loads(json.dumps(report))
    for i in rows:
        out["players"][i]["injury_status"] = status
    out["scrape_time"] = f"2025-01-10T18:{rows.start:02d}:00Z"
    return out


async def test_a_file_of_the_previous_layout_gives_the_decisions_and_row_diffs_of_a_new_one(tmp_path: Path) -> None:
    new = Rig(tmp_path / "new.db")
    first = injury_report(60, seed=1)
    await new.send(first)
    state = await new.store.read("injury", KEY)
    assert state is not None and state.rows is not None
    old_file(tmp_path / "old.db", state)
    old = Rig(tmp_path / "old.db")
    old.n = new.n

    second = changed(first, range(3, 6), "Out")
    third = changed(second, range(10, 12), "Questionable")
    decisions = []
    for report in (second, {**second, "scrape_time": "2025-01-10T19:00:00Z"}, third):
        answer = await old.send(report)
        assert answer == await new.send(report)
        assert await old.store.read("injury", KEY) == await new.store.read("injury", KEY)
        decisions.append((answer[0], answer[1].get("rows_changed")))
    assert decisions == [(Decision.FORWARDED, 3), (Decision.SUPPRESSED, None), (Decision.FORWARDED, 2)]
    assert where_rows_are(tmp_path / "old.db") == (False, True)  # moved by the first commit with new rows
    await new.store.close()
    await old.store.close()


async def test_a_claim_and_a_release_on_a_key_of_the_previous_layout_keep_its_row_state(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old_file(path, KeyState(fingerprint="sha256:a", fence=1, rows=b"old rows"))
    store = SqliteStore(path)
    seen = await store.read("injury", KEY)
    assert seen is not None and seen.rows == b"old rows"
    held = await store.claim("injury", KEY, seen, seen.with_lease(Lease("me/1", 2, 100.0, "sha256:b", "m2")))
    assert held is not None
    await store.release("injury", KEY, held)
    after = await store.read("injury", KEY)
    await store.close()
    assert after is not None and after.rows == b"old rows" and after.lease is None


async def test_a_commit_by_the_previous_code_on_a_shared_file_is_what_is_read(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    first = await store.claim("injury", KEY, None, KeyState(fingerprint="sha256:a", fence=1, rows=b"new layout"))
    assert first is not None
    lease = Lease("old/1", 2, 100.0, "sha256:b", "m2")
    held = await store.claim("injury", KEY, first, first.with_lease(lease))
    assert held is not None
    for rows in (b"old code's rows", None):  # the previous code commits its row state, then none
        other = sqlite3.connect(path)
        other.execute(OLD_COMMIT, (*old_values(replace(held, rows=rows)), "injury", KEY, 2, "old/1"))
        other.commit()
        other.close()
        after = await store.read("injury", KEY)
        assert after is not None and after.rows == rows
    await store.close()
