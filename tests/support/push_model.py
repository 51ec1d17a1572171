"""A state machine over the push app as served, with SIGTERM at random points.

`PushShutdownMachine` (a hypothesis `RuleBasedStateMachine`) serves the push app in-process
(`tests.support.served.ServedPush`: its lifespan, the embedded SQLite store and records in a
scratch directory, an injected clock) and sends it new messages and redeliveries over two
keys whose publishes land, fail or stall (`StallingPublisher`) and whose store calls may be
held before or after their write (`SlowStore`), lets them go on, moves the clock, and shuts
the server down as uvicorn does on SIGTERM: requests still running are given
the requests' share of `server.shutdown_budget`, then cancelled, then the lifespan closes the engine, then
`asyncio.run` cancels what is left. Each stalled publish resumes during the grace, once the
close has begun, when the publisher's close flushes it, or never. After each shutdown the
server is started again on the same files (a new instance).

After every shutdown it checks, on the closed files and the captured log:

- every request returned an answer (no exception: uvicorn's plain 500 with a traceback),
  and every call returns (a watchdog on each wait, never a wait standing in for one);
- every answer has its decision row and its decision log line, and every 2xx names the
  decision its row and line name;
- every acked forward reached the destination, and every acked suppression or duplicate
  names content that did;
- no content is published twice in a row for a key, except a publish that landed after its
  request was abandoned by the shutdown (the exception docs/decisions.md names under `shutdown_budget`);
- no key is left leased once every caller got its answer (the store file re-opened);
- nothing was closed under a decision still using it (no `lease_release_failed`,
  `commit_failed`, records dropped or deferred, `decisions_abandoned`).

At the end every message never acked is redelivered until it is, and every message's
content must then have reached the destination: nothing lost.

`STEPS` counts the steps run (`push-shutdown`) and the shutdowns; the suite prints it.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import shutil
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.envelope import make_envelope
from tests.support.clock import ManualClock
from tests.support.served import (
    WATCHDOG,
    Answer,
    Downstream,
    Mode,
    ServedPush,
    SlowStore,
    StallingPublisher,
    When,
    stored_states,
)

STEPS: Counter[str] = Counter()

ROUTE = "reports"
KEYS = ("a", "b")
CONTENTS = (0, 1, 2)
GRACE = 0.05
#: the whole stop: the engine's close gets what is left of it after the requests' share (core.engine.stopping)
BUDGET = 0.4
#: Log events that mean something was closed under a decision still using it, or a record was lost.
CLOSED_UNDER_WORK = frozenset(
    {
        "lease_release_failed",
        "commit_failed",
        "records_dropped",
        "records_write_deferred",
        "records_write_failed",
        "decisions_abandoned",
    }
)

T = TypeVar("T")

#: How long one step may take before it is called hung (a watchdog: nothing waits on it).
STEP_WATCHDOG = 3 * WATCHDOG


def _stacks(loop: asyncio.AbstractEventLoop) -> str:
    out = io.StringIO()
    for task in asyncio.all_tasks(loop):
        print(f"-- {task!r}", file=out)
        task.print_stack(limit=12, file=out)
    return out.getvalue()


def config(scratch: Path) -> Config:
    return parse(
        {
            "routes": [{"name": ROUTE, "destination": "phase3", "key": ["payload.k"]}],
            "server": {"shutdown_budget": BUDGET},
            # the decisions a shutdown cancels are given the store's budget to release their leases
            # (no store call here waits on a timeout: a budget a loaded machine cannot miss)
            "store_errors": {"timeout": "0.5s", "budget": "1s"},
            "store": {"backend": "sqlite", "path": str(scratch / "state.db")},
            "records": {"backend": "sqlite", "path": str(scratch / "records.db")},
        }
    )


@dataclass
class Sent:
    id: str
    key: str
    content: int
    answers: list[Answer] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return make_envelope(json.dumps({"k": self.key, "v": self.content}).encode(), self.id)

    @property
    def acked(self) -> bool:
        """Whether Pub/Sub is done with it: its latest delivery was acked. A message delivered
        again after an ack (an ack Pub/Sub lost) is outstanding again, and an answer other than
        2xx to that delivery has it redelivered once more."""
        return bool(self.answers) and self.answers[-1].acked


@dataclass(frozen=True)
class Plan:
    """What each publish stalled at the shutdown does: resume during the grace, once the close
    began, at the publisher's close (`on_close`: land, fail, or never end)."""

    in_grace: tuple[tuple[int, bool], ...]
    after_cancel: tuple[tuple[int, bool], ...]
    on_close: bool | None
    lands_anyway: bool = False  # one that never ends lands anyway once abandoned
    store_replies_in_grace: bool = True  # else once the close has begun (after the cancels)


