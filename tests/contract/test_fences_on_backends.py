"""The consumer-side fence helper on both of its stores (SQLite and the Firestore emulator).

A consumer takes a forward whose fence is at least the highest it took for the key, and
drops a lower one; two consumers sharing the store never both take an older fence.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.consumer.fence import Admission, FenceError, Fences, FenceStore, Seen
from pubsub_filter.consumer.stores.firestore import FirestoreFences
from pubsub_filter.consumer.stores.sqlite import SqliteFences
from tests.contract.conftest import BACKENDS
from tests.support.clock import ManualClock

OpenFences = Callable[..., Fences]


@pytest.fixture(params=BACKENDS)
async def open_fences(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenFences]:
    """Each call opens one more consumer on the same backing store."""
    emu = request.getfixturevalue("firestore") if request.param == "firestore" else None
    opened: list[Fences] = []

    def open_(clock: ManualClock | None = None, wrap: Callable[[FenceStore], FenceStore] | None = None) -> Fences:
        store: FenceStore
        if emu is None:
            store = SqliteFences(tmp_path / "fences.db")
        else:
            with emu.env():
                store = FirestoreFences(collection="fences")
        fences = Fences(wrap(store) if wrap else store, forget_after=3600, clock=(clock or ManualClock()).now)
        opened.append(fences)
        return fences

    yield open_
    for fences in opened:
        await fences.close()


def forward(fence: int, key: str = "g1", route: str = "reports") -> dict[str, str]:
    return {"filter_fence": str(fence), "filter_key": key, "filter_route": route}


async def test_the_first_fence_for_a_key_is_accepted(open_fences: OpenFences) -> None:
    admitted = await open_fences().admit(forward(3))
    assert (admitted.accepted, admitted.highest) == (True, None)


async def test_a_higher_fence_is_accepted(open_fences: OpenFences) -> None:
    fences = open_fences()
    await fences.admit(forward(3))
    admitted = await fences.admit(forward(4))
    assert (admitted.accepted, admitted.highest) == (True, 3)


async def test_a_lower_fence_than_one_taken_is_dropped(open_fences: OpenFences) -> None:
    fences = open_fences()
    await fences.admit(forward(4))
    admitted = await fences.admit(forward(3))
    assert admitted == Admission(False, "older than fence 4, already taken for this key", 3, 4)


async def test_the_same_fence_again_is_accepted_as_a_redelivery(open_fences: OpenFences) -> None:
    fences = open_fences()
    await fences.admit(forward(4))
    assert (await fences.admit(forward(4))).accepted


async def test_fences_are_kept_per_route_and_key(open_fences: OpenFences) -> None:
    fences = open_fences()
    await fences.admit(forward(9, key="g1"))
    assert (await fences.admit(forward(1, key="g2"))).accepted
    assert (await fences.admit(forward(1, key="g1", route="other"))).accepted


async def test_a_message_without_a_fence_is_accepted_and_says_why(open_fences: OpenFences) -> None:
    admitted = await open_fences().admit({"filter_route": "reports", "source": "nbac"})
    assert admitted.accepted and admitted.reason.startswith("no fence")


@pytest.mark.parametrize(
    ("attributes", "complaint"),
    [
        ({"filter_fence": "x1", "filter_key": "g1", "filter_route": "r"}, "not a fence the filter writes"),
        ({"filter_fence": "-1", "filter_key": "g1", "filter_route": "r"}, "not a fence the filter writes"),
        ({"filter_fence": "1", "filter_key": "g1"}, "without filter_route"),
        ({"filter_fence": "1", "filter_route": "r"}, "without filter_key or filter_key_sha256"),
    ],
)
async def test_a_malformed_fence_is_a_clear_error(
    open_fences: OpenFences, attributes: dict[str, str], complaint: str
) -> None:
    with pytest.raises(FenceError, match=complaint):
        await open_fences().admit(attributes)


async def test_a_short_key_equal_to_a_long_keys_digest_keeps_its_own_fence(open_fences: OpenFences) -> None:
    fences = open_fences()
    digest = hashlib.sha256(b"k" * 2000).hexdigest()
    await fences.admit({"filter_fence": "9", "filter_key_sha256": digest, "filter_route": "reports"})
    assert (await fences.admit(forward(1, key=digest))).accepted


async def test_an_entry_is_forgotten_after_forget_after(open_fences: OpenFences) -> None:
    clock = ManualClock()
    fences = open_fences(clock)
    await fences.admit(forward(9))
    clock.advance(3601)
    # the filter's own fence starts again at 1 only after its state expired: a reset key
    assert (await fences.admit(forward(1))).accepted


class _BeatenAfterRead:
    """Once armed, runs `first` (another consumer) after this consumer's next read, before its write."""

    def __init__(self, store: FenceStore, first: Callable[[], Any]):
        self.store, self.first, self.armed = store, first, False

    async def read(self, identity: str) -> Seen | None:
        seen = await self.store.read(identity)
        if self.armed:
            self.armed = False
            await self.first()
        return seen

    async def write(self, identity: str, seen: Seen | None, new: Seen) -> bool:
        return await self.store.write(identity, seen, new)

    async def close(self) -> None:
        await self.store.close()


async def test_a_consumer_beaten_to_the_write_by_a_newer_fence_drops_its_older_one(open_fences: OpenFences) -> None:
    other = open_fences()
    beaten: list[Admission] = []

    async def newer_first() -> None:
        beaten.append(await other.admit(forward(6)))

    slow = open_fences(wrap=lambda s: _BeatenAfterRead(s, newer_first))
    await slow.admit(forward(4))
    assert isinstance(slow.store, _BeatenAfterRead)
    slow.store.armed = True
    admitted = await slow.admit(forward(5))  # reads 4, then the other takes 6, then the write of 5 loses

    assert beaten[0].accepted
    assert (admitted.accepted, admitted.highest) == (False, 6)


class _Recorded:
    """Keeps each write that won, with the version it replaced: the order the store applied them in."""

    def __init__(self, store: FenceStore, won: list[tuple[Any, int]]):
        self.store, self.won = store, won

    async def read(self, identity: str) -> Seen | None:
        return await self.store.read(identity)

    async def write(self, identity: str, seen: Seen | None, new: Seen) -> bool:
        ok = await self.store.write(identity, seen, new)
        if ok:
            self.won.append((seen.version if seen else None, new.fence))
        return ok

    async def close(self) -> None:
        await self.store.close()


async def test_two_consumers_admitting_at_once_only_ever_raise_the_fence(open_fences: OpenFences) -> None:
    won: list[tuple[Any, int]] = []
    consumers = [open_fences(wrap=lambda s: _Recorded(s, won)) for _ in range(2)]
    order = list(range(1, 41))
    random.Random(7).shuffle(order)

    results = await asyncio.gather(*(consumers[i % 2].admit(forward(f)) for i, f in enumerate(order)))

    # every write replaced the one before it (compare-and-set), so sorting by the version replaced
    # gives the order the store applied them in: each took a higher fence than the last
    applied = [fence for _, fence in sorted(won, key=lambda w: (w[0] is not None, w[0] or 0))]
    assert applied == sorted(set(applied)) and applied[-1] == 40
    assert sorted(r.fence for r in results if r.accepted and r.highest != r.fence) == applied
