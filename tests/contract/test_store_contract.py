"""The StateStore contract (filter/pubsub_filter/core/ports.py), one behaviour per test, on every backend.

SQLite is the reference; Firestore (on the emulator) must behave the same. Times are
rounded to the millisecond so they survive Firestore's microsecond timestamps exactly.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest

from pubsub_filter.backends.stores import TTL_FIELD
from pubsub_filter.backends.stores.firestore import FirestoreStore, doc_id
from pubsub_filter.core.engine.failed_open import FailedOpen
from pubsub_filter.core.model import UNKNOWN, KeyState, Lease
from pubsub_filter.core.ports import StoreUnavailable
from tests.contract.conftest import COLLECTION, OpenStore
from tests.support.emulators import FirestoreEmulator
from tests.support.net import free_port
from tests.support.polling import eventually

ROUTE = "injuries"
KEY = "2025-01-10|NBA/é"  # separators, a slash and non-ASCII: the key must not leak into ids
DAY = 86400.0
FP1 = "sha256:" + "1" * 64
FP2 = "sha256:" + "2" * 64


def now() -> float:
    return round(time.time(), 3)


def leased(
    base: KeyState | None, holder: str, at: float, *, ttl: float = 60.0, fp: str = FP1, mid: str = "m1"
) -> KeyState:
    """What the engine claims: `base` plus a lease with the next fence."""
    base = base or KeyState()
    lease = Lease(holder=holder, fence=base.fence + 1, expires_at=at + ttl, fingerprint=fp, message_id=mid)
    return KeyState(
        fingerprint=base.fingerprint,
        forwarded_at=base.forwarded_at,
        message_id=base.message_id,
        publish_time=base.publish_time,
        recent=base.recent,
        fence=lease.fence,
        lease=lease,
        expires_at=at + DAY,
    )


def forwarded(held: KeyState, at: float, fp: str = FP1, mid: str = "m1", publish_time: float | None = None) -> KeyState:
    """What the engine commits after a publish: the new last forward, no lease."""
    return KeyState(
        fingerprint=fp,
        forwarded_at=at,
        message_id=mid,
        publish_time=publish_time if publish_time is not None else at - 1.5,
        recent=(*held.recent, (mid, fp)),
        fence=held.fence,
        lease=None,
        expires_at=at + DAY,
    )


async def taken_over(store: Any, at: float) -> tuple[KeyState, KeyState]:
    """Holder "a" claims with a lease that has already lapsed; holder "b" takes the key over."""
    a = await store.claim(ROUTE, KEY, None, leased(None, "a", at, ttl=-1.0))
    assert a is not None
    seen = await store.read(ROUTE, KEY)
    assert seen is not None and seen.lease is not None and not seen.lease.live(at)
    b = await store.claim(ROUTE, KEY, seen, leased(seen, "b", at, fp=FP2, mid="m2"))
    assert b is not None and b.fence == a.fence + 1
    return a, b


# --- read and claim -----------------------------------------------------------------


async def test_read_of_an_unknown_key_is_none(store: Any) -> None:
    assert await store.read(ROUTE, KEY) is None


async def test_claim_on_a_new_key_succeeds_once_and_a_second_claim_with_seen_none_loses(store: Any) -> None:
    t = now()
    first = leased(None, "a", t)
    won = await store.claim(ROUTE, KEY, None, first)
    assert won == first and won.version is not None
    assert await store.claim(ROUTE, KEY, None, leased(None, "b", t)) is None
    stored = await store.read(ROUTE, KEY)
    assert stored == first and stored.version == won.version


async def test_claim_with_a_stale_seen_version_loses(store: Any) -> None:
    t = now()
    held = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    assert await store.commit(ROUTE, KEY, held, forwarded(held, t))
    seen = await store.read(ROUTE, KEY)
    assert await store.claim(ROUTE, KEY, seen, leased(seen, "b", t)) is not None
    assert await store.claim(ROUTE, KEY, seen, leased(seen, "c", t)) is None  # `seen` is now stale
    stored = await store.read(ROUTE, KEY)
    assert stored.lease is not None and stored.lease.holder == "b"


async def test_claim_over_the_last_forward_keeps_it(store: Any) -> None:
    t = now()
    held = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    done = forwarded(held, t, publish_time=t - 7.25)
    assert await store.commit(ROUTE, KEY, held, done)
    seen = await store.read(ROUTE, KEY)
    again = await store.claim(ROUTE, KEY, seen, leased(seen, "b", t, fp=FP2, mid="m2"))
    assert again is not None
    stored = await store.read(ROUTE, KEY)
    assert (stored.fingerprint, stored.message_id, stored.publish_time, stored.recent) == (
        FP1,
        "m1",
        t - 7.25,
        (("m1", FP1),),
    )


# --- extend -------------------------------------------------------------------------


async def test_extend_with_the_right_fence_moves_expiry_and_returns_a_new_version(store: Any) -> None:
    t = now()
    held = await store.claim(ROUTE, KEY, None, leased(None, "a", t, ttl=30.0))
    ext = await store.extend(ROUTE, KEY, held, t + 90.0)
    assert ext is not None and ext.lease is not None
    assert ext.lease.expires_at == t + 90.0 and ext.lease.fence == held.lease.fence
    assert ext.version is not None and ext.version != held.version
    stored = await store.read(ROUTE, KEY)
    assert stored.lease == ext.lease and stored.version == ext.version
    again = await store.extend(ROUTE, KEY, ext, t + 150.0)  # the heartbeat chains on the returned state
    assert again is not None and again.lease.expires_at == t + 150.0


async def test_extend_after_a_takeover_returns_none(store: Any) -> None:
    a, b = await taken_over(store, now())
    assert await store.extend(ROUTE, KEY, a, now() + 60.0) is None
    stored = await store.read(ROUTE, KEY)
    assert stored.lease == b.lease


async def test_extend_presenting_an_older_version_of_our_own_lease_still_extends(store: Any) -> None:
    """A beat whose reply was lost moved the version; the lease is still ours."""
    t = now()
    held = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    assert await store.extend(ROUTE, KEY, held, t + 70.0) is not None
    ext = await store.extend(ROUTE, KEY, held, t + 80.0)
    assert ext is not None and ext.lease.expires_at == t + 80.0
    assert (await store.read(ROUTE, KEY)).version == ext.version


# --- commit -------------------------------------------------------------------------


async def test_commit_with_the_held_fence_stores_the_forward_and_clears_the_lease(store: Any) -> None:
    t = now()
    held = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    done = forwarded(held, t + 0.5, fp=FP1, mid="m1", publish_time=t - 3.125)
    assert await store.commit(ROUTE, KEY, held, done) is True
    stored = await store.read(ROUTE, KEY)
    assert stored == done
    assert stored.lease is None and stored.fence == held.fence
    assert (stored.fingerprint, stored.recent, stored.publish_time) == (FP1, (("m1", FP1),), t - 3.125)


async def test_commit_with_a_stale_fence_is_refused_and_leaves_the_newer_holders_state(store: Any) -> None:
    t = now()
    a, b = await taken_over(store, t)
    assert await store.commit(ROUTE, KEY, a, forwarded(a, t, fp=FP1, mid="m1")) is False
    stored = await store.read(ROUTE, KEY)
    assert stored == b


async def test_a_retried_commit_that_already_landed_reports_true(store: Any) -> None:
    t = now()
    held = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    done = forwarded(held, t)
    assert await store.commit(ROUTE, KEY, held, done) is True
    assert await store.commit(ROUTE, KEY, held, done) is True
    assert await store.read(ROUTE, KEY) == done


async def test_commit_presenting_an_older_version_of_our_own_lease_still_lands(store: Any) -> None:
    """The heartbeat's last extension landed but its reply did not: `held` is one version behind."""
    t = now()
    held = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    assert await store.extend(ROUTE, KEY, held, t + 90.0) is not None
    done = forwarded(held, t)
    assert await store.commit(ROUTE, KEY, held, done) is True
    assert await store.read(ROUTE, KEY) == done


