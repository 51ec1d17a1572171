"""A state machine over the in-process API (`SyncFilter` and `Filter`) on the embedded SQLite files.

`InProcessMachine` (a hypothesis `RuleBasedStateMachine`) sends random messages to a
`SyncFilter` and to an async `Filter` sharing one state file and one records file, on an
injected clock, keeping results (`cache_result`), with bodies that return (a result too
large to keep too), raise each kind of exception a user's body can
raise (`Exception`s, `StopIteration`, `StopAsyncIteration`, `GeneratorExit`,
`KeyboardInterrupt`, `SystemExit`, `CancelledError`), are `async def` on the sync API or
plain on the async one, hang until the caller cancels them (`task.cancel()`,
`asyncio.timeout`, `wait_for`); it closes either filter and opens it again, and calls
`process()` from a second thread while `close()` waits for a body on a first.

The reference is the README's table for this one route (no window, no exclusions): per key
the content last committed and the message ids recently forwarded. After every step:

- every call returned or raised (each is watched: a hang fails the run);
- no key is left leased;
- the records file holds exactly one record per decided call, and a body that did not
  return left a `failed` record saying why (cause work) and nothing committed;
- a body that returned ran once and is committed, with a result too large to keep too
  (`cache_result` is on: the redelivery returns no result, `cached` False); a body never
  runs for anything else, so it runs at most once for a message while its forward is recent;
- content is never lost: the next copy of content whose body failed runs the body.

`STEPS` counts the steps run; the suite prints it at the end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import shutil
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.transitions import RECENT
from pubsub_filter.core.errors import FilterTypeError
from pubsub_filter.core.model import Decision
from pubsub_filter.inprocess import Filter, FilterClosed, Outcome, SyncFilter
from pubsub_filter.inprocess.handlers import on_payload, payload_message
from tests.support.clock import ManualClock
from tests.support.watchdog import WATCHDOG, Ended, leased, start, within

STEPS: Counter[str] = Counter()

ROUTE = "reports"
KEYS = ("g1", "g2")
CONTENTS = (0, 1, 2)


class Boom(Exception):
    """An ordinary failure of the caller's work."""


#: What a body raises instead of returning, by name: every kind a user's body can raise.
RAISED: dict[str, type[BaseException]] = {
    "Boom": Boom,
    "StopIteration": StopIteration,
    "StopAsyncIteration": StopAsyncIteration,
    "GeneratorExit": GeneratorExit,
    "KeyboardInterrupt": KeyboardInterrupt,
    "SystemExit": SystemExit,
}
#: A result larger than `cache_result` keeps (64 KiB as JSON): the body returned, its forward is committed.
TOO_LARGE = "x" * (65 * 1024)
#: What a sync body does: return (weighted; a result too large to keep too), raise, be an async def,
#: return an awaitable.
SYNC_DOES = ("return", "return", "return", "return_too_large", *RAISED, "async_def", "returns_awaitable")
#: What an async body does: return (a result too large to keep too), raise (CancelledError too), be a
#: plain function, hang until cancelled.
ASYNC_DOES = (
    "return",
    "return",
    "return",
    "return_too_large",
    *RAISED,
    "CancelledError",
    "plain",
    "cancel",
    "timeout",
    "wait_for",
)
#: What a body that returns returns, by what it does (None: `("done", message id)`).
RETURNS: dict[str, Any] = {"return": None, "return_too_large": TOO_LARGE}
#: Every call keeps its body's result (`cache_result`): a redelivery returns it, or none when it was too large.
CACHE = True
#: How the caller cancels a stuck body, and what the caller then gets.
CANCELS: dict[str, type[BaseException]] = {
    "cancel": asyncio.CancelledError,
    "timeout": TimeoutError,
    "wait_for": TimeoutError,
}


def config(scratch: Path) -> Config:
    return parse(
        {
            "store": {"backend": "sqlite", "path": str(scratch / "state.db")},
            "records": {"backend": "sqlite", "path": str(scratch / "records.db")},
            "routes": [{"name": ROUTE, "destination": "downstream", "key": ["payload.game"], "cache_result": CACHE}],
        }
    )


