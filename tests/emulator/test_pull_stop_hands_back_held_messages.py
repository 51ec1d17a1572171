"""At a stop, what the client library held past its flow control is handed to the worker and nacked
while its stream is still open, not left to the library's own shutdown.

The library hands a message to the worker only while a flow-control slot is free; the rest of
what the emulator pushed on the stream it holds (and keeps leasing). Here every slot is taken by a
decision that blocks in the store until the stop cancels it. The stop releases the messages in
flight from the library's lease management, which frees their slots, so the held messages reach
the worker and are given back; the streams stay open until then: the library nacks what it still
holds in its own shutdown, after the cancel, and the emulator loses a nack sent after its stream
was cancelled (the message then waits out its ack deadline).

Whether another consumer then gets them promptly is not asserted here: the emulator redelivers a
message's first nack at once even under a retry policy, onto the stopping worker's still open
stream, and of what that worker hands back a second time, some come back only minutes later.

The real worker runs in-process against the Pub/Sub emulator. Its blocked decisions wait on a
claim answered only after the stop's cancel (seen by `cancels_seen`), and the test waits on an
event for them: no clock orders the steps.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import KeyState
from pubsub_filter.core.ports import StateStore, StoreUnavailable
from pubsub_filter.pull.worker import PullWorker
from pubsub_filter.runtime.wiring import make_store
from pubsub_filter.tools.subscriptions import MAX_BACKOFF_S, MIN_BACKOFF_S
from tests.support.cancels import cancels_seen
from tests.support.emulators import PubsubEmulator
from tests.support.fakes import MemoryPublisher, MemoryRecorder, PassingStore
from tests.support.pubsub_helpers import PubsubAdmin

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]

#: The subscription's ack deadline (as `provision` gives one: lease.ack_deadline).
ACK_DEADLINE = 60
#: The worker's flow control: its slots, all taken by decisions blocked at the stop.
SLOTS = 2
#: Messages published: SLOTS decided before the stop, SLOTS blocked, the rest held by the library.
MESSAGES = 12
#: The whole stop (server.shutdown_budget): the drain ends at half of it, the cancels at 3/4.
BUDGET = 4.0


class ClaimGate(PassingStore):
    """A `StateStore` letting the first `free` claims through; every later one waits until the
    stop cancels its decision (`stopped`, set by `cancels_seen`), and then fails as a store that
    never answered does. `blocked` is set once `SLOTS` wait."""

    def __init__(self, inner: StateStore, free: int) -> None:
        super().__init__(inner)
        self.free = free
        self.waiting: list[str] = []
        self.cancelled: list[str] = []
        self.blocked = asyncio.Event()
        self.stopped = asyncio.Event()
        self.returned_at_cancel: int | None = None  # what the worker had given back when the stop cancelled
        self.worker: PullWorker | None = None

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        if self.free > 0:
            self.free -= 1
            return await self.inner.claim(route, key, seen, new)
        self.waiting.append(key)
        if len(self.waiting) == SLOTS:
            self.blocked.set()
        try:
            await self.stopped.wait()  # not answered before the stop's cancel
            if self.returned_at_cancel is None and self.worker is not None:
                self.returned_at_cancel = self.worker.returned
        finally:
            self.cancelled.append(key)
        raise StoreUnavailable("no answer")  # the engine waits for a claim's answer through a cancel


def config(emu: PubsubEmulator, tmp_path: Path, subscription: str) -> dict[str, Any]:
    return {
        "project": emu.project,
        "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
        "publisher": {"backend": "pubsub"},
        "records": {"backend": "sqlite", "path": str(tmp_path / "decisions.db")},
        "server": {"shutdown_budget": f"{BUDGET}s"},
        "pull": {"max_messages": SLOTS},
        "routes": [{"name": "r", "subscription": subscription, "destination": "dest", "key": ["payload.k"]}],
    }


async def test_a_stop_hands_over_and_nacks_what_the_library_held_past_its_flow_control_before_the_streams_close(
    admin: PubsubAdmin, pubsub_emulator: PubsubEmulator, tmp_path: Path
) -> None:
    topic = admin.topic("held")
    sub = admin.pull_subscription(topic, ack_deadline=ACK_DEADLINE, backoff=(MIN_BACKOFF_S, MAX_BACKOFF_S))
    cfg = parse(config(pubsub_emulator, tmp_path, sub))
    gate = ClaimGate(make_store(cfg), free=SLOTS)
    publisher = MemoryPublisher()
    engine = Engine(cfg, gate, publisher, MemoryRecorder())
    with pubsub_emulator.env():
        worker = PullWorker(engine, cfg.routes, pubsub_emulator.project)
    gate.worker = worker
    admin.publish_many(topic, [(json.dumps({"k": f"k{i}"}).encode(), {}) for i in range(MESSAGES)])
    with cancels_seen(gate.stopped):
        run = asyncio.create_task(worker.run())
        try:
            # The first SLOTS decisions were forwarded and acked (their slots went to the next two),
            # the next SLOTS hold every slot, and the library holds what the emulator pushed past them.
            await asyncio.wait_for(gate.blocked.wait(), 30)
            assert len(publisher.published) == SLOTS and worker.acked == SLOTS
            worker.stop()
            assert await asyncio.wait_for(run, BUDGET + 10) == 0
        finally:
            if not run.done():
                worker.stop(hurry=True)
                await asyncio.wait_for(run, BUDGET + 10)
    assert sorted(gate.cancelled) == sorted(gate.waiting), "a blocked decision was not cancelled at the stop"
    assert worker.acked == SLOTS and worker.nacked == SLOTS
    forwarded = [json.loads(p.data)["k"] for p in publisher.published]
    assert len(set(forwarded)) == SLOTS

    # Every message the library held was handed over and given back unstarted while the stream was
    # open (the emulator redelivers some of them onto it at once, handed back again).
    held = MESSAGES - 2 * SLOTS
    assert worker.returned >= held, (
        f"{worker.returned} of the {held} messages held past the flow control were handed over"
    )
    # ...and while the decisions in flight still held every slot: the stop freed their slots at
    # once (the cancel comes at 60 % of the budget, seconds after the library can hand them over).
    assert gate.returned_at_cancel is not None and gate.returned_at_cancel >= held, (
        f"{gate.returned_at_cancel} of the {held} held messages were handed over before the stop's cancel"
    )