async def test_a_commit_is_not_mistaken_for_a_landed_retry_after_a_newer_forward(store: Any) -> None:
    t = now()
    a, b = await taken_over(store, t)
    assert await store.commit(ROUTE, KEY, b, forwarded(b, t, fp=FP2, mid="m2"))
    assert await store.commit(ROUTE, KEY, a, forwarded(a, t, fp=FP1, mid="m1")) is False
    assert (await store.read(ROUTE, KEY)).fingerprint == FP2


# --- release ------------------------------------------------------------------------


async def test_release_drops_only_our_lease_and_keeps_the_last_forward(store: Any) -> None:
    t = now()
    first = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    done = forwarded(first, t, fp=FP1, mid="m1")
    assert await store.commit(ROUTE, KEY, first, done)
    seen = await store.read(ROUTE, KEY)
    second = await store.claim(ROUTE, KEY, seen, leased(seen, "b", t, fp=FP2, mid="m2"))
    await store.release(ROUTE, KEY, second)
    stored = await store.read(ROUTE, KEY)
    assert stored.lease is None
    assert (stored.fingerprint, stored.message_id, stored.recent) == (FP1, "m1", (("m1", FP1),))
    assert stored.fence == second.fence  # the fence issued stays issued


async def test_release_with_a_stale_fence_is_a_no_op(store: Any) -> None:
    a, b = await taken_over(store, now())
    await store.release(ROUTE, KEY, a)
    assert await store.read(ROUTE, KEY) == b


