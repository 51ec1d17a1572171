"""The embedded store's purge deletes expired keys; a key deleted and created again is a new key
to every compare-and-set, never the old one at the same version (an ABA on the version)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubsub_filter.backends.stores.sqlite import PURGE_BATCH, SqliteStore
from pubsub_filter.core.model import KeyState, Lease
from tests.support.loopclock import Stopwatch

DAY = 86400.0


def claim_of(holder: str, at: float) -> KeyState:
    lease = Lease(holder, 1, at + 60.0, "sha256:a", f"m-{holder}")
    return KeyState(fence=1, lease=lease, expires_at=at + DAY)


async def test_a_claim_on_state_read_before_a_purge_loses_to_the_key_created_after_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    assert await store.claim("r", "k", None, claim_of("dead", 0.0)) is not None  # its holder died
    seen = await store.read("r", "k")  # another instance reads it, expired, and is about to take it over
    assert seen is not None and store.purge(now=2 * DAY) == 1
    assert await store.claim("r", "k", None, claim_of("live", 2 * DAY)) is not None  # a third creates it again
    assert await store.claim("r", "k", seen, claim_of("late", 2 * DAY)) is None
    now = await store.read("r", "k")
    assert now is not None and now.lease is not None and now.lease.holder == "live"
    await store.close()


async def test_a_purge_keeps_a_key_whose_lease_is_live(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    held = KeyState(fence=1, lease=Lease("me", 1, 3 * DAY, "sha256:a", "m1"), expires_at=DAY)
    assert await store.claim("r", "k", None, held) is not None
    assert store.purge(now=2 * DAY) == 0 and await store.read("r", "k") is not None
    await store.close()


@pytest.mark.loop_may_block("it inserts 200,000 keys in its body; it times each claim itself")
async def test_the_stores_own_purge_of_many_expired_keys_holds_no_claim_for_long(tmp_path: Path) -> None:
    """200,000 expired keys once took one claim 0.5-2 s to delete, all of it on the event loop."""
    expired = 200_000
    store = SqliteStore(tmp_path / "state.db", purge_every=3600.0, clock=lambda: 2 * DAY)
    columns = "route, key, version, recent, fence, expires_at"
    with store._db:
        store._db.execute("BEGIN")
        keys = ((f"k{i}", DAY) for i in range(expired))
        store._db.executemany(f"INSERT INTO key_state ({columns}) VALUES ('r', ?, 1, '[]', 1, ?)", keys)
    slowest, claims = 0.0, 0
    while store._db.execute("SELECT COUNT(*) FROM key_state WHERE expires_at < ?", (2 * DAY,)).fetchone()[0]:
        watch = Stopwatch()  # what the claim held the loop, not what a busy machine took
        assert await store.claim("r", f"new-{claims}", None, claim_of("me", 2 * DAY)) is not None
        slowest = max(slowest, watch.held())
        claims += 1
        assert claims <= expired // PURGE_BATCH + 1
    assert slowest < 0.1, f"a claim held the loop {slowest:.3f}s"
    assert store._db.execute("SELECT COUNT(*) FROM key_state").fetchone()[0] == claims  # the new keys alone
    await store.close()
