"""Embedded decision records: a SQLite table, written by `SqliteSink` and read back by `SqliteReader`."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from filter.backends.records.extra import encode_extra
from filter.core.model import COLUMN_NAMES, DECISION_COLUMNS, DecisionRecord
from filter.core.ports import Bucket, DecisionCount

_TYPES = {"time": "REAL", "text": "TEXT", "bool": "INTEGER", "int": "INTEGER", "float": "REAL", "json": "TEXT"}
# SQLite keeps this text as written in sqlite_master: it spells today's tables byte for byte
_SCHEMA = (
    "\nCREATE TABLE IF NOT EXISTS decisions (\n"
    + ",\n".join(f"    {c.name} {_TYPES[c.kind]}{'' if c.nullable else ' NOT NULL'}" for c in DECISION_COLUMNS)
    + "\n);\nCREATE INDEX IF NOT EXISTS decisions_time ON decisions (time, route);\n"
)
_INSERT = f"INSERT INTO decisions ({', '.join(COLUMN_NAMES)}) VALUES ({', '.join('?' * len(COLUMN_NAMES))})"
_EXTRA_AT = COLUMN_NAMES.index("extra")


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
        values = []
        for r in rows:
            row = list(r.values())  # a bool binds as the INTEGER 0 or 1 it was written as
            row[_EXTRA_AT] = encode_extra(r.extra) if r.extra else None
            values.append(row)
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(_INSERT, values)

    async def write(self, rows: list[DecisionRecord]) -> None:
        await asyncio.to_thread(self.insert, rows)

    async def close(self) -> None:
        self._db.close()


_BUCKETS = {
    "route": "NULL",
    "hour": "strftime('%Y-%m-%dT%H:00:00Z', time, 'unixepoch')",
    "day": "strftime('%Y-%m-%d', time, 'unixepoch')",
}


class SqliteReader:
    """The `RecordsReader` of the SQLite decisions table."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def decision_counts(self, since: float | None, by: Bucket) -> list[DecisionCount]:
        if by not in _BUCKETS:
            raise ValueError(f"by must be route, hour or day, not {by!r}")
        if not self.path.exists():
            return []  # nothing decided yet: reading must not create the file
        db = _connect(str(self.path))
        try:
            rows = db.execute(
                f"SELECT route, {_BUCKETS[by]} AS bucket, decision, enforced, COUNT(*) FROM decisions "
                "WHERE time >= ? GROUP BY route, bucket, decision, enforced ORDER BY route, bucket",
                (since or 0.0,),
            ).fetchall()
        finally:
            db.close()
        return [{"route": r, "bucket": b, "decision": d, "enforced": bool(e), "n": n} for r, b, d, e, n in rows]

    def close(self) -> None:
        pass  # each read opens and closes its own connection