def payload(key: str, content: int) -> dict[str, Any]:
    return {"game": key, "v": content}


# --- the reference -----------------------------------------------------------------------------


@dataclass
class MKey:
    content: int | None = None
    recent: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Sent:
    id: str
    key: str
    content: int


class Reference:
    """The decision table for one route with nothing in flight between calls: duplicate, unchanged, forward."""

    def __init__(self) -> None:
        self.keys: dict[str, MKey] = {}

    def judge(self, m: Sent, in_flight: Sent | None = None) -> Decision:
        k = self.keys.get(m.key, MKey())
        if m.id in k.recent:
            return Decision.DUPLICATE
        if in_flight is not None and in_flight.key == m.key:
            return Decision.DUPLICATE if in_flight.content == m.content else Decision.CONTENDED
        if k.content == m.content:
            return Decision.SUPPRESSED
        return Decision.FORWARDED

    def commit(self, m: Sent) -> None:
        k = self.keys.setdefault(m.key, MKey())
        k.content = m.content
        k.recent = [*k.recent, m.id][-RECENT:]


# --- driving the async API on a loop thread of the test's -------------------------------------


async def _attempt(coro: Awaitable[Any]) -> Ended[Any]:
    """Whatever the call raised as a value: a KeyboardInterrupt raised into the loop would end it."""
    try:
        return Ended(value=await coro)
    except BaseException as exc:  # the machine looks at it
        return Ended(error=exc)


