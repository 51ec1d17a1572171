"""Highest fences in a SQLite file: every write a compare-and-set on the entry's version.

Several consumer processes may share the file (WAL); calls run inline, as the filter's own
SQLite store does: a local write takes microseconds.
"""

from __future__ import annotations

from pathlib import Path

from pubsub_filter.backends.sqlite_file import open_wal
from pubsub_filter.consumer.fence import Seen

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fences (
    identity TEXT PRIMARY KEY,
    fence INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    version INTEGER NOT NULL
) WITHOUT ROWID
"""


class SqliteFences:
    def __init__(self, path: str | Path):
        self._db = open_wal(str(path), 30.0, lambda db: db.execute(_SCHEMA), synchronous="FULL")

    async def read(self, identity: str) -> Seen | None:
        row = self._db.execute(
            "SELECT fence, expires_at, version FROM fences WHERE identity = ?", (identity,)
        ).fetchone()
        return Seen(row[0], row[1], row[2]) if row else None

    async def write(self, identity: str, seen: Seen | None, new: Seen) -> bool:
        if seen is None:
            cur = self._db.execute(
                "INSERT INTO fences VALUES (?, ?, ?, 1) ON CONFLICT(identity) DO NOTHING",
                (identity, new.fence, new.expires_at),
            )
        else:
            cur = self._db.execute(
                "UPDATE fences SET fence = ?, expires_at = ?, version = version + 1 WHERE identity = ? AND version = ?",
                (new.fence, new.expires_at, identity, seen.version),
            )
        return cur.rowcount == 1

    async def close(self) -> None:
        self._db.close()