async def test_release_presenting_an_older_version_of_our_own_lease_still_releases(store: Any) -> None:
    t = now()
    held = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    assert await store.extend(ROUTE, KEY, held, t + 90.0) is not None
    await store.release(ROUTE, KEY, held)
    assert (await store.read(ROUTE, KEY)).lease is None


# --- fences -------------------------------------------------------------------------


async def test_the_fence_only_ever_grows(store: Any) -> None:
    t = now()
    fences = []
    seen = None
    for i in range(3):
        held = await store.claim(ROUTE, KEY, seen, leased(seen, f"h{i}", t, mid=f"m{i}"))
        assert held is not None
        fences.append((await store.read(ROUTE, KEY)).fence)
        await store.extend(ROUTE, KEY, held, t + 99.0)
        fences.append((await store.read(ROUTE, KEY)).fence)
        if i == 1:
            await store.release(ROUTE, KEY, held)
        else:
            assert await store.commit(ROUTE, KEY, held, forwarded(held, t, mid=f"m{i}"))
        fences.append((await store.read(ROUTE, KEY)).fence)
        seen = await store.read(ROUTE, KEY)
    assert fences == sorted(fences) and fences[0] == 1 and fences[-1] == 3
    assert [f for i, f in enumerate(fences) if i % 3 == 0] == [1, 2, 3]  # each claim issued a new one


# --- row state ----------------------------------------------------------------------

ROWS = bytes(range(256)) * 216  # the size of 450 rows' state


async def test_row_state_stays_through_a_claim_an_extension_and_a_release(store: Any) -> None:
    t = now()
    first = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    assert await store.commit(ROUTE, KEY, first, replace(forwarded(first, t), rows=ROWS))
    seen = await store.read(ROUTE, KEY)
    held = await store.claim(ROUTE, KEY, seen, replace(leased(seen, "b", t, fp=FP2, mid="m2"), rows=seen.rows))
    assert held is not None and (await store.read(ROUTE, KEY)).rows == ROWS
    extended = await store.extend(ROUTE, KEY, held, t + 90.0)
    assert extended is not None and (await store.read(ROUTE, KEY)).rows == ROWS
    await store.release(ROUTE, KEY, extended)
    assert (await store.read(ROUTE, KEY)).rows == ROWS


async def test_a_commit_replaces_the_row_state_or_clears_it(store: Any) -> None:
    t = now()
    held = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    assert await store.commit(ROUTE, KEY, held, replace(forwarded(held, t), rows=ROWS))
    assert (await store.read(ROUTE, KEY)).rows == ROWS
    seen = await store.read(ROUTE, KEY)
    held = await store.claim(ROUTE, KEY, seen, replace(leased(seen, "b", t, fp=FP2, mid="m2"), rows=seen.rows))
    assert await store.commit(ROUTE, KEY, held, replace(forwarded(held, t, fp=FP2, mid="m2"), rows=ROWS[::-1]))
    assert (await store.read(ROUTE, KEY)).rows == ROWS[::-1]
    seen = await store.read(ROUTE, KEY)
    held = await store.claim(ROUTE, KEY, seen, replace(leased(seen, "c", t, fp=FP1, mid="m3"), rows=seen.rows))
    assert await store.commit(ROUTE, KEY, held, forwarded(held, t, fp=FP1, mid="m3"))  # a route without row_key now
    assert (await store.read(ROUTE, KEY)).rows is None


async def test_a_refused_commit_leaves_its_row_state_out(store: Any) -> None:
    t = now()
    a, _ = await taken_over(store, t)
    assert await store.commit(ROUTE, KEY, a, replace(forwarded(a, t), rows=ROWS)) is False
    assert (await store.read(ROUTE, KEY)).rows is None


async def test_a_claim_over_forgotten_state_leaves_nothing_of_it(store: Any) -> None:
    """The engine claims expired state as the decision saw it (`KeyState.forgotten`): nothing of
    the last forward may survive that claim, even if the publish then fails."""
    t = now()
    first = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    done = replace(forwarded(first, t), rows=ROWS, full_fingerprint=FP2)
    assert await store.commit(ROUTE, KEY, first, done)
    forgotten = (await store.read(ROUTE, KEY)).forgotten()
    held = await store.claim(ROUTE, KEY, forgotten, leased(forgotten, "b", t, fp=FP2, mid="m2"))
    assert held is not None
    await store.release(ROUTE, KEY, held)
    stored = await store.read(ROUTE, KEY)
    assert stored == replace(forgotten, lease=None, fence=held.fence, expires_at=held.expires_at)


