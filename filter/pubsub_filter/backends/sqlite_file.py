"""Opening an SQLite file in WAL mode that other processes may be opening at the same moment.

Two pods of a rolling deploy, or two processes of the in-process API, open one fresh file
together. SQLite answers some of what opening does with SQLITE_BUSY at once, without calling
the busy handler, because waiting could deadlock: switching the file to WAL (a shared lock
wanting an exclusive one while another connection holds a shared lock and wants the same), and
a schema statement whose read saw the file before another connection's write. So the switch is
retried for as long as the connection's timeout allows, and the schema is made in one
`BEGIN IMMEDIATE` transaction, which takes the write lock first (its wait is the busy handler's)
and so sees, and upgrades, the layout the last process left: two processes never both add a
column.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential


def is_locked(exc: BaseException) -> bool:
    """SQLITE_BUSY, any of its extended codes (BUSY_SNAPSHOT, BUSY_RECOVERY, ...)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


def open_wal(
    path: str,
    timeout: float,
    schema: Callable[[sqlite3.Connection], object],
    *,
    synchronous: str = "NORMAL",
) -> sqlite3.Connection:
    """A connection to `path` in autocommit mode (transactions explicit), usable from any
    thread, with the file in WAL mode and `schema` run in one write transaction. Another
    connection holding the file locked is waited for up to `timeout` seconds in all; past
    that, or on any other error, the SQLite error is raised and the connection closed."""
    db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    try:
        for attempt in Retrying(
            retry=retry_if_exception(is_locked),
            stop=stop_after_delay(timeout),
            wait=wait_random_exponential(multiplier=0.002, max=0.05),
            reraise=True,
        ):
            with attempt:
                db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("BEGIN IMMEDIATE")
        try:
            schema(db)
        except BaseException:
            if db.in_transaction:  # some errors (SQLITE_FULL, ...) have rolled it back already
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    except BaseException:
        db.close()
        raise
    return db
