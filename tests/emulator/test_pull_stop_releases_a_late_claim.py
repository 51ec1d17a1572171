"""A claim the store answers only after the stop's cancel does not leave its key leased.

The stop cancels a decision whose claim is on its way to the store. A write that was sent lands or
not whatever its caller does (an RPC the caller gave up on is applied by Firestore all the same),
so the claim may take the lease after the cancel; left held, the key stays leased for
`lease.duration`, and the next worker answers its redelivered message `contended` until then.
The stop must wait for the claim's answer and release what it took.

The real worker runs in-process against the Pub/Sub emulator with a SQLite store. Its one claim is
held by the store until the stop has cancelled its decision (seen by the tasks' `cancel`), and
lands then: answered if its caller still waits, else after the worker has stopped. No clock orders
the steps.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, KeyState, Message
from pubsub_filter.core.ports import StateStore
from pubsub_filter.pull.worker import PullWorker
from pubsub_filter.runtime.wiring import make_store
from tests.support.cancels import cancels_seen
from tests.support.emulators import PubsubEmulator
from tests.support.fakes import MemoryPublisher, MemoryRecorder, PassingStore
from tests.support.pubsub_helpers import PubsubAdmin

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]

#: The whole stop (server.shutdown_budget): the cancels come at 60 % of it.
BUDGET = 2.0
KEY = "k0"


class LateClaim(PassingStore):
    """A `StateStore` whose first claim is answered only once `cancelled` is set. If its caller
    gives up meanwhile (its call is cancelled), the claim still lands, once `land_late` is called."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.holding = True
        self.claiming = asyncio.Event()  # the held claim was made
        self.cancelled = asyncio.Event()  # the stop cancelled the decision making it
        self.gave_up = False
        self._late: tuple[str, str, KeyState | None, KeyState] | None = None

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        if not self.holding:
            return await self.inner.claim(route, key, seen, new)
        self.holding = False
        self.claiming.set()
        try:
            await self.cancelled.wait()
        except asyncio.CancelledError:
            self.gave_up, self._late = True, (route, key, seen, new)
            raise
        return await self.inner.claim(route, key, seen, new)  # answered after the cancel

    async def land_late(self, store: StateStore) -> None:
        """The claim whose caller gave up reaches `store` (the same state, opened again) now."""
        if self._late is not None:
            await store.claim(*self._late)


def config(emu: PubsubEmulator, tmp_path: Path, subscription: str) -> dict[str, Any]:
    return {
        "project": emu.project,
        "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
        "publisher": {"backend": "pubsub"},
        "records": {"backend": "sqlite", "path": str(tmp_path / "decisions.db")},
        "server": {"shutdown_budget": f"{BUDGET}s"},
        "routes": [{"name": "r", "subscription": subscription, "destination": "dest", "key": ["payload.k"]}],
    }


async def test_a_claim_answered_after_the_stops_cancel_is_released_so_the_next_worker_decides_its_key_at_once(
    admin: PubsubAdmin, pubsub_emulator: PubsubEmulator, tmp_path: Path
) -> None:
    topic = admin.topic("late-claim")
    sub = admin.pull_subscription(topic, ack_deadline=60)
    cfg = parse(config(pubsub_emulator, tmp_path, sub))
    store = LateClaim(make_store(cfg))
    engine = Engine(cfg, store, MemoryPublisher(), MemoryRecorder())
    with pubsub_emulator.env():
        worker = PullWorker(engine, cfg.routes, pubsub_emulator.project)
    data = json.dumps({"k": KEY}).encode()
    [message_id] = admin.publish_many(topic, [(data, {})])
    with cancels_seen(store.cancelled):
        run = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(store.claiming.wait(), 30)
            worker.stop()
            assert await asyncio.wait_for(run, BUDGET + 10) == 0
        finally:
            if not run.done():
                worker.stop(hurry=True)
                await asyncio.wait_for(run, BUDGET + 10)
    assert store.cancelled.is_set(), "the stop did not cancel the decision whose claim was on its way"
    assert worker.acked == 0 and worker.nacked == 1
    inner = make_store(cfg)  # the same state, as the next worker opens it
    await store.land_late(inner)  # the claim its caller gave up on lands after the worker stopped

    # The next worker (another engine on the same state) decides the redelivered message at once.
    nxt = Engine(cfg, inner, MemoryPublisher(), MemoryRecorder())
    try:
        handled = await nxt.handle("r", Message(data=data, attributes={}, message_id=message_id))
        state = await inner.read("r", KEY)
    finally:
        await nxt.close()
    assert handled.record.decision is Decision.FORWARDED, (
        f"{handled.record.decision.value}: {handled.record.reason}; stored lease {state.lease if state else None}"
    )
