"""The Firestore store's documents are the ones google-cloud-firestore reads and writes.

The store makes its RPCs with plain protobuf messages (`firestore_wire`), not through the
library's `get()`/`update()`; a rolling deploy has both kinds of writer on one collection.
So what the library wrote (as the store did before) must read back the same, to the
microsecond, and what the store writes must read back through the library as the same state,
with timestamps as timestamps (the TTL policy deletes on `expires_at`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest

from pubsub_filter.backends.stores import TTL_FIELD
from pubsub_filter.backends.stores.firestore import FirestoreStore, from_document, to_document
from pubsub_filter.core.model import KeyState, Lease
from tests.support.emulators import FirestoreEmulator

pytestmark = pytest.mark.emulator

ROUTE = "injuries"
KEY = "2025-01-10|NBA"
#: Times with microseconds, none of them a round number of milliseconds.
AT = 1764270000.123457
FULL = KeyState(
    fingerprint="sha256:" + "1" * 64,
    forwarded_at=AT,
    message_id="m1",
    publish_time=AT - 0.999999,
    recent=(("m0", "sha256:" + "0" * 64), ("m1", "sha256:" + "1" * 64)),
    fence=7,
    lease=Lease(holder="h/1", fence=7, expires_at=AT + 60.000001, fingerprint="sha256:" + "2" * 64, message_id="m2"),
    expires_at=AT + 86400.5,
    rows=bytes(range(256)) * 40,
    full_fingerprint="sha256:" + "3" * 64,
    results=(("m1", "sha256:" + "1" * 64, '{"ok": true, "n": 1.5}'),),
)


@pytest.fixture
async def store(firestore: FirestoreEmulator) -> AsyncIterator[FirestoreStore]:
    with firestore.env():
        opened = FirestoreStore(project=firestore.project, collection="documents")
    yield opened
    await opened.close()


async def through_the_library(store: FirestoreStore) -> tuple[dict[str, Any], KeyState]:
    snap = await store.document(ROUTE, KEY).get()
    raw = snap.to_dict() or {}
    return raw, from_document(raw, snap.update_time)


async def test_a_document_the_library_wrote_reads_back_as_the_same_state(store: FirestoreStore) -> None:
    await store.document(ROUTE, KEY).create(to_document(ROUTE, KEY, FULL))
    seen = await store.read(ROUTE, KEY)
    assert seen == FULL
    # and its version is the one the store writes on: a claim on it wins, a second one on it loses
    lease = Lease(holder="h/2", fence=8, expires_at=AT + 120, fingerprint="sha256:" + "4" * 64, message_id="m3")
    held = await store.claim(ROUTE, KEY, seen, seen.with_lease(lease))
    assert held is not None and held.version != seen.version
    assert await store.claim(ROUTE, KEY, seen, seen.with_lease(replace(lease, holder="h/3"))) is None


async def test_what_the_store_writes_reads_back_through_the_library_as_the_same_state(store: FirestoreStore) -> None:
    held = await store.claim(ROUTE, KEY, None, FULL)
    assert held is not None
    raw, state = await through_the_library(store)
    assert state == FULL == await store.read(ROUTE, KEY)
    assert isinstance(raw[TTL_FIELD], datetime) and raw[TTL_FIELD].timestamp() == FULL.expires_at
    assert isinstance(raw["lease"]["expires_at"], datetime) and isinstance(raw["rows"], bytes)

    # an extend writes one field inside the lease (a dotted path) and leaves the rest of it
    extended = await store.extend(ROUTE, KEY, held, AT + 90.25)
    assert extended is not None
    _, state = await through_the_library(store)
    assert FULL.lease is not None and state.lease == replace(FULL.lease, expires_at=AT + 90.25)

    # a commit writes what changed; a blank lease and empty lists are written as such
    done = replace(FULL, lease=None, recent=(), results=(), rows=None, publish_time=None)
    assert await store.commit(ROUTE, KEY, extended, done)
    raw, state = await through_the_library(store)
    assert state == done == await store.read(ROUTE, KEY)
    assert raw["lease"] is None and raw["recent"] == [] and raw["rows"] is None


async def test_a_closed_store_used_again_answers_on_a_new_channel(store: FirestoreStore) -> None:
    """As the client library does: its channel is built again on the next call after a close."""
    assert await store.claim(ROUTE, KEY, None, FULL) is not None
    await store.close()
    assert await store.read(ROUTE, KEY) == FULL
