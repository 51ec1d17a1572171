"""The embedded store's file layouts, and the migrations that keep older files readable.

A file holds one table of key state (`key_state`) and, since row state moved out of it, one of
row state (`key_rows`). `create_or_upgrade` brings any earlier layout up to this one (added
columns, the row table, the triggers that keep the two tables in step) and is what opening a
store for writing runs; `read_sql` reads any layout as it is, for a file that is opened
read-only and so cannot be upgraded (`explain`). The store itself, the compare-and-set over
these tables, is `pubsub_filter.backends.stores.sqlite`.
"""

from __future__ import annotations

import sqlite3

_STATE_TABLE = """
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
# The row state (~54 KB at 450 rows) lives in its own table, so the writes that never change it
# (claim, extend, release: SQLite rewrites a whole record on any UPDATE, overflow pages included)
# rewrite only the small state record. A rowid table: SQLite advises against large records in a
# WITHOUT ROWID one. `key_state.rows` is the previous layout's place for it: read when not NULL
# (a file written by earlier code, or by an earlier process still sharing the file), and set to
# NULL by the first commit that writes new rows here.
_ROWS_TABLE = """
CREATE TABLE IF NOT EXISTS key_rows (
    route TEXT NOT NULL,
    key TEXT NOT NULL,
    rows BLOB NOT NULL,
    PRIMARY KEY (route, key)
)
"""
# Triggers, so that every writer keeps the two tables consistent, including a process still running
# the earlier code (which knows only `key_state.rows`): a deleted key takes its rows along (purge,
# in the same statement), and any write naming the old column makes it the one to read.
_TRIGGERS = (
    "CREATE TRIGGER IF NOT EXISTS key_rows_go_with_key AFTER DELETE ON key_state "
    "BEGIN DELETE FROM key_rows WHERE route = old.route AND key = old.key; END",
    "CREATE TRIGGER IF NOT EXISTS key_rows_yield_to_column AFTER UPDATE OF rows ON key_state "
    "BEGIN DELETE FROM key_rows WHERE route = new.route AND key = new.key; END",
)

# Columns newer than the first release. `results` (the in-process API's kept results) is NULL when
# there are none: a process of an earlier version sharing the file never reads it. `selection`
# (what the route compared, `pubsub_filter.core.compare.selection`) is NULL in state written before it was stored,
# which is read as the route's selection; an earlier version sharing the file ignores it.
ADDED_COLUMNS = {"rows": "BLOB", "full_fingerprint": "TEXT", "results": "TEXT", "selection": "TEXT"}

_ROWS_FROM_TABLE = "(SELECT r.rows FROM key_rows r WHERE r.route = s.route AND r.key = s.key)"


def _select(rows: str, full_fingerprint: str, results: str, selection: str) -> str:
    """The state record's columns in the order `sqlite._row_to_state` reads them, for one key."""
    return (
        "SELECT version, fingerprint, forwarded_at, message_id, publish_time, recent, fence, lease_holder, "
        f"lease_fence, lease_expires, lease_fingerprint, lease_message_id, expires_at, {rows}, "
        f"{full_fingerprint}, {results}, {selection} FROM key_state s WHERE s.route = ? AND s.key = ?"
    )


#: One key's state in this layout: the row state from the old column when it is set, else from the row table.
READ = _select(f"COALESCE(s.rows, {_ROWS_FROM_TABLE})", "full_fingerprint", "results", "selection")


def create_or_upgrade(db: sqlite3.Connection) -> None:
    """Create the tables, or bring a file an earlier version wrote up to this layout."""
    db.execute(_STATE_TABLE)
    present = {r[1] for r in db.execute("PRAGMA table_info(key_state)")}
    for column, kind in ADDED_COLUMNS.items():
        if column not in present:
            db.execute(f"ALTER TABLE key_state ADD COLUMN {column} {kind}")
    db.execute("CREATE INDEX IF NOT EXISTS key_state_expiry ON key_state (expires_at)")
    db.execute(_ROWS_TABLE)
    for trigger in _TRIGGERS:
        db.execute(trigger)


def read_sql(db: sqlite3.Connection) -> str | None:
    """`READ` for a file in any layout, as it is (it cannot be upgraded read-only): what it
    lacks (the newer columns, the row table) reads as NULL. None: the file has no state table."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "key_state" not in tables:
        return None
    columns = {r[1] for r in db.execute("PRAGMA table_info(key_state)")}
    if "key_rows" in tables and set(ADDED_COLUMNS) <= columns:
        return READ
    rows = "s.rows" if "rows" in columns else "NULL"
    if "key_rows" in tables:
        rows = f"COALESCE({rows}, {_ROWS_FROM_TABLE})"
    full = "full_fingerprint" if "full_fingerprint" in columns else "NULL"
    return _select(
        rows, full, "results" if "results" in columns else "NULL", "selection" if "selection" in columns else "NULL"
    )