async def test_a_claim_over_state_seen_as_unknown_downstream_stores_it_unknown(store: Any) -> None:
    """After a fail-open the engine claims the state as it decided on it (`unknown_downstream`):
    the stored fingerprint must go, and stay gone once the claim is released."""
    t = now()
    first = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    assert await store.commit(ROUTE, KEY, first, forwarded(first, t))
    seen = (await store.read(ROUTE, KEY)).unknown_downstream()
    held = await store.claim(ROUTE, KEY, seen, leased(seen, "b", t, fp=FP2, mid="m2"))
    assert held is not None
    await store.release(ROUTE, KEY, held)
    stored = await store.read(ROUTE, KEY)
    assert stored.fingerprint is None and stored.downstream is UNKNOWN and stored.forwarded_at == t


async def test_a_claim_over_state_seen_after_a_fail_open_stores_the_fail_open_publish_time(store: Any) -> None:
    """The fail-open memory hands the claim the state with the fail-open message's publish time
    (`FailedOpen.view`): the claim stores it, so an older message redelivered after this claim,
    even once it is released, is still stale, on every backend."""
    t = now()
    first = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
    assert await store.commit(ROUTE, KEY, first, forwarded(first, t, publish_time=t - 10.0))
    memory = FailedOpen()
    memory.remember(ROUTE, KEY, FP2, t - 5.0, t)
    seen = memory.view(ROUTE, KEY, await store.read(ROUTE, KEY))
    assert seen is not None and seen.publish_time == t - 5.0
    held = await store.claim(ROUTE, KEY, seen, leased(seen, "b", t, fp=FP1, mid="m2"))
    assert held is not None
    await store.release(ROUTE, KEY, held)
    stored = await store.read(ROUTE, KEY)
    assert stored.publish_time == t - 5.0 and stored.downstream is UNKNOWN


# --- races --------------------------------------------------------------------------


