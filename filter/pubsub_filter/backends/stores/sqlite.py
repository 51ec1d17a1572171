"""The embedded state store: one SQLite file, WAL, every write a compare-and-set.

Calls run inline on the event loop: a local WAL read or write takes microseconds, far
less than a hop to a thread. Two processes may share the file: writes are conditional
(on the row version for a claim, on the lease fence for the rest), so the loser of a
race sees zero rows changed and the engine looks again.

The event loop never waits for the file's lock: another connection may hold it for as long
as it likes (another instance sharing the file, an `sqlite3` shell in `BEGIN IMMEDIATE`, a
backup). On the loop a statement does not wait at all (`busy_timeout` 0); a call that finds the
file locked is undone and made again, whole, on a thread, which waits for the lock up to
`busy_timeout` from when the call was made (`pubsub_filter.backends.stores.sqlite_connection`).

A write waiting on the thread for another process's lock holds the store's connection (the
writer), and later writes queue behind it; reads do not: while the writer is held they go
through a second connection (the reader, with a thread of its own for a file it finds
locked), which WAL lets in beside the other process's write. While the writer is free, reads
use it, for its warm page cache (the reader's is dropped by each write of the writer's).
Each read is a statement of its own, so it sees every write committed before it began, this
store's included: reading on the other connection loses nothing of the compare-and-set,
whose conditions are checked by the writes themselves. The cost is the reader's page cache
(SQLite's default, at most ~2 MB) and, when the file is locked, a second thread.

The file's tables, and the migrations from earlier layouts, are `pubsub_filter.backends.stores.sqlite_schema`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from pubsub_filter.backends.sqlite_file import open_wal
from pubsub_filter.backends.stores.sqlite_connection import Connection, Locked, connect
from pubsub_filter.backends.stores.sqlite_schema import READ, create_or_upgrade, read_sql
from pubsub_filter.core.model import KeyState, Lease
from pubsub_filter.core.ports import StoreUnavailable

#: Row state up to this size is kept in `key_state.rows` (a claim rewriting it costs nothing worth
#: a second table); larger state in `key_rows`, written only when it changes.
INLINE_ROWS = 1024

# What `_values()` holds, in order: every column but the key, the version and the old `rows`.
_WRITTEN = (
    "fingerprint",
    "forwarded_at",
    "message_id",
    "publish_time",
    "recent",
    "fence",
    "lease_holder",
    "lease_fence",
    "lease_expires",
    "lease_fingerprint",
    "lease_message_id",
    "expires_at",
    "full_fingerprint",
    "results",
    "selection",
)
_SET = ", ".join(f"{c} = ?" for c in _WRITTEN)
_INSERT = (
    f"INSERT INTO key_state (route, key, version, {', '.join(_WRITTEN)}) "
    f"VALUES (?, ?, ?, {', '.join('?' * len(_WRITTEN))}) ON CONFLICT (route, key) DO NOTHING"
)


def _first_version() -> int:
    """A new key's first version: the microseconds since the epoch, not 1.

    A purge deletes a key and a claim may create it again; a claim conditional on a version
    read before the purge must not find that version on the new key (it would take over a
    live lease). A key's version grows by one a write, so a deleted key's last version is its
    creation time plus its writes, below any later creation's (keys live `state_ttl` at least).
    """
    return time.time_ns() // 1000


_CLAIM = f"UPDATE key_state SET version = version + 1, {_SET} WHERE route = ? AND key = ? AND version = ?"
_COMMIT = (
    f"UPDATE key_state SET version = version + 1, {_SET} "
    "WHERE route = ? AND key = ? AND lease_fence = ? AND lease_holder = ?"
)
# New row state is written in place (same-sized row state, the usual case, rewrites only the pages
# that changed); a key still in the old layout has its old column cleared first (which fires
# `key_rows_yield_to_column`, so nothing stale is left in either place).
_CLEAR_OLD_ROWS = "UPDATE key_state SET rows = NULL WHERE route = ? AND key = ? AND rows IS NOT NULL"
_PUT_ROWS = (
    "INSERT INTO key_rows (route, key, rows) VALUES (?, ?, ?) "
    "ON CONFLICT (route, key) DO UPDATE SET rows = excluded.rows"
)
# No row state: the old column set to NULL fires `key_rows_yield_to_column`, which deletes the stored
# rows in the same statement. Always written, never skipped as "unchanged": a claim's `seen` may be
# expired state the decision forgot (`KeyState.forgotten`: no rows), not what is stored.
_CLAIM_NO_ROWS = _CLAIM.replace(" WHERE", ", rows = NULL WHERE", 1)
_COMMIT_NO_ROWS = _COMMIT.replace(" WHERE", ", rows = NULL WHERE", 1)


# Straight into the tuple of pairs the state holds, in C (a list that is not of pairs is an error, as before).
_decode_recent = msgspec.json.Decoder(tuple[tuple[Any, Any], ...]).decode
_decode_results = msgspec.json.Decoder(tuple[tuple[str, str, str], ...]).decode


def _row_to_state(row: tuple[Any, ...]) -> KeyState:
    (
        version,
        fp,
        fwd_at,
        mid,
        pub,
        recent,
        fence,
        holder,
        lfence,
        lexp,
        lfp,
        lmid,
        exp,
        rows,
        full_fp,
        results,
        sel,
    ) = row
    lease = Lease(holder, lfence, lexp, lfp, lmid) if holder is not None else None
    results_kept = _decode_results(results) if results else ()
    # positionally, in KeyState's field order: read once per decision, 1.26 against 1.67 µs by keyword
    return KeyState(
        fp, fwd_at, mid, pub, _decode_recent(recent), fence, lease, exp, rows, full_fp, results_kept, version, sel
    )


def _values(s: KeyState) -> tuple[Any, ...]:
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
        s.full_fingerprint,
        msgspec.json.encode([list(r) for r in s.results]).decode() if s.results else None,
        s.selection,
    )


#: How often the embedded store deletes expired keys by itself (Firestore's TTL policy does it there).
PURGE_EVERY = 3600.0

#: Expired keys the store's own purge deletes in one claim: a few milliseconds on the event loop,
#: where one statement for all of them held it for seconds (200,000 keys: 2 s).
PURGE_BATCH = 500

_EXPIRED = "expires_at < ? AND (lease_expires IS NULL OR lease_expires < ?)"
_PURGE_BATCH = (
    f"DELETE FROM key_state WHERE (route, key) IN (SELECT route, key FROM key_state WHERE {_EXPIRED} LIMIT ?)"
)


class SqliteStore:
    """`purge_every`: seconds between the store's own purges of expired keys (`pubsub_filter.runtime.wiring` sets
    `PURGE_EVERY`; None: only when `purge()` is called). A purge runs from a claim, a write the
    forward path makes anyway, so the suppress path stays a single read. `clock` tells the
    purge what time it is (the engine's clock, in tests that move time by hand). That purge runs
    in batches, one a claim (`PURGE_BATCH` keys), from when it is due until a batch finds fewer,
    so no claim holds the event loop for long whatever has expired."""

    #: `GuardedStore` sets no timeout: a call either runs inline on the loop, where no timeout
    #: could fire, or on the store's thread, bounded by `busy_timeout` already; a timeout there
    #: would abandon a write the thread still makes.
    suspends = False

    def __init__(
        self,
        path: str | Path,
        busy_timeout: float = 5.0,
        *,
        purge_every: float | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.path = str(path)
        self.busy_timeout = busy_timeout
        self.ops: Counter[str] = Counter()  # statements by kind, as FirestoreStore.ops counts RPCs
        self.purge_every = purge_every
        self.clock = clock
        self._next_purge = 0.0
        self._purging: float | None = None  # the time the purge under way deletes keys expired before
        try:
            self._db = open_wal(self.path, busy_timeout, create_or_upgrade)
            self._writer = Connection(self._db, self.path, busy_timeout, "writer")
            # Opened once the schema is there; it never writes (`query_only`), and reads what is committed.
            self._reader = Connection(connect(self.path, busy_timeout), self.path, busy_timeout, "reader")
            self._reader.exec("PRAGMA query_only = 1")
        except (sqlite3.Error, StoreUnavailable) as exc:
            with contextlib.suppress(AttributeError, sqlite3.Error):
                self._db.close()
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
        self._exec = self._writer.exec
        self._run = self._writer.run

    def _write(self, sql: str, params: tuple[Any, ...], route: str, key: str, rows: bytes | None) -> bool:
        """One conditional write of the state record and, given `rows`, of new row state: whether it won.

        The two writes are one transaction, so a crash between them, or a write that lost its
        condition, leaves neither behind.
        """
        if rows is None:
            return self._exec(sql, params).rowcount == 1
        self._exec("BEGIN")
        try:
            won = self._exec(sql, params).rowcount == 1
            if won:
                self._exec(_CLEAR_OLD_ROWS, (route, key))
                self._exec(_PUT_ROWS, (route, key, rows))
            self._exec("COMMIT" if won else "ROLLBACK")
        except BaseException:
            self._rollback()
            raise
        return won

    def _write_state(
        self,
        sql: str,
        sql_no_rows: str,
        params: tuple[Any, ...],
        route: str,
        key: str,
        rows: bytes | None,
        stored_rows: bytes | None,
    ) -> bool:
        """A claim's or commit's conditional write (`sql`), the row state included as needed: none
        clears it (`sql_no_rows`), rows equal to `stored_rows` (what the condition guarantees is
        stored) are left as they are, other rows are written too."""
        if rows is None:
            return self._write(sql_no_rows, params, route, key, None)
        unchanged = rows is stored_rows or rows == stored_rows
        if not unchanged and len(rows) <= INLINE_ROWS:
            # A small state (a whole-payload route's field checksums, `pubsub_filter.core.compare.fields`) goes in
            # the state record itself: one statement, not a transaction of four. Setting the column
            # fires `key_rows_yield_to_column`, so no larger state is left behind in the row table.
            at = len(_WRITTEN)
            inline = sql.replace(" WHERE", ", rows = ? WHERE", 1)
            return self._write(inline, (*params[:at], rows, *params[at:]), route, key, None)
        return self._write(sql, params, route, key, None if unchanged else rows)

    def _rollback(self) -> None:
        # After some errors (SQLITE_FULL, IOERR, ...) SQLite has already rolled back by itself.
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def _get(self, on: Connection, route: str, key: str) -> KeyState | None:
        self.ops["read"] += 1
        # fetchall: the statement runs to its end, so the reader holds no read transaction (and no
        # old snapshot) past this call
        rows = on.exec(READ, (route, key)).fetchall()
        return _row_to_state(rows[0]) if rows else None

    def _claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        self._purge_when_due()
        self.ops["write"] += 1
        self.ops["claim"] += 1
        if seen is None:
            version = _first_version()
            won = self._write(_INSERT, (route, key, version, *_values(new)), route, key, new.rows)
        else:
            # A forward's claim carries the row state it read over (the engine's `claimed`): the
            # update is conditional on that read's version, so the stored rows are that very value.
            params = (*_values(new), route, key, seen.version)
            won = self._write_state(_CLAIM, _CLAIM_NO_ROWS, params, route, key, new.rows, seen.rows)
            version = seen.version + 1
        return replace(new, version=version) if won else None

    def _extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        assert held.lease is not None
        self.ops["write"] += 1
        self.ops["extend"] += 1
        row = self._exec(
            "UPDATE key_state SET version = version + 1, lease_expires = ? "
            "WHERE route = ? AND key = ? AND lease_fence = ? AND lease_holder = ? RETURNING version",
            (expires_at, route, key, held.lease.fence, held.lease.holder),
        ).fetchone()
        if row is None:
            return None
        lease = Lease(held.lease.holder, held.lease.fence, expires_at, held.lease.fingerprint, held.lease.message_id)
        return replace(held, lease=lease, version=row[0])

    def _commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        assert held.lease is not None
        self.ops["write"] += 1
        self.ops["commit"] += 1
        # `held` is what is stored while its lease is (only its own extensions move the version), and
        # the update is conditional on that lease: rows equal to held's are the stored ones.
        params = (*_values(new), route, key, held.lease.fence, held.lease.holder)
        if self._write_state(_COMMIT, _COMMIT_NO_ROWS, params, route, key, new.rows, held.rows):
            return True
        current = self._get(self._writer, route, key)
        return current is not None and current.holds_commit_of(new)

    def _release(self, route: str, key: str, held: KeyState) -> None:
        assert held.lease is not None
        self.ops["write"] += 1
        self.ops["release"] += 1
        self._exec(
            "UPDATE key_state SET version = version + 1, lease_holder = NULL, lease_fence = NULL, "
            "lease_expires = NULL, lease_fingerprint = NULL, lease_message_id = NULL "
            "WHERE route = ? AND key = ? AND lease_fence = ? AND lease_holder = ?",
            (route, key, held.lease.fence, held.lease.holder),
        )

    def purge(self, now: float | None = None) -> int:
        """Delete keys past their expiry (the embedded twin of Firestore's TTL policy). Not for
        the event loop: it waits for the file's lock (`busy_timeout`).

        Safe against a holder that is still publishing: a key with a live lease stays, and a
        late commit is conditional on its holder token, which a recreated key never carries.
        """
        return self._writer.waiting(time.monotonic() + self.busy_timeout, self._purge, now)

    def _purge(self, now: float | None) -> int:
        at = self.clock() if now is None else now
        cur = self._exec(f"DELETE FROM key_state WHERE {_EXPIRED}", (at, at))
        self.ops["purge"] += 1
        return cur.rowcount

    def _purge_when_due(self) -> None:
        if self.purge_every is None:
            return
        if self._purging is None:
            now = self.clock()
            if now < self._next_purge:
                return
            self._next_purge = now + self.purge_every
            self._purging = now
        at = self._purging
        self.ops["purge"] += 1
        if self._exec(_PURGE_BATCH, (at, at, PURGE_BATCH)).rowcount < PURGE_BATCH:
            self._purging = None  # nothing left that had expired by then

    async def read(self, route: str, key: str) -> KeyState | None:
        # On the writer's connection while it is free: its page cache stays warm, where the reader's
        # is dropped by every write of the writer's (~3 page reads more a decision). On the reader's
        # while a write holds the writer, or the file's lock holds the read up: never behind that write.
        try:
            return self._writer.now(self._get, self._writer, route, key)
        except Locked:
            pass
        return await self._reader.run(self._get, self._reader, route, key)

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        return await self._run(self._claim, route, key, seen, new)

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        return await self._run(self._extend, route, key, held, expires_at)

    async def commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        return await self._run(self._commit, route, key, held, new)

    async def release(self, route: str, key: str, held: KeyState) -> None:
        await self._run(self._release, route, key, held)

    async def ping(self) -> None:
        if not self._writer.lock.acquire(blocking=False):
            return  # a call is under way on the thread (the file is locked): it will say how it went
        try:
            self._exec("SELECT 1").fetchone()
        finally:
            self._writer.lock.release()

    async def close(self) -> None:
        try:
            await self._writer.close()
        finally:
            await self._reader.close()


def selections(path: str | Path, route: str, now: float) -> dict[str | None, int] | None:
    """How many live keys of `route` were last forwarded under each selection (None: state
    written before selections were stored), read without writing anything (`pubsub-filter plan`,
    `check`). None when there is no file or no state table yet."""
    file = Path(path)
    if not file.exists():
        return None
    try:
        db = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot open {path} read-only: {exc}") from exc
    try:
        columns = {r[1] for r in db.execute("PRAGMA table_info(key_state)")}
        if not columns:
            return None
        selection = "selection" if "selection" in columns else "NULL"
        rows = db.execute(
            f"SELECT {selection}, COUNT(*) FROM key_state WHERE route = ? AND forwarded_at IS NOT NULL "
            "AND (expires_at IS NULL OR expires_at > ?) GROUP BY 1",
            (route, now),
        ).fetchall()
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"sqlite {path}: {exc}") from exc
    finally:
        db.close()
    return {s: int(n) for s, n in rows}


def read_only(path: str | Path, route: str, key: str) -> KeyState | None:
    """What is stored for `route` and `key`, read without writing anything (for `explain`).

    No file, or a file with no state table yet: None, and nothing is created. The file is
    opened read-only (`mode=ro`): no schema, no journal-mode change. A WAL reader may still
    leave the empty `-wal` and `-shm` side files SQLite itself keeps beside the database.
    """
    file = Path(path)
    if not file.exists():
        return None
    try:
        db = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot open {path} read-only: {exc}") from exc
    try:
        sql = read_sql(db)
        if sql is None:
            return None
        row = db.execute(sql, (route, key)).fetchone()
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"sqlite {path}: {exc}") from exc
    finally:
        db.close()
    return _row_to_state(row) if row else None
