"""At a stop, what the client library held past its flow control comes back to another consumer
after its retry backoff, not at its ack deadline.

The library hands a message to the worker only while a flow-control slot is free; the rest of
what the emulator pushed on the stream it holds (and keeps leasing). Here every slot is taken by a
decision that blocks in the store until the stop cancels it, so the held messages can reach the
worker only once those decisions are nacked, and the streams must stay open until then: the
library nacks what it still holds in its own shutdown, after the cancel, and the emulator loses a
nack sent after its stream was cancelled (the message then waits out its ack deadline).

The subscription has the retry policy `pubsub-filter provision` gives one (the worker's docs ask
for it). The emulator redelivers a message's first nack at once all the same (onto the stopping
worker's open stream, which hands it back again) and honours the backoff from the second on: the
messages come back after the backoff, seconds after the stop, against minutes for a lost one.

The real worker runs in-process against the Pub/Sub emulator. Its blocked decisions wait on a
claim only a cancel ends, and the test waits on an event for them: no clock orders the steps.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from filter.core.config import parse
from filter.core.engine import Engine
from filter.core.model import KeyState
from filter.core.ports import StateStore
from filter.pull.worker import PullWorker
from filter.runtime.wiring import make_store
from filter.tools.subscriptions import MAX_BACKOFF_S, MIN_BACKOFF_S
from tests.support.emulators import PubsubEmulator
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.pubsub_helpers import PubsubAdmin

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

#: The subscription's and the leases' ack deadline: a message lost at the stop comes back only then.
ACK_DEADLINE = 300
#: Well inside it: a message handed back at the stop comes back after its backoff (measured: 12 to
#: 35 s after the stop; the emulator's backoff varies).
PROMPT = 60.0
#: The worker's flow control: its slots, all taken by decisions blocked at the stop.
SLOTS = 2
#: Messages published: SLOTS decided before the stop, SLOTS blocked, the rest held by the library.
MESSAGES = 12
#: The whole stop (server.shutdown_budget): the drain ends at half of it, the cancels at 3/4.
BUDGET = 4.0


class ClaimGate:
    """A `StateStore` letting the first `free` claims through; every later one waits until the
    decision is cancelled (as the stop's cancels do). `blocked` is set once `SLOTS` wait."""

    def __init__(self, inner: StateStore, free: int) -> None:
        self.inner = inner
        self.free = free
        self.waiting: list[str] = []
        self.cancelled: list[str] = []
        self.blocked = asyncio.Event()

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        if self.free > 0:
            self.free -= 1
            return await self.inner.claim(route, key, seen, new)
        self.waiting.append(key)
        if len(self.waiting) == SLOTS:
            self.blocked.set()
        try:
            await asyncio.get_running_loop().create_future()  # never answered: only a cancel ends it
        except asyncio.CancelledError:
            self.cancelled.append(key)
            raise
        raise AssertionError("unreachable")

    async def read(self, route: str, key: str) -> KeyState | None:
        return await self.inner.read(route, key)

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        return await self.inner.extend(route, key, held, expires_at)

    async def commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        return await self.inner.commit(route, key, held, new)

    async def release(self, route: str, key: str, held: KeyState) -> None:
        await self.inner.release(route, key, held)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()


def config(emu: PubsubEmulator, tmp_path: Path, subscription: str) -> dict[str, Any]:
    return {
        "project": emu.project,
        "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
        "publisher": {"backend": "pubsub"},
        "records": {"backend": "sqlite", "path": str(tmp_path / "decisions.db")},
        "lease": {"duration": f"{ACK_DEADLINE * 2}s", "ack_deadline": f"{ACK_DEADLINE}s", "heartbeat": "20s"},
        "server": {"shutdown_budget": f"{BUDGET}s"},
        "pull": {"max_messages": SLOTS},
        "routes": [{"name": "r", "subscription": subscription, "destination": "dest", "key": ["payload.k"]}],
    }


async def test_a_stop_hands_every_unfinished_message_back_before_its_ack_deadline_and_none_twice(
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
    admin.publish_many(topic, [(json.dumps({"k": f"k{i}"}).encode(), {}) for i in range(MESSAGES)])
    run = asyncio.create_task(worker.run())
    try:
        # The first SLOTS decisions were forwarded and acked (their slots went to the next two),
        # the next SLOTS hold every slot, and the library holds what the emulator pushed past them.
        await asyncio.wait_for(gate.blocked.wait(), 30)
        assert len(publisher.published) == SLOTS and worker.acked == SLOTS
        stopped = time.monotonic()
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

    # Another consumer gets every message the stopped worker did not forward, each once, well
    # before the ack deadline a message lost at the stop would wait out.
    unfinished = MESSAGES - SLOTS
    pulled = await asyncio.to_thread(admin.pull, sub, unfinished, PROMPT)
    late = time.monotonic() - stopped
    keys = [json.loads(p.data)["k"] for p in pulled]
    assert sorted(keys) == sorted({f"k{i}" for i in range(MESSAGES)} - set(forwarded)), (
        f"{len(set(keys))} of {unfinished} unfinished messages came back within {late:.1f}s of the stop "
        f"(the rest wait out their {ACK_DEADLINE}s ack deadline); {worker.returned} were handed back unstarted"
    )
    assert worker.returned >= unfinished - SLOTS  # the held ones (and their redeliveries at once), unstarted