class LoopThread:
    """An event loop on a thread of its own, for the async API; every call on it is watched."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="model-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Ended[Any]:
        future = asyncio.run_coroutine_threadsafe(_attempt(coro), self.loop)
        try:
            return future.result(WATCHDOG)
        except concurrent.futures.TimeoutError:
            pytest.fail(f"an async call did not return within {WATCHDOG:g}s: it hangs")

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WATCHDOG)
        self.loop.close()


async def _cancelled(call: Awaitable[Any], how: str, entered: asyncio.Event) -> Any:
    """`call` whose body, once it runs, the caller cancels: a task.cancel(), asyncio.timeout or wait_for."""
    if how == "wait_for":
        return await asyncio.wait_for(call, 0.01)  # no store call suspends: the body is running by then
    task = asyncio.ensure_future(call)
    waiting = asyncio.ensure_future(entered.wait())
    await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if how == "cancel":
        task.cancel()
        return await task
    async with asyncio.timeout(None) as deadline:
        if not task.done():
            deadline.reschedule(asyncio.get_running_loop().time())
        return await task


# --- the machine ---------------------------------------------------------------------------------


class InProcessMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="inprocess-model-"))
        self.config = config(self.dir)
        self.clock = ManualClock(time.time())  # the purge runs on wall time: start the model's clock there
        self.ref = Reference()
        self.sent: list[Sent] = []
        self.records = 0  # records expected in the records file
        self.failed_reasons: list[tuple[str, str]] = []  # (message id, what the failed record must say)
        self.too_large: set[str] = set()  # message ids committed with a result too large to keep
        self.ran_again: list[str] = []  # message ids whose body ran again after it was committed
        self._ids = itertools.count(1)
        self.sync: SyncFilter | None = SyncFilter(self.config, clock=self.clock)
        self.sync_closed = False
        self.loop = LoopThread()
        self.async_filter: Filter | None = self._open_async()
        self.async_closed = False

    def _open_async(self) -> Filter:
        async def opened() -> Filter:
            return Filter.open(self.config, self.clock)

        return self.loop.run(opened()).result()  # type: ignore[no-any-return]

    def teardown(self) -> None:
        try:
            if self.sync is not None and not self.sync_closed:
                within(self.sync.close, name="close").result()
            if self.async_filter is not None and not self.async_closed:
                self.loop.run(self.async_filter.close()).result()
        finally:
            self.loop.stop()
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- helpers ---------------------------------------------------------------------------

    def _new(self, key: str, content: int) -> Sent:
        sent = Sent(f"m{next(self._ids)}", key, content)
        self.sent.append(sent)
        return sent

    def _records(self) -> list[tuple[str, str, str | None]]:
        db = sqlite3.connect(self.config.records.path)  # type: ignore[union-attr]
        try:
            return db.execute("SELECT message_id, decision, reason FROM decisions ORDER BY rowid").fetchall()
        except sqlite3.OperationalError:
            return []
        finally:
            db.close()

    def _check(
        self,
        sent: Sent,
        ended: Ended[Outcome[Any]],
        runs: list[Any],
        expected: Decision,
        error: str | None,
        returned: Any = None,
    ) -> None:
        """The call ended as the reference says: `error` names what a forward's body raised (None: it
        returned `returned`, by default `("done", sent.id)`)."""
        if runs and sent.id in self.ref.keys.get(sent.key, MKey()).recent:
            self.ran_again.append(sent.id)
        if expected is not Decision.FORWARDED:
            outcome = ended.result()
            assert (outcome.decision, outcome.ran, runs) == (expected, False, []), f"{sent}: {outcome.record}"
            if sent.id in self.too_large and expected is Decision.DUPLICATE:
                assert (outcome.result, outcome.cached) == (None, False), f"{sent}: {outcome}"
            self.records += 1
            return
        assert len(runs) == 1, f"{sent}: the body ran {len(runs)} times for a forward"
        self.records += 1
        if error is None:
            outcome = ended.result()
            assert (outcome.decision, outcome.ran, outcome.committed) == (Decision.FORWARDED, True, True), (
                f"{sent}: {outcome.record}"
            )
            assert outcome.result == (returned if returned is not None else ("done", sent.id))
            if returned is TOO_LARGE:
                self.too_large.add(sent.id)
            self.ref.commit(sent)
            return
        assert ended.error is not None, f"{sent}: the body raised {error}, the call returned {ended.value}"
        self.failed_reasons.append((sent.id, error))

    # --- the sync API ------------------------------------------------------------------------

    def _sync_body(self, sent: Sent, does: str, runs: list[Any]) -> Callable[[Any], Any]:
        if does == "async_def":

            async def coroutine_body(arg: Any) -> None:
                runs.append(arg)

            return coroutine_body

        def body(arg: Any) -> Any:
            runs.append(arg)
            if does == "return":
                return ("done", sent.id)
            if does == "return_too_large":
                return TOO_LARGE
            if does == "returns_awaitable":

                async def never() -> None:
                    raise AssertionError("a coroutine returned by a sync body must never run")

                return never()
            raise RAISED[does]("from the body")

        return body

    def _sync_call(self, sent: Sent, does: str, decorated: bool) -> tuple[Ended[Outcome[Any]], list[Any]]:
        sync, runs = self.sync, []
        assert sync is not None
        body = self._sync_body(sent, does, runs)
        if decorated:
            try:
                handler = on_payload(sync, ROUTE, cache_result=CACHE)(body)
            except TypeError as exc:
                return Ended(error=exc), runs
            call: Callable[[], Outcome[Any]] = lambda: handler(payload(sent.key, sent.content), message_id=sent.id)  # noqa: E731
        else:
            msg = payload_message(payload(sent.key, sent.content), message_id=sent.id)
            call = lambda: sync.process(ROUTE, msg, body, cache_result=CACHE)  # noqa: E731
        return within(call, name="SyncFilter.process"), runs

    def _sync(self, sent: Sent, does: str, decorated: bool) -> None:
        STEPS["in-process"] += 1
        expected = self.ref.judge(sent)
        ended, runs = self._sync_call(sent, does, decorated)
        if does == "async_def":  # refused before any claim: no record, the body never ran
            assert isinstance(ended.error, TypeError) and "async def" in str(ended.error), ended
            assert runs == []
            return
        if self.sync_closed:
            assert isinstance(ended.error, FilterClosed), f"{sent}: after close(): {ended}"
            assert runs == []
            return
        error = None if does in RETURNS else ("TypeError" if does == "returns_awaitable" else does)
        self._check(sent, ended, runs, expected, error if expected is Decision.FORWARDED else None, RETURNS.get(does))
        if expected is Decision.FORWARDED and error is not None:
            raised = ended.error
            if does == "returns_awaitable":
                assert isinstance(raised, TypeError) and "awaitable" in str(raised), raised
            else:
                assert type(raised) is RAISED[does], f"{sent}: the caller got {raised!r}, the body raised {does}"

    @rule(key=st.sampled_from(KEYS), content=st.sampled_from(CONTENTS), does=st.sampled_from(SYNC_DOES))
    def sync_message(self, key: str, content: int, does: str) -> None:
        self._sync(self._new(key, content), does, decorated=False)

    @rule(key=st.sampled_from(KEYS), content=st.sampled_from(CONTENTS), does=st.sampled_from(SYNC_DOES))
    def sync_handler(self, key: str, content: int, does: str) -> None:
        self._sync(self._new(key, content), does, decorated=True)

    @precondition(lambda self: bool(self.sent))
    @rule(data=st.data(), does=st.sampled_from(SYNC_DOES), decorated=st.booleans())
    def sync_redelivery(self, data: st.DataObject, does: str, decorated: bool) -> None:
        self._sync(data.draw(st.sampled_from(self.sent), label="redelivered"), does, decorated)

    # --- the async API ------------------------------------------------------------------------

    def _async_body(self, sent: Sent, does: str, runs: list[Any], entered: asyncio.Event) -> Callable[[Any], Any]:
        if does == "plain":

            def plain_body(arg: Any) -> Any:
                runs.append(arg)
                return ("done", sent.id)

            return plain_body

        async def body(arg: Any) -> Any:
            runs.append(arg)
            if does == "return":
                return ("done", sent.id)
            if does == "return_too_large":
                return TOO_LARGE
            if does in CANCELS:
                entered.set()
                await asyncio.Event().wait()  # stuck: only the caller's cancel ends it
            if does == "CancelledError":
                raise asyncio.CancelledError("from the body")
            raise RAISED[does]("from the body")

        return body

    def _async(self, sent: Sent, does: str, decorated: bool) -> None:
        STEPS["in-process"] += 1
        f, runs = self.async_filter, []
        assert f is not None
        expected = self.ref.judge(sent)

        async def call() -> Outcome[Any]:
            entered = asyncio.Event()
            body = self._async_body(sent, does, runs, entered)
            if decorated:
                handler = on_payload(f, ROUTE, cache_result=CACHE)(body)
                work = handler(payload(sent.key, sent.content), message_id=sent.id)
            else:
                msg = payload_message(payload(sent.key, sent.content), message_id=sent.id)
                work = f.process(ROUTE, msg, body, cache_result=CACHE)
            return await (_cancelled(work, does, entered) if does in CANCELS else work)  # type: ignore[no-any-return]

        ended = self.loop.run(call())
        if decorated and does == "plain":  # refused when decorated: no call
            assert isinstance(ended.error, TypeError) and "async def" in str(ended.error), ended
            assert runs == []
            return
        if self.async_closed:
            assert isinstance(ended.error, FilterClosed), f"{sent}: after close(): {ended}"
            assert runs == []
            return
        error = {
            "return": None,
            "return_too_large": None,
            "plain": "TypeError",
            "StopIteration": "RuntimeError",  # as Python turns it in any coroutine (PEP 479)
            "CancelledError": "cancelled while it ran",
        }.get(does, "cancelled while it ran" if does in CANCELS else does)
        self._check(sent, ended, runs, expected, error if expected is Decision.FORWARDED else None, RETURNS.get(does))
        if expected is Decision.FORWARDED and error is not None:
            caller_gets = {
                "StopIteration": RuntimeError,
                "plain": FilterTypeError,
                "CancelledError": asyncio.CancelledError,
            }
            wanted = CANCELS.get(does) or caller_gets.get(does) or RAISED[does]
            assert type(ended.error) is wanted, f"{sent}: the caller got {ended.error!r}, expected {wanted.__name__}"

    @rule(key=st.sampled_from(KEYS), content=st.sampled_from(CONTENTS), does=st.sampled_from(ASYNC_DOES))
    def async_message(self, key: str, content: int, does: str) -> None:
        self._async(self._new(key, content), does, decorated=False)

    @rule(key=st.sampled_from(KEYS), content=st.sampled_from(CONTENTS), does=st.sampled_from(ASYNC_DOES))
    def async_handler(self, key: str, content: int, does: str) -> None:
        self._async(self._new(key, content), does, decorated=True)

    @precondition(lambda self: bool(self.sent))
    @rule(data=st.data(), does=st.sampled_from(ASYNC_DOES), decorated=st.booleans())
    def async_redelivery(self, data: st.DataObject, does: str, decorated: bool) -> None:
        self._async(data.draw(st.sampled_from(self.sent), label="redelivered"), does, decorated)

    # --- close, reopen, and a second thread while close() runs -----------------------------

    @rule(key=st.sampled_from(KEYS), content=st.sampled_from(CONTENTS), decorated=st.booleans())
    def close_sync_then_call(self, key: str, content: int, decorated: bool) -> None:
        """close(); a call after it raises FilterClosed (nothing decided, the body not run); open it again."""
        STEPS["in-process"] += 1
        assert self.sync is not None
        within(self.sync.close, name="close").result()
        self.sync_closed = True
        self._sync(self._new(key, content), "return", decorated)
        self._reopen_sync()

    def _reopen_sync(self) -> None:
        self.sync = SyncFilter(self.config, clock=self.clock)
        self.sync_closed = False

    @rule(key=st.sampled_from(KEYS), content=st.sampled_from(CONTENTS), decorated=st.booleans())
    def close_async_then_call(self, key: str, content: int, decorated: bool) -> None:
        """The async twin of `close_sync_then_call`."""
        STEPS["in-process"] += 1
        assert self.async_filter is not None
        self.loop.run(self.async_filter.close()).result()
        self.async_closed = True
        self._async(self._new(key, content), "return", decorated)
        self._reopen_async()

    def _reopen_async(self) -> None:
        self.async_filter = self._open_async()
        self.async_closed = False

    @rule(
        key=st.sampled_from(KEYS),
        content=st.sampled_from(CONTENTS),
        other_key=st.sampled_from(KEYS),
        other_content=st.sampled_from(CONTENTS),
    )
    def process_while_close_runs(self, key: str, content: int, other_key: str, other_content: int) -> None:
        """A body runs on one thread; close() starts on another and waits for it; a third thread
        calls process() meanwhile: it is refused (FilterClosed) or, had it entered first, decided
        with the first body's lease held. Then the body ends: its call returns, close() returns;
        then it opens again."""
        STEPS["in-process"] += 1
        sync = self.sync
        assert sync is not None
        first, second = self._new(key, content), self._new(other_key, other_content)
        expected = self.ref.judge(first)
        entered, proceed, runs, second_runs = threading.Event(), threading.Event(), [], []

        def held(arg: Any) -> Any:
            runs.append(arg)
            entered.set()
            proceed.wait(WATCHDOG)
            return ("done", first.id)

        def second_body(arg: Any) -> Any:
            second_runs.append(arg)
            return ("done", second.id)

        first_call = start(lambda: sync.process(ROUTE, self._msg(first), held), name="first process")
        if expected is Decision.FORWARDED:
            assert entered.wait(WATCHDOG), "the first body never ran"
        closing = start(sync.close, name="close")
        second_call = start(lambda: sync.process(ROUTE, self._msg(second), second_body), name="second process")
        second_ended = second_call(WATCHDOG)
        # judged as it was decided: while the first body held its key
        second_expected = self.ref.judge(second, first if expected is Decision.FORWARDED else None)
        proceed.set()
        self._check(first, first_call(WATCHDOG), runs, expected, None)
        closing(WATCHDOG).result()
        self._reopen_sync()
        if isinstance(second_ended.error, FilterClosed):
            assert second_runs == []
            return
        self._check(second, second_ended, second_runs, second_expected, None)

    @rule(
        key=st.sampled_from(KEYS),
        content=st.sampled_from(CONTENTS),
        other_key=st.sampled_from(KEYS),
        other_content=st.sampled_from(CONTENTS),
        second_first=st.booleans(),
    )
    def async_process_while_close_runs(
        self, key: str, content: int, other_key: str, other_content: int, second_first: bool
    ) -> None:
        """The async twin of `process_while_close_runs`: a body runs in one task, close() in a
        second and process() in a third (started before or after close()); then it opens again."""
        STEPS["in-process"] += 1
        f = self.async_filter
        assert f is not None
        first, second = self._new(key, content), self._new(other_key, other_content)
        expected = self.ref.judge(first)
        second_expected = self.ref.judge(second, first if expected is Decision.FORWARDED else None)
        runs: list[Any] = []
        second_runs: list[Any] = []

        async def scenario() -> tuple[Ended[Any], Ended[Any], Ended[Any]]:
            entered, proceed = asyncio.Event(), asyncio.Event()

            async def held(arg: Any) -> Any:
                runs.append(arg)
                entered.set()
                await proceed.wait()
                return ("done", first.id)

            async def second_body(arg: Any) -> Any:
                second_runs.append(arg)
                return ("done", second.id)

            first_call = asyncio.ensure_future(_attempt(f.process(ROUTE, self._msg(first), held)))
            await (entered.wait() if expected is Decision.FORWARDED else asyncio.wait({first_call}))
            if second_first:
                second_call = asyncio.ensure_future(_attempt(f.process(ROUTE, self._msg(second), second_body)))
                closing = asyncio.ensure_future(_attempt(f.close()))
            else:
                closing = asyncio.ensure_future(_attempt(f.close()))
                second_call = asyncio.ensure_future(_attempt(f.process(ROUTE, self._msg(second), second_body)))
            second_ended = await second_call  # it never waits for the first body
            proceed.set()
            return await first_call, second_ended, await closing

        first_ended, second_ended, closed = self.loop.run(scenario()).result()
        closed.result()
        self._reopen_async()
        self._check(first, first_ended, runs, expected, None)
        if isinstance(second_ended.error, FilterClosed):
            assert second_runs == []
            return
        self._check(second, second_ended, second_runs, second_expected, None)

    def _msg(self, sent: Sent) -> Any:
        return payload_message(payload(sent.key, sent.content), message_id=sent.id)

    @rule(seconds=st.sampled_from((0.001, 1.0, 61.0, 3600.0)))
    def clock_moves(self, seconds: float) -> None:
        STEPS["in-process"] += 1
        self.clock.advance(seconds)

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def a_body_runs_at_most_once_for_a_message_while_its_forward_is_recent(self) -> None:
        """Committed with its result or without it (too large to keep), a redelivery never runs it again."""
        assert self.ran_again == [], f"bodies ran again for messages already committed: {self.ran_again}"

    @invariant()
    def no_key_is_left_leased(self) -> None:
        assert leased(self.config.store.path) == []  # type: ignore[union-attr]

    @invariant()
    def every_decided_call_has_its_record_and_every_failed_body_says_why(self) -> None:
        records = self._records()
        assert len(records) == self.records, f"{len(records)} records, {self.records} decided calls"
        by_id: dict[str, list[tuple[str, str | None]]] = {}
        for mid, decision, reason in records:
            by_id.setdefault(mid, []).append((decision, reason))
        for mid, says in self.failed_reasons:
            failed = [r for d, r in by_id.get(mid, []) if d == "failed"]
            assert failed and all(r and r.startswith("work failed: ") for r in failed), (mid, by_id.get(mid))
            assert any(says in (r or "") for r in failed), f"{mid}: the failed record should say {says!r}: {failed}"