async def test_concurrent_claimers_on_a_new_key_have_exactly_one_winner(open_store: OpenStore) -> None:
    stores = [open_store(), open_store()]  # two "processes"
    t = now()
    results = await asyncio.gather(*(stores[i % 2].claim(ROUTE, KEY, None, leased(None, f"h{i}", t)) for i in range(8)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert (await stores[0].read(ROUTE, KEY)).lease == winners[0].lease


async def test_concurrent_claimers_on_an_existing_key_have_exactly_one_winner(open_store: OpenStore) -> None:
    stores = [open_store(), open_store()]
    t = now()
    held = await stores[0].claim(ROUTE, KEY, None, leased(None, "first", t))
    assert await stores[0].commit(ROUTE, KEY, held, forwarded(held, t))
    seen = await stores[1].read(ROUTE, KEY)
    results = await asyncio.gather(*(stores[i % 2].claim(ROUTE, KEY, seen, leased(seen, f"h{i}", t)) for i in range(8)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert (await stores[0].read(ROUTE, KEY)).lease == winners[0].lease


async def test_fifty_keys_with_eight_concurrent_claimers_each_have_fifty_winners(open_store: OpenStore) -> None:
    stores = [open_store(), open_store()]
    t = now()
    keys = [f"k{i}" for i in range(50)]
    results = await asyncio.gather(
        *(stores[c % 2].claim(ROUTE, key, None, leased(None, f"{key}/h{c}", t)) for c in range(8) for key in keys)
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 50
    assert {w.lease.holder.split("/")[0] for w in winners} == set(keys)


# --- Firestore specifics ------------------------------------------------------------


class FieldsWritten(FirestoreStore):
    """The Firestore store, noting the fields each conditional update sends (the emulator does the rest)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields: list[tuple[str, set[str]]] = []

    async def _update(self, kind: str, route: str, key: str, fields: dict[str, Any], version: Any) -> Any:
        self.fields.append((kind, set(fields)))
        return await super()._update(kind, route, key, fields, version)


@pytest.mark.emulator
async def test_firestore_writes_the_row_state_only_when_it_changes(firestore: FirestoreEmulator) -> None:
    with firestore.env():
        store = FieldsWritten(project=firestore.project, collection=COLLECTION)
    try:
        t = now()
        first = await store.claim(ROUTE, KEY, None, leased(None, "a", t))
        assert await store.commit(ROUTE, KEY, first, replace(forwarded(first, t), rows=ROWS))
        seen = await store.read(ROUTE, KEY)
        claim = replace(leased(seen, "b", t + 1.0, fp=FP2, mid="m2"), rows=seen.rows)
        held = await store.claim(ROUTE, KEY, seen, claim)
        held = await store.extend(ROUTE, KEY, held, t + 90.0)
        await store.release(ROUTE, KEY, held)
        seen = await store.read(ROUTE, KEY)
        held = await store.claim(ROUTE, KEY, seen, replace(leased(seen, "c", t, fp=FP2, mid="m3"), rows=seen.rows))
        assert await store.commit(ROUTE, KEY, held, replace(forwarded(held, t, fp=FP2, mid="m3"), rows=ROWS))
        assert (await store.read(ROUTE, KEY)).rows == ROWS
        with_rows = [kind for kind, fields in store.fields if "rows" in fields]
        claimed = [fields for kind, fields in store.fields if kind == "claim"]
    finally:
        await store.close()
    assert with_rows == ["commit"]  # the first one; the last carried the same rows over
    # everything but the row state: the rest of a claim's `seen` may not be what is stored
    assert "rows" not in claimed[0] and {"fence", "lease", TTL_FIELD, "publish_time"} <= claimed[0]


@pytest.mark.emulator
async def test_firestore_document_is_keyed_by_hash_and_the_ttl_field_is_a_timestamp(
    firestore: FirestoreEmulator,
) -> None:
    with firestore.env():
        store = FirestoreStore(project=firestore.project, collection=COLLECTION)
    try:
        t = now()
        await store.claim(ROUTE, KEY, None, leased(None, "a", t))
        ref = store.document(ROUTE, KEY)
        assert ref.id == doc_id(ROUTE, KEY) == hashlib.sha256(f"{ROUTE}\x00{KEY}".encode()).hexdigest()
        raw = (await ref.get()).to_dict()
        assert TTL_FIELD == "expires_at"
        assert isinstance(raw[TTL_FIELD], datetime) and raw[TTL_FIELD].tzinfo is not None
        assert raw[TTL_FIELD].timestamp() == t + DAY
        assert (raw["route"], raw["key"]) == (ROUTE, KEY)
        assert isinstance(raw["lease"]["expires_at"], datetime)
        assert set(raw) == {
            "route", "key", "fingerprint", "forwarded_at", "message_id", "publish_time",
            "recent", "fence", "lease", TTL_FIELD, "rows", "full_fingerprint", "results", "selection",
        }  # fmt: skip
    finally:
        await store.close()


@pytest.mark.emulator
async def test_firestore_unreachable_raises_store_unavailable(firestore: FirestoreEmulator) -> None:
    dead = FirestoreEmulator(project=firestore.project, port=free_port())  # never started
    with dead.env():
        store = FirestoreStore(project=dead.project, collection=COLLECTION, timeout=2.0)
    try:
        with pytest.raises(StoreUnavailable):
            await store.read(ROUTE, KEY)
        with pytest.raises(StoreUnavailable):
            await store.claim(ROUTE, KEY, None, leased(None, "a", now()))
        with pytest.raises(StoreUnavailable):
            await store.ping()
    finally:
        await store.close()


@pytest.mark.emulator
async def test_firestore_store_answers_again_soon_after_the_emulator_restarts(firestore: FirestoreEmulator) -> None:
    """The same store object works again once Firestore is back, without waiting out gRPC's
    default reconnect backoff (1 s, 1.6 s, 2.6 s, ... up to 120 s; ours redials every <= 1 s).

    The bound includes the restarted JVM's slow first request (~1.6 s here).
    """
    with firestore.env():
        store = FirestoreStore(project=firestore.project, collection=COLLECTION, timeout=2.0)
    try:
        await store.ping()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, firestore.stop)
        for _ in range(10):  # an outage long enough for a default channel to back off for seconds
            with pytest.raises(StoreUnavailable):
                await store.read(ROUTE, KEY)
            await asyncio.sleep(0.3)  # the thing under test: time passing in the outage, no condition to wait for
        await loop.run_in_executor(None, firestore.start)
        back = time.monotonic()

        async def answers() -> bool:
            try:
                assert await store.read(ROUTE, KEY) is None
            except StoreUnavailable:
                return False
            return True

        await eventually(answers, 15.0, "no answer within 15 s of the restart", poll=0.05)
        took = time.monotonic() - back
        assert took < 5.0, f"answered only {took:.2f}s after the emulator was back"
    finally:
        await store.close()
        firestore.start()  # whatever happened, leave it running for the next test
