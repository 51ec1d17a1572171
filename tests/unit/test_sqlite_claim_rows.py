"""A claim on the embedded store leaves the row state as it was, and writes new row state when given.

The claim skips the row-state write when the new state carries the row state it read
(a forward's usual claim: the blob can be ~54 KB). These pin that the stored value is
the same either way.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.model import KeyState, Lease

LEASE = Lease("me/1", 2, 100.0, "sha256:b", "m2")


async def stored(tmp_path: Path, rows: bytes) -> tuple[SqliteStore, KeyState]:
    store = SqliteStore(tmp_path / "state.db")
    first = await store.claim("r", "k", None, KeyState(fingerprint="sha256:a", rows=rows, fence=1))
    assert first is not None
    return store, first


async def test_a_claim_carrying_the_row_state_over_keeps_it(tmp_path: Path) -> None:
    store, seen = await stored(tmp_path, b'[["f"],{"[1]":["0123456789abcdef","00000000"]}]')
    held = await store.claim("r", "k", seen, seen.with_lease(LEASE))
    after = await store.read("r", "k")
    assert held is not None and after is not None
    assert after.rows == seen.rows and after.lease == LEASE and after.version == held.version


async def test_a_claim_with_other_row_state_writes_it(tmp_path: Path) -> None:
    store, seen = await stored(tmp_path, b"old")
    held = await store.claim("r", "k", seen, replace(seen.with_lease(LEASE), rows=b"new"))
    after = await store.read("r", "k")
    assert held is not None and after is not None and after.rows == b"new"


async def test_a_claim_that_clears_the_row_state_clears_it(tmp_path: Path) -> None:
    store, seen = await stored(tmp_path, b"old")
    assert await store.claim("r", "k", seen, replace(seen.with_lease(LEASE), rows=None)) is not None
    after = await store.read("r", "k")
    assert after is not None and after.rows is None


async def test_a_claim_on_a_stale_version_changes_nothing(tmp_path: Path) -> None:
    store, seen = await stored(tmp_path, b"old")
    assert await store.claim("r", "k", seen, replace(seen, fingerprint="sha256:c")) is not None
    assert await store.claim("r", "k", seen, seen.with_lease(LEASE)) is None  # seen's version is gone
    after = await store.read("r", "k")
    assert after is not None and after.rows == b"old" and after.lease is None and after.fingerprint == "sha256:c"


async def test_recent_message_ids_read_back_as_the_pairs_stored(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    recent = (("m1", "sha256:a"), ("m2", "sha256:b"))
    assert await store.claim("r", "k", None, KeyState(fingerprint="sha256:b", recent=recent)) is not None
    after = await store.read("r", "k")
    assert after is not None and after.recent == recent and after.decided("m1") == "sha256:a"
