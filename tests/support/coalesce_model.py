"""A reference model of coalescing, and a state machine that drives two real engines with it.

`CoalesceMachine` (hypothesis stateful) publishes messages for a few keys of a `coalesce` route
and delivers them to one of two engines sharing one SQLite store, on a manual clock whose steps
end bursts (`tests/support/timers.py`). It redelivers what Pub/Sub would: a message not yet
acked (a push that timed out, a lease that lapsed), and a forwarded one whose ack was lost. It
crashes an engine (what it holds is cancelled: never answered, so Pub/Sub still has it) and
stops one with SIGTERM (what it holds is decided at once), each replaced by a fresh process.

Each message carries new content, or the content of the key's previous message (unchanged, so
suppressed against what was forwarded); so the newest message of a key is always forwarded or
suppressed against that same content, and never lost to a suppression of other content (the
limit docs/decisions.md, "Ordering", describes does not apply).

The reference model is Pub/Sub's side: which messages are unacked, the newest published per key.
Checked at every answer:

- an acked message is forwarded, suppressed, duplicate, stale or superseded, nothing else;
- a superseded message names a message of its key, published no earlier, held by the same
  process and still unacked at that moment;
- a stale message is older than a message of its key that was forwarded;
- a suppressed message's content is content the destination received for its key;
- between two forwards of a key by one process, that process received a message of the key
  after the first forward (no key is forwarded twice for one burst by one process).

And at the end, after a drain (every unacked message redelivered, bursts ended by the clock,
until Pub/Sub has nothing unacked): the destination's last message for every key carries the
newest content published for it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.attributes import ATTR_SOURCE_ID
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import ACKED, Decision, DecisionRecord, Message
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.timers import Timers

KEYS = ("a", "b", "c")
QUIET, MAX_WAIT = 1.0, 3.0
STEPS = {"coalesce": 0}


@dataclass(frozen=True)
class Published:
    message_id: str
    key: str
    content: int
    publish_time: float


@dataclass
class Delivery:
    task: asyncio.Task[Any]
    msg: Published
    process: int  # which process (a new one after a crash or a stop)


class CoalesceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="coalesce-model-"))
        self.config = parse(
            {
                "routes": [
                    {
                        "name": "odds",
                        "destination": "odds-out",
                        "key": ["payload.line"],
                        "coalesce": {"quiet": f"{QUIET}s", "max_wait": f"{MAX_WAIT}s"},
                    }
                ]
            }
        )
        self.clock = ManualClock()
        self.timers = Timers(self.clock, self._held)
        self.publisher = MemoryPublisher()
        self.recorder = MemoryRecorder()
        self._processes = itertools.count()
        self.engines: list[Engine] = [self._engine(), self._engine()]
        self.process = [next(self._processes), next(self._processes)]
        self.deliveries: list[Delivery] = []
        self.published: dict[str, Published] = {}
        self.unacked: set[str] = set()
        self.acked: set[str] = set()
        self.forwarded: set[str] = set()  # forwarded at least once (its redelivery is a duplicate)
        self.last_content: dict[str, int] = {}
        self.newest: dict[str, Published] = {}
        self.downstream: dict[str, int] = {}  # what the destination last received per key
        self.sent: dict[str, set[int]] = {}  # every content the destination received per key
        self.received_since_forward: dict[tuple[int, str], bool] = {}
        self._ids = itertools.count(1)
        self._contents = itertools.count(1)
        self._seen_published = 0
        self._time = 1_000.0

    # --- plumbing -------------------------------------------------------------------

    def _engine(self) -> Engine:
        store = SqliteStore(self.dir / "state.db")
        return Engine(self.config, store, self.publisher, self.recorder, self.clock, sleep=self.timers)

    def _held(self) -> set[Any]:
        return set().union(*(e.holding.waiting() for e in self.engines))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def _running(self) -> list[asyncio.Task[Any]]:
        timers = [e.holding.timer for e in self.engines if e.holding.timer is not None]
        return [*(d.task for d in self.deliveries), *timers]

    async def _settle(self) -> None:
        await self.timers.settled(self._running())
        self._answer_done()

    def _deliver(self, msg: Published, which: int) -> None:
        data = json.dumps({"line": msg.key, "price": msg.content}).encode()
        message = Message(data=data, attributes={}, message_id=msg.message_id, publish_time=msg.publish_time)
        task = self.loop.create_task(self.engines[which].handle("odds", message))
        self.deliveries.append(Delivery(task, msg, self.process[which]))
        self.received_since_forward[(self.process[which], msg.key)] = True
        self.run(self._settle())

    def _answer_done(self) -> None:
        """Pub/Sub's side of every answer given since the last look, in the order given."""
        self._follow_destination()
        still: list[Delivery] = []
        for d in self.deliveries:
            if not d.task.done():
                still.append(d)
                continue
            if d.task.cancelled():
                continue  # a crash: never answered; Pub/Sub still has it
            rec: DecisionRecord = d.task.result().record
            self._check(rec, d)
        self.deliveries = still

    def _follow_destination(self) -> None:
        for p in self.publisher.published[self._seen_published :]:
            line, price = json.loads(p.data)["line"], json.loads(p.data)["price"]
            self.downstream[line] = price
            self.sent.setdefault(line, set()).add(price)
            self.forwarded.add(p.attributes[ATTR_SOURCE_ID])
        self._seen_published = len(self.publisher.published)

    def _check(self, rec: DecisionRecord, d: Delivery) -> None:
        msg = d.msg
        if rec.decision is Decision.FORWARDED:
            assert self.received_since_forward.get((d.process, msg.key)), f"{msg.key} forwarded twice for one burst"
            self.received_since_forward[(d.process, msg.key)] = False
        if not rec.acked:
            return  # nacked: Pub/Sub redelivers it
        assert rec.decision in ACKED, rec
        assert rec.decision not in (Decision.FAIL_OPEN, Decision.NOISE_ONLY), rec
        if rec.decision is Decision.SUPERSEDED:
            by = self.published[rec.details["superseded_by"]]
            assert by.key == msg.key and by.publish_time >= msg.publish_time, (rec, by)
            # The newer may be acked already: another process decided a copy of it (Pub/Sub
            # delivered it twice), and its content was decided there. What superseding needs is
            # a newer message this process holds, decided here in turn (or, should this process
            # die first, delivered again while it is unacked; the drain checks the newest content).
            assert any(
                o.msg.message_id == by.message_id and o.process == d.process and not o.task.done()
                for o in self.deliveries
            ), f"{msg.message_id} superseded by {by.message_id}, which this process does not hold"
        elif rec.decision is Decision.STALE:
            assert any(
                self.published[f].key == msg.key and self.published[f].publish_time > msg.publish_time
                for f in self.forwarded
            ), rec
        elif rec.decision is Decision.SUPPRESSED:
            # unchanged against a forward (another process may have forwarded newer content
            # since: this one is then older, and the newer is downstream)
            assert msg.content in self.sent.get(msg.key, set()), rec
        self.unacked.discard(msg.message_id)
        self.acked.add(msg.message_id)

    # --- rules ----------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), repeat=st.booleans(), which=st.integers(0, 1), gap=st.sampled_from([0.0, 0.01]))
    def publish(self, key: str, repeat: bool, which: int, gap: float) -> None:
        content = self.last_content[key] if repeat and key in self.last_content else next(self._contents)
        self._time += 0.001 + gap
        msg = Published(f"m{next(self._ids)}", key, content, self._time)
        self.published[msg.message_id] = msg
        self.unacked.add(msg.message_id)
        self.last_content[key] = content
        self.newest[key] = msg
        self._deliver(msg, which)
        STEPS["coalesce"] += 1

    @rule(data=st.data(), which=st.integers(0, 1))
    def redeliver(self, data: st.DataObject, which: int) -> None:
        """What Pub/Sub delivers again: an unacked message, or a forwarded one whose ack was lost."""
        again = sorted(self.unacked | (self.forwarded & self.acked))
        if again:
            self.deliver_again(data.draw(st.sampled_from(again)), which)

    def deliver_again(self, message_id: str, which: int) -> None:
        """Pub/Sub delivers `message_id` again to process `which` (a named regression's step)."""
        self._deliver(self.published[message_id], which)

    @rule(seconds=st.sampled_from([0.2, 0.5, 1.0, 2.5, 5.0]))
    def clock_step(self, seconds: float) -> None:
        self.run(self.timers.advance(seconds, self._running()))
        self._answer_done()

    @rule(which=st.integers(0, 1))
    def crash(self, which: int) -> None:
        """SIGKILL: what the process holds is never answered; a new process takes its place."""
        engine, process = self.engines[which], self.process[which]
        for d in self.deliveries:
            if d.process == process and not d.task.done():
                d.task.cancel()
        self.run(self._settle())
        self.deliveries = [d for d in self.deliveries if d.process != process]
        self.run(engine.close())
        self._restart(which)

    @rule(which=st.integers(0, 1))
    def sigterm(self, which: int) -> None:
        """SIGTERM: what is held is decided now, answered, and the process exits."""
        engine = self.engines[which]
        engine.holding.release_all()
        self.run(self._settle())
        self.run(engine.close())
        self.run(self._settle())
        assert not any(d.process == self.process[which] for d in self.deliveries), "left unanswered by a stop"
        self._restart(which)

    def _restart(self, which: int) -> None:
        self.engines[which] = self._engine()
        self.process[which] = next(self._processes)

    @invariant()
    def nothing_acked_is_unacked(self) -> None:
        assert not (self.acked & self.unacked)

    # --- the end --------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            for engine in self.engines:
                self.run(engine.close())
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _drain(self) -> None:
        """Pub/Sub redelivers every unacked message until none is left; then the destination
        holds the newest content of every key."""
        for _ in range(50):
            if not self.unacked and not self.deliveries:
                break
            pending = {d.msg.message_id for d in self.deliveries}
            for mid in sorted(self.unacked - pending, key=lambda m: self.published[m].publish_time):
                self._deliver(self.published[mid], 0)
            self.run(self.timers.advance(MAX_WAIT + 60.0, self._running()))  # past every burst and lease
            self._answer_done()
        assert not self.unacked, f"never acked: {sorted(self.unacked)}"
        self._follow_destination()
        for key, newest in self.newest.items():
            assert self.downstream.get(key) == newest.content, (key, self.downstream.get(key), newest)
