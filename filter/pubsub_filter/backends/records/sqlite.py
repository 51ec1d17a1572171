"""Embedded decision records: a SQLite table, written by `SqliteSink` and read back by `SqliteReader`."""

from __future__ import annotations

import asyncio
import functools
import json
import operator
import sqlite3
from itertools import chain, compress, groupby, repeat
from pathlib import Path
from typing import Any

from pubsub_filter.backends.records.extra import encode_extra
from pubsub_filter.backends.sqlite_file import open_wal
from pubsub_filter.core.compare.selection import FORWARDED_LABEL, SELECTION_CHANGED, SUPPRESSED_LABEL
from pubsub_filter.core.compare.tolerance import WITHIN, WITHIN_TOLERANCE
from pubsub_filter.core.escaped import text
from pubsub_filter.core.model import COLUMN_NAMES, DECISION_COLUMNS, DecisionRecord
from pubsub_filter.core.ports import Bucket, DecisionCount, DecisionRow

_TYPES = {"time": "REAL", "text": "TEXT", "bool": "INTEGER", "int": "INTEGER", "float": "REAL", "json": "TEXT"}
# SQLite keeps this text as written in sqlite_master: it spells today's tables byte for byte
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS decisions (\n"
    + ",\n".join(f"    {c.name} {_TYPES[c.kind]}{'' if c.nullable else ' NOT NULL'}" for c in DECISION_COLUMNS)
    + "\n)",
    "CREATE INDEX IF NOT EXISTS decisions_time ON decisions (time, route)",
)
_INSERT = f"INSERT INTO decisions ({', '.join(COLUMN_NAMES)}) VALUES ({', '.join('?' * len(COLUMN_NAMES))})"
_EXTRA_AT = COLUMN_NAMES.index("extra")
_ENFORCED_AT = COLUMN_NAMES.index("enforced")
_present = functools.partial(operator.is_not, None)
# The INSERT naming the columns that have a value, by which have one, as its head ("INSERT
# INTO decisions (...) VALUES ") and one row's "(?, ...)": a decision path leaves the same
# columns empty every time, so there are a handful.
_insert_of: dict[tuple[bool, ...], tuple[str, str]] = {}
#: Rows in one INSERT at most, or fewer where SQLite binds fewer parameters a statement (999
#: before 3.32): `SqliteSink` asks its connection.
MAX_ROWS = 500

#: A record with what its INSERT binds: which columns have a value, and those values.
Prepared = tuple[DecisionRecord, tuple[bool, ...], list[Any]]
Refused = list[tuple[DecisionRecord, Exception]]
_columns_of = operator.itemgetter(1)
_bound_of = operator.itemgetter(2)


def _values(r: DecisionRecord) -> list[Any]:
    row = list(r.values())
    row[_ENFORCED_AT] = int(row[_ENFORCED_AT])  # the INTEGER 0 or 1 a bool binds as, without the adapter lookup
    row[_EXTRA_AT] = encode_extra(r.extra) if r.extra else None
    return row


def _escaped(values: list[Any]) -> list[Any]:
    """A row's values with the text UTF-8 cannot write escaped (`pubsub_filter.core.escaped`): the row
    is stored with `\\ud800` where a lone surrogate was, never refused for it."""
    return [text(v) if isinstance(v, str) else v for v in values]


def prepared(r: DecisionRecord) -> Prepared:
    """The record with only its non-NULL values to bind: the columns it leaves out are NULL, as
    a bound None would have made them (the table has no DEFAULTs), and binding a None (or a
    bool) costs the sqlite3 module an adapter lookup per value (~3,300 instructions each)."""
    row = _values(r)
    mask = tuple(map(_present, row))
    return r, mask, list(compress(row, mask))


def _insert(mask: tuple[bool, ...], rows: int) -> str:
    """The INSERT of `rows` rows, each binding the columns `mask` names."""
    parts = _insert_of.get(mask)
    if parts is None:
        names = list(compress(COLUMN_NAMES, mask))
        head = f"INSERT INTO decisions ({', '.join(names)}) VALUES "
        parts = _insert_of[mask] = (head, f"({', '.join('?' * len(names))})")
    head, row = parts
    return head + ", ".join(repeat(row, rows))


def _statements(rows: list[Prepared], most: int) -> list[tuple[str, list[Any], list[Prepared]]]:
    """(INSERT, its values, its rows): one for each run of consecutive rows binding the same
    columns, in record order, of `most` rows at most."""
    out = []
    for mask, same in groupby(rows, _columns_of):
        run = list(same)
        for start in range(0, len(run), most):
            part = run[start : start + most]
            out.append((_insert(mask, len(part)), list(chain.from_iterable(map(_bound_of, part))), part))
    return out


def _create(db: sqlite3.Connection) -> None:
    for statement in _SCHEMA:
        db.execute(statement)


def _connect(path: str) -> sqlite3.Connection:
    return open_wal(path, 10.0, _create)