modes = st.sampled_from(["ok", "ok", "fail", "stall", "stall"])
settlings = st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=2).map(tuple)
plans = st.builds(Plan, settlings, settlings, st.sampled_from([True, False, None]), st.booleans(), st.booleans())


class PushShutdownMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.scratch = Path(tempfile.mkdtemp(prefix="push-model-"))
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.config = config(self.scratch)
        self.downstream = Downstream()
        self._capture = structlog.testing.capture_logs()
        self.logs = self._capture.__enter__()
        self.sent: list[Sent] = []
        self.ids = itertools.count(1)
        self.broken = False
        self.served = self._serve()
        self.in_flight: list[tuple[Sent, asyncio.Task[Answer]]] = []

    # --- running the loop --------------------------------------------------------------

    def _run(self, coro: Awaitable[T]) -> T:
        """Run one step on the loop; a step that has not ended after `STEP_WATCHDOG` seconds is a
        call that never returns: the loop is stopped and the step fails with what each task awaits."""
        task = asyncio.ensure_future(coro, loop=self.loop)
        watchdog = self.loop.call_later(STEP_WATCHDOG, self.loop.stop)
        try:
            return self.loop.run_until_complete(task)
        except RuntimeError as exc:
            self.broken = True
            if task.done():
                raise
            raise AssertionError(f"a step never returned ({exc}); tasks:\n{_stacks(self.loop)}") from None
        except BaseException:
            self.broken = True  # the failure is reported as it is: teardown only cleans up
            raise
        finally:
            watchdog.cancel()

    def _serve(self) -> ServedPush:
        publisher = StallingPublisher(self.downstream)
        served = ServedPush(self.config, self.scratch, publisher, self.clock, wrap_store=self._slow)
        return self._run(served.start())

    def _slow(self, inner: Any) -> SlowStore:
        self.store = SlowStore(inner)
        return self.store

    @property
    def held(self) -> int:
        return sum(1 for f in self.store.held if not f.done())

    async def _quiet(self) -> None:
        """Let the loop run until every request answered or waits on a stalled publish."""
        until = time.monotonic() + WATCHDOG
        while True:
            await asyncio.sleep(0)
            running = sum(1 for _, t in self.in_flight if not t.done())
            if running == len(self.served.publisher.waiting) + self.held:
                break
            assert time.monotonic() < until, "a request neither answers nor waits on its publish or store"
        self._collect()

    def _collect(self) -> None:
        still = []
        for sent, task in self.in_flight:
            if task.done():
                sent.answers.append(task.result())
            else:
                still.append((sent, task))
        self.in_flight = still

    def _post(self, sent: Sent) -> None:
        self.in_flight.append((sent, self.served.post(ROUTE, sent.body)))

    async def _deliver(self, sent: Sent) -> None:
        self._post(sent)
        await self._quiet()

    # --- rules ---------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), content=st.sampled_from(CONTENTS), mode=modes)
    def push(self, key: str, content: int, mode: Mode) -> None:
        STEPS["push-shutdown"] += 1
        sent = Sent(f"m{next(self.ids)}", key, content)
        self.sent.append(sent)
        self.served.publisher.mode = mode
        self._run(self._deliver(sent))

    @precondition(lambda self: self.sent)
    @rule(index=st.integers(0, 50), mode=modes)
    def redeliver(self, index: int, mode: Mode) -> None:
        STEPS["push-shutdown"] += 1
        self.served.publisher.mode = mode
        self._run(self._deliver(self.sent[index % len(self.sent)]))

    @precondition(lambda self: self.served.publisher.waiting)
    @rule(index=st.integers(0, 3), ok=st.booleans())
    def settle(self, index: int, ok: bool) -> None:
        STEPS["push-shutdown"] += 1
        self.served.publisher.settle(index, ok)
        self._run(self._quiet())

    @rule(op=st.sampled_from(["read", "claim", "commit", "release"]), when=st.sampled_from(["before", "after"]))
    def slow_store(self, op: str, when: When) -> None:
        """The next `op` is held before its write, or after it (its reply is slow)."""
        STEPS["push-shutdown"] += 1
        self.store.armed[op] = when

    @precondition(lambda self: self.held)
    @rule(index=st.integers(0, 3))
    def store_replies(self, index: int) -> None:
        STEPS["push-shutdown"] += 1
        self.store.reply(index)
        self._run(self._quiet())

    @precondition(lambda self: not self.served.publisher.waiting and not self.held)
    @rule(seconds=st.sampled_from([1.0, 600.0, 7200.0]))
    def advance_clock(self, seconds: float) -> None:
        """Only while no publish is stalled: a lease lapsing under a live publish is the README's
        other exception (the fence protects the state, not the destination), not this model's."""
        STEPS["push-shutdown"] += 1
        self.clock.advance(seconds)

    @rule(
        plan=plans,
        arriving=st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(CONTENTS)), max_size=2),
        mode=modes,
    )
    def sigterm(self, plan: Plan, arriving: list[tuple[str, int]], mode: Mode) -> None:
        """SIGTERM, with `arriving` requests accepted just before it (they run during the grace)."""
        STEPS["push-shutdown"] += 1
        STEPS["shutdowns"] += 1
        fresh = [Sent(f"m{next(self.ids)}", key, content) for key, content in arriving]
        self.sent += fresh
        self.served.publisher.mode = mode
        self._run(self._shutdown(plan, fresh))
        self.served = self._serve()

    async def _shutdown(self, plan: Plan, arriving: tuple[Sent, ...] | list[Sent] = ()) -> None:
        for sent in arriving:
            self._post(sent)
        publisher = self.served.publisher
        publisher.on_close, publisher.lands_anyway = plan.on_close, plan.lands_anyway
        for stalled in publisher.waiting:
            stalled.on_close = plan.on_close
            stalled.lands_anyway = plan.lands_anyway
        loop = asyncio.get_running_loop()

        store = self.store

        async def resume_in_grace() -> None:
            await asyncio.sleep(0)
            for index, ok in plan.in_grace:
                publisher.settle(index, ok)
            if plan.store_replies_in_grace:
                store.reply()

        def resume_after_cancel() -> None:
            for index, ok in plan.after_cancel:
                loop.call_soon(publisher.settle, index, ok)
            # the store answers every call in the end (its own timeouts bound each one)
            store.armed.clear()
            loop.call_soon(store.reply)

        await self.served.shutdown(GRACE, during=resume_in_grace, after_cancel=resume_after_cancel)
        self._collect()
        assert not self.in_flight, "a request outlived the shutdown"
        await self._check_closed()

    # --- what must hold once closed -------------------------------------------------------

    async def _check_closed(self) -> None:
        answers = [(s, a) for s in self.sent for a in s.answers]
        raised = [a.raised for _, a in answers if a.raised is not None]
        assert not raised, f"the app raised (uvicorn: a plain 500 with a traceback): {raised!r}"
        rows = self._rows()
        lines = [e for e in self.logs if e["event"] == "decision" and e.get("route") == ROUTE]
        every_answer = Counter(s.id for s, _ in answers)
        assert every_answer <= Counter(r["message_id"] for r in rows), "an answer without its decision row"
        assert every_answer <= Counter(e["message_id"] for e in lines), "an answer without its decision line"
        acked = Counter((s.id, a.body["decision"]) for s, a in answers if a.acked)
        assert acked <= Counter((r["message_id"], r["decision"]) for r in rows), "a 2xx its row does not name"
        assert acked <= Counter((e["message_id"], e["decision"]) for e in lines), "a 2xx its line does not name"
        self._check_downstream(answers)
        states = await stored_states(self.served.store_path, ROUTE, list(KEYS))
        leased = {k: s.lease for k, s in states.items() if s is not None and s.lease is not None}
        assert not leased, f"keys left leased once every caller got its answer: {leased}"
        closed_under = [e for e in self.logs if e["event"] in CLOSED_UNDER_WORK]
        assert not closed_under, f"closed under work still using it: {closed_under}"

    def _check_downstream(self, answers: list[tuple[Sent, Answer]]) -> None:
        by_id = {s.id: s for s in self.sent}
        landed = self.downstream.landed
        landed_ids = {p.source_id for p in landed}
        reached = {(by_id[p.source_id].key, by_id[p.source_id].content) for p in landed}
        for s, a in answers:
            if not a.acked:
                continue
            if a.body["decision"] == "forwarded":
                assert s.id in landed_ids, f"{s.id} acked as forwarded, never published"
            else:
                # `duplicate` acks the same content in flight under another message id: until that
                # one is acked, Pub/Sub redelivers it, so its content is still on its way
                on_its_way = any(o.key == s.key and o.content == s.content and not o.acked for o in self.sent)
                assert (s.key, s.content) in reached or on_its_way, (
                    f"{s.id} acked as {a.body['decision']}, its content never sent nor on its way"
                )
        for key in KEYS:
            mine = [p for p in landed if by_id[p.source_id].key == key]
            for before, after in itertools.pairwise(mine):
                same = by_id[before.source_id].content == by_id[after.source_id].content
                assert not (same and before.confirmed), (
                    f"key {key}: content {by_id[after.source_id].content} published twice in a row "
                    f"({before.source_id}, then {after.source_id})"
                )

    def _rows(self) -> list[dict[str, Any]]:
        db = sqlite3.connect(str(self.served.records_path))
        try:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute("SELECT message_id, decision FROM decisions")]
        finally:
            db.close()

    # --- the end: nothing lost --------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if not self.broken:
                self._finish()
        finally:
            self._capture.__exit__(None, None, None)
            self.loop.close()
            shutil.rmtree(self.scratch, ignore_errors=True)

    def _finish(self) -> None:
        """Shut down, redeliver what was never acked, shut down again: nothing may be lost."""
        self._run(self._shutdown(Plan((), (), None)))
        self.served = self._serve()
        self._drain()
        self._run(self._shutdown(Plan((), (), None)))
        for s in self.sent:
            assert s.acked, f"{s.id} never acked after redeliveries with every fault off"
            assert any(p.source_id == s.id or self._same(p.source_id, s) for p in self.downstream.landed), (
                f"{s.id} (key {s.key}, content {s.content}) acked but its content never reached the destination"
            )

    def _same(self, source_id: str, s: Sent) -> bool:
        other = next(x for x in self.sent if x.id == source_id)
        return (other.key, other.content) == (s.key, s.content)

    def _drain(self) -> None:
        """Redeliver every message never acked, faults off, until it is (a few rounds at most)."""
        self.served.publisher.mode = "ok"
        for _ in range(3):
            for s in self.sent:
                if not s.acked:
                    self._run(self._deliver(s))
