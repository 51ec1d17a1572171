"""The embedded store's purge deletes expired keys; a key deleted and created again is a new key
to every compare-and-set, never the old one at the same version (an ABA on the version)."""

from __future__ import annotations

from pathlib import Path

from filter.backends.stores.sqlite import SqliteStore
from filter.core.model import KeyState, Lease

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