class SqliteSink:
    name = "sqlite"

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._db = _connect(self.path)

    def wait_for_lock(self, seconds: float) -> None:
        """How long a write waits for the file while another connection holds it locked."""
        self._db.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")

    def insert(self, rows: list[DecisionRecord]) -> None:
        """Write rows now, on the calling thread (the batching recorder's `write` runs it off the loop)."""
        if len(rows) == 1:
            # One statement in SQLite's own transaction: no BEGIN and COMMIT round trips.
            _, mask, values = prepared(rows[0])
            try:
                self._db.execute(_insert(mask, 1), values)
            except UnicodeEncodeError:
                self._db.execute(_insert(mask, 1), _escaped(values))
            return
        values = [_values(r) for r in rows]
        try:
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(_INSERT, values)
        except UnicodeEncodeError:  # rolled back: the batch again, its text escaped
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(_INSERT, map(_escaped, values))

    def insert_apart(self, rows: list[Prepared]) -> Refused:
        """Write rows now in one commit (the inline recorder's group of records from different
        requests), one INSERT for each run of rows binding the same columns: one statement
        for the usual group, so a writer thread takes the GIL back after one `sqlite3_step`
        and its reset, not after each row's. A row that cannot be bound or stored is left out and returned with why (the
        statement that held it, which stored nothing, is made again row by row), so it costs
        only itself. Raises, having stored none, when the transaction itself fails (the file
        locked past the timeout, the disk full)."""
        most = min(MAX_ROWS, self._db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(COLUMN_NAMES))
        statements = _statements(rows, most)
        if len(statements) == 1 and self._failure(*statements[0][:2]) is None:
            return []  # the usual group: one statement in SQLite's own transaction
        refused: Refused = []
        with self._db:  # COMMIT at the end; ROLLBACK when an OperationalError leaves it
            self._db.execute("BEGIN")
            for sql, values, part in statements:
                # a statement that failed (the only one: above) is made again row by row: a refused row costs itself
                if len(statements) == 1 or self._failure(sql, values) is not None:
                    refused += [(r[0], why) for r in part if (why := self._failure(_insert(r[1], 1), r[2])) is not None]
        return refused

    def _failure(self, sql: str, values: list[Any]) -> Exception | None:
        """Why a row's value cannot be bound or stored (the statement stored nothing), or None
        once it is stored. Raises the file's own errors (`OperationalError`): none is stored."""
        try:
            try:
                self._db.execute(sql, values)
            except UnicodeEncodeError:  # text SQLite cannot take (a lone surrogate): stored escaped
                self._db.execute(sql, _escaped(values))
        except sqlite3.OperationalError:
            raise
        except Exception as exc:
            return exc
        return None

    async def write(self, rows: list[DecisionRecord]) -> None:
        await asyncio.to_thread(self.insert, rows)

    async def close(self) -> None:
        self._db.close()


_BUCKETS = {
    "route": "NULL",
    "hour": "strftime('%Y-%m-%dT%H:00:00Z', time, 'unixepoch')",
    "day": "strftime('%Y-%m-%d', time, 'unixepoch')",
}


#: The decision as `skip-rate` counts it: a suppression within tolerance under its own name.
_LABELLED = (
    f"CASE WHEN decision = 'suppressed' AND substr(reason, 1, {len(WITHIN)}) = ? "
    f"THEN '{WITHIN_TOLERANCE}' "
    "WHEN decision IN ('forwarded', 'suppressed') "
    f"AND substr(reason, 1, {len(SELECTION_CHANGED)}) = '{SELECTION_CHANGED}' "
    f"THEN CASE decision WHEN 'forwarded' THEN '{FORWARDED_LABEL}' ELSE '{SUPPRESSED_LABEL}' END "
    "ELSE decision END"
)


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
                f"SELECT route, {_BUCKETS[by]} AS bucket, {_LABELLED} AS label, enforced, COUNT(*) FROM decisions "
                "WHERE time >= ? GROUP BY route, bucket, label, enforced ORDER BY route, bucket",
                (WITHIN, since or 0.0),
            ).fetchall()
        finally:
            db.close()
        return [{"route": r, "bucket": b, "decision": d, "enforced": bool(e), "n": n} for r, b, d, e, n in rows]

    def keys_forwarded(self, route: str, since: float | None) -> int:
        """How many keys of `route` were forwarded at or after `since` (`pubsub-filter plan`)."""
        if not self.path.exists():
            return 0
        db = _connect(str(self.path))
        try:
            (n,) = db.execute(
                "SELECT COUNT(DISTINCT key) FROM decisions WHERE route = ? AND time >= ? AND decision = 'forwarded'",
                (route, since or 0.0),
            ).fetchone()
        finally:
            db.close()
        return int(n)

    def decision_rows(self, route: str, since: float | None) -> list[DecisionRow]:
        if not self.path.exists():
            return []
        db = _connect(str(self.path))
        try:
            rows = db.execute(
                "SELECT time, decision, enforced, key, reason, fingerprint, previous_fingerprint, extra "
                "FROM decisions WHERE route = ? AND time >= ? ORDER BY time",
                (route, since or 0.0),
            ).fetchall()
        finally:
            db.close()
        return [
            {
                "time": t,
                "decision": d,
                "enforced": bool(e),
                "key": k,
                "reason": r,
                "fingerprint": fp,
                "previous_fingerprint": pfp,
                "extra": json.loads(x) if x else {},
            }
            for t, d, e, k, r, fp, pfp, x in rows
        ]

    def close(self) -> None:
        pass  # each read opens and closes its own connection
