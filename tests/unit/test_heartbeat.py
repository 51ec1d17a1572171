"""The heartbeat keeps a lease while a publish runs: every interval it pushes the expiry out,
stops when the lease was taken over, and keeps beating through store errors. On an injected
clock and sleep (tests/support/clock.py): each beat is stepped by the test, nothing waits
on real time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import LeaseConfig
from pubsub_filter.core.engine.heartbeat import Heartbeat
from pubsub_filter.core.model import KeyState, Lease
from pubsub_filter.core.ports import StoreUnavailable
from tests.support.clock import ManualClock, ManualSleep

ROUTE, KEY = "reports", "2025-01-10"
LEASE = LeaseConfig(duration=3, ack_deadline=2, heartbeat=0.05)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "state.db")
    yield s
    await s.close()


async def claim(store: SqliteStore, clock: ManualClock, seen: KeyState | None = None, fence: int = 1) -> KeyState:
    expires = clock.now() + LEASE.duration
    lease = Lease(holder=f"instance-{fence}", fence=fence, expires_at=expires, fingerprint="sha256:x", message_id="m1")
    held = await store.claim(ROUTE, KEY, seen, KeyState(fence=fence, lease=lease, expires_at=expires))
    assert held is not None
    return held


class Extends:
    """The store's `extend`, failing on demand; `answered` is set as each call returns or raises
    (the beat acts on the answer in the same step, before the test's waiter runs)."""

    def __init__(self, inner: SqliteStore, fail: bool = False):
        self.inner = inner
        self.fail = fail
        self.answered = asyncio.Event()

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        try:
            if self.fail:
                raise StoreUnavailable("connection refused")
            return await self.inner.extend(route, key, held, expires_at)
        finally:
            self.answered.set()


async def test_the_heartbeat_pushes_the_lease_out_once_per_interval(store: SqliteStore) -> None:
    clock = ManualClock()
    sleep = ManualSleep(clock)
    held = await claim(store, clock)
    async with Heartbeat(store, ROUTE, KEY, held, LEASE, clock, sleep) as beat:
        for n in (1, 2, 3):
            assert await sleep.asleep() == LEASE.heartbeat
            await sleep.wake()
            await sleep.asleep()  # sleeping again: the extension is written
            state = await store.read(ROUTE, KEY)
            assert state is not None and state.lease is not None
            assert (beat.extended, state.lease.expires_at) == (n, clock.now() + LEASE.duration)
            assert beat.held == state  # what the commit will present
    assert not beat.lost and beat.failures == 0


async def test_the_heartbeat_stops_when_the_lease_was_taken_over(store: SqliteStore) -> None:
    clock = ManualClock()
    sleep = ManualSleep(clock)
    held = await claim(store, clock)
    await claim(store, clock, seen=held, fence=2)  # another instance's lease, a newer fence
    extends = Extends(store)
    async with Heartbeat(extends, ROUTE, KEY, held, LEASE, clock, sleep) as beat:  # type: ignore[arg-type]
        await sleep.wake()
        await extends.answered.wait()
        assert (beat.lost, beat.extended) == (True, 0)
    assert len(sleep.delays) == 1, "one beat, then no more"


async def test_a_store_error_does_not_stop_the_heartbeat(store: SqliteStore) -> None:
    clock = ManualClock()
    sleep = ManualSleep(clock)
    held = await claim(store, clock)
    extends = Extends(store, fail=True)
    async with Heartbeat(extends, ROUTE, KEY, held, LEASE, clock, sleep) as beat:  # type: ignore[arg-type]
        await sleep.wake()
        await sleep.asleep()  # beating on after the error
        assert (beat.failures, beat.extended) == (1, 0)
        extends.fail = False
        await sleep.wake()
        await sleep.asleep()
        assert (beat.failures, beat.extended, beat.lost) == (1, 1, False)


class SlowToStop:
    """A sleep that, once cancelled, takes until `stop` is set to end (a beat stopping mid-call)."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.stop = asyncio.Event()

    async def __call__(self, delay: float) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stopping.set()
            await self.stop.wait()
            raise


async def test_a_cancel_landing_while_the_beat_stops_is_taken_back_not_left_counted(store: SqliteStore) -> None:
    """The guarded publish has returned: its commit comes first, so the cancel is taken back, and
    uncancelled, or a later `asyncio.timeout` in the task would mistake its own expiry."""
    clock = ManualClock()
    held = await claim(store, clock)
    slow = SlowToStop()

    async def guarded() -> int:
        async with Heartbeat(store, ROUTE, KEY, held, LEASE, clock, slow):
            await asyncio.sleep(0)  # the beat is sleeping
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    task = asyncio.create_task(guarded())
    await slow.stopping.wait()  # the exit waits for the beat to end
    task.cancel()
    slow.stop.set()
    assert await task == 0


class Noted:
    """A decision's `Traced` that keeps the heartbeat's notes."""

    def __init__(self) -> None:
        self.notes: list[tuple[str, dict[str, str]]] = []

    def sending(self, destination: str, data: bytes, ordering_key: str | None) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def heartbeat(self, event: str, **attributes: str) -> None:
        self.notes.append((event, attributes))


async def test_each_beat_is_noted_on_the_trace_it_is_handed(store: SqliteStore) -> None:
    """The heartbeat runs in a task of its own: the decision's trace reaches it as a parameter."""
    clock = ManualClock()
    sleep = ManualSleep(clock)
    held = await claim(store, clock)
    extends, traced = Extends(store, fail=True), Noted()
    async with Heartbeat(extends, ROUTE, KEY, held, LEASE, clock, sleep, traced):  # type: ignore[arg-type]
        await sleep.wake()
        await sleep.asleep()
        extends.fail = False
        await sleep.wake()
        await sleep.asleep()
        await claim(store, clock, seen=await store.read(ROUTE, KEY), fence=2)  # taken over
        extends.answered.clear()
        await sleep.wake()
        await extends.answered.wait()
    assert traced.notes == [
        ("heartbeat failed", {"error": "StoreUnavailable: connection refused"}),
        ("lease extended", {}),
        ("lease lost", {}),
    ]
