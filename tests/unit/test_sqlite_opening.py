"""Opening an SQLite file (store, records, fences) while other processes open it too.

Two pods of a rolling deploy, or the processes of the in-process API, open one fresh file at
the same moment. SQLite answers parts of opening (the switch to WAL, a schema statement that
read an older layout) with SQLITE_BUSY at once, without waiting: each opener must wait for the
file as its timeout allows, and never upgrade a layout another process already upgraded.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest

from pubsub_filter.backends.sqlite_file import open_wal
from tests.support.sqlite_openers import open_each

PROCESSES = 4
FILES = 50


@pytest.mark.parametrize("kind", ["store", "records", "fences"])
def test_processes_opening_one_fresh_file_together_all_open_it(kind: str, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    paths = [str(tmp_path / f"{i}.db") for i in range(FILES)]
    barrier = ctx.Barrier(PROCESSES)
    failures = ctx.Queue()
    procs = [ctx.Process(target=open_each, args=(kind, paths, barrier, failures)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    try:
        failed = [f for _ in procs for f in failures.get(timeout=120)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.exitcode is None:
                p.kill()
                p.join()
    assert failed == []


def test_opening_waits_its_timeout_for_a_file_another_connection_holds(tmp_path: Path) -> None:
    path = str(tmp_path / "held.db")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN")
    holder.execute("SELECT * FROM t").fetchall()  # a read lock: the switch to WAL cannot be made
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        open_wal(path, 0.3, lambda db: None)
    assert time.monotonic() - started >= 0.3
    holder.execute("COMMIT")
    db = open_wal(path, 0.3, lambda db: db.execute("CREATE TABLE u (y)"))
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()
    holder.close()


def test_a_schema_that_fails_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = str(tmp_path / "f.db")

    def half(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE a (x)")
        raise ValueError("the second statement failed")

    with pytest.raises(ValueError):
        open_wal(path, 1.0, half)
    db = open_wal(path, 1.0, lambda db: None)
    assert db.execute("SELECT name FROM sqlite_master").fetchall() == []
    db.close()
