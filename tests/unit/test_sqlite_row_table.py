"""The embedded store keeps a key's row state in its own table, written only when it changes.

A claim, a heartbeat's extension and a release never change the row state (~54 KB at 450
rows), so they must not rewrite it; a commit writes state and rows together or not at all.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.model import KeyState, Lease
from pubsub_filter.core.ports import StoreUnavailable

ROWS = bytes(range(256)) * 216  # the size of 450 rows' state
NEW_ROWS = ROWS[:-1] + b"!"


def lease(holder: str, fence: int) -> Lease:
    return Lease(holder, fence, 100.0, "sha256:b", "m2")


def wal_bytes(path: Path) -> int:
    return (path.parent / (path.name + "-wal")).stat().st_size


def checkpoint(path: Path) -> None:
    """Copy the WAL into the database and empty it, from a connection of the test's own."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        db.close()


def stored_rows(path: Path) -> list[tuple[str, str, bytes]]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT route, key, rows FROM key_rows ORDER BY route, key").fetchall()
    finally:
        db.close()


async def first(store: SqliteStore, route: str = "r", key: str = "k", rows: bytes | None = ROWS) -> KeyState:
    state = await store.claim(route, key, None, KeyState(fingerprint="sha256:a", rows=rows, fence=1, expires_at=50.0))
    assert state is not None
    return state


async def held_by(store: SqliteStore, seen: KeyState, holder: str = "me/1") -> KeyState:
    held = await store.claim("r", "k", seen, seen.with_lease(lease(holder, seen.fence + 1)))
    assert held is not None
    return held


async def test_a_claim_an_extension_and_a_release_write_less_than_the_row_state(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    seen = await first(store)
    writes = {}
    checkpoint(path)
    held = await held_by(store, seen)
    writes["claim"] = wal_bytes(path)
    checkpoint(path)
    extended = await store.extend("r", "k", held, 200.0)
    assert extended is not None
    writes["extend"] = wal_bytes(path)
    checkpoint(path)
    await store.release("r", "k", extended)
    writes["release"] = wal_bytes(path)
    await store.close()
    assert all(written < len(ROWS) // 4 for written in writes.values()), writes


async def test_a_commit_with_new_row_state_is_read_back_with_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    held = await held_by(store, await first(store))
    assert await store.commit("r", "k", held, replace(held, lease=None, rows=NEW_ROWS, fingerprint="sha256:c"))
    after = await store.read("r", "k")
    await store.close()
    assert after is not None and after.rows == NEW_ROWS and after.fingerprint == "sha256:c"


async def test_a_commit_without_row_state_leaves_none_behind(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    held = await held_by(store, await first(store))
    assert await store.commit("r", "k", held, replace(held, lease=None, rows=None))
    after = await store.read("r", "k")
    await store.close()
    assert after is not None and after.rows is None and stored_rows(path) == []


async def test_a_commit_that_lost_its_lease_leaves_its_row_state_out(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    seen = await first(store)
    mine = await held_by(store, seen, "me/1")
    theirs = await held_by(store, await store.read("r", "k") or seen, "them/1")  # took the key over
    assert not await store.commit("r", "k", mine, replace(mine, lease=None, rows=NEW_ROWS, fingerprint="sha256:c"))
    after = await store.read("r", "k")
    await store.close()
    assert after is not None and after.rows == ROWS and after.lease == theirs.lease


async def test_a_claim_that_lost_the_race_leaves_its_row_state_out(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    seen = await first(store)
    await held_by(store, seen)  # moves the version
    assert await store.claim("r", "k", seen, replace(seen.with_lease(lease("them/1", 2)), rows=NEW_ROWS)) is None
    after = await store.read("r", "k")
    await store.close()
    assert after is not None and after.rows == ROWS


async def test_a_row_state_write_that_fails_undoes_the_state_write_with_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    held = await held_by(store, await first(store))
    fault = sqlite3.connect(path)
    for event in ("INSERT", "UPDATE"):  # the upsert takes either way
        fault.execute(f"CREATE TRIGGER fail_{event} BEFORE {event} ON key_rows BEGIN SELECT RAISE(ABORT, 'full'); END")
    fault.commit()
    with pytest.raises(StoreUnavailable, match="full"):
        await store.commit("r", "k", held, replace(held, lease=None, rows=NEW_ROWS, fingerprint="sha256:c"))
    after = await store.read("r", "k")
    fault.execute("DROP TRIGGER fail_INSERT")
    fault.execute("DROP TRIGGER fail_UPDATE")
    fault.commit()
    fault.close()
    # nothing half-written, and the connection is usable again: the commit can be made now
    assert after is not None and after.rows == ROWS and after.lease == held.lease and after.fingerprint == "sha256:a"
    assert await store.commit("r", "k", held, replace(held, lease=None, rows=NEW_ROWS, fingerprint="sha256:c"))
    await store.close()


async def test_a_purged_key_takes_its_row_state_along(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    await first(store)  # expires at 50
    assert store.purge(now=60.0) == 1
    again = await first(store, rows=None)
    await store.close()
    assert stored_rows(path) == [] and again.rows is None


async def test_keys_whose_route_and_key_run_together_alike_keep_their_own_row_state(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    await first(store, "r", "a|b", rows=b"one")
    await first(store, "r|a", "b", rows=b"two")
    await first(store, "r", "a|b\x00", rows=b"three")
    reads = [await store.read(r, k) for r, k in (("r", "a|b"), ("r|a", "b"), ("r", "a|b\x00"))]
    await store.close()
    assert [s.rows if s else None for s in reads] == [b"one", b"two", b"three"]


async def test_a_small_state_is_committed_in_the_state_record_in_one_statement(tmp_path: Path) -> None:
    """A whole-payload route's field checksums (a few hundred bytes) ride in the state record: one
    UPDATE, no transaction with the row table. Large row state still goes to the row table."""
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    seen = await first(store, rows=ROWS)  # a large state first: the small one must take its place
    held = await held_by(store, seen)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    small = b'[["a","b"],{"":["0123456789abcdef","0000000100000002"]}]'
    assert await store.commit("r", "k", held, replace(held, lease=None, rows=small, fingerprint="sha256:b"))
    store._db.set_trace_callback(None)
    assert statements and not any(s.startswith(("BEGIN", "INSERT", "COMMIT")) for s in statements), statements
    assert stored_rows(path) == []  # nothing stale left in the row table
    current = await store.read("r", "k")
    assert current is not None and current.rows == small
    await store.close()
