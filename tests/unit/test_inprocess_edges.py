"""The in-process API at its edges: bodies that raise what is not an `Exception`, bodies the API
cannot run, a caller's cancel, `close()` under work and a fork.

Whatever a body does, the call returns or raises (each one watched: a hang fails the test),
no key is left leased once the caller has its answer, a body that did not return leaves
nothing committed and a `failed` record, and the next copy of its content runs the body.
The state machine in test_inprocess_model.py drives the same API at random; what it finds
stays here as a named test.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from pubsub_filter.inprocess import Filter, FilterClosed, Forward, SyncFilter, api
from pubsub_filter.inprocess.handlers import on_payload
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.polling import wait_until
from tests.support.watchdog import WATCHDOG, decisions, leased, start, within

ROUTE = "reports"


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return parse(
        {
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "records": {"backend": "sqlite", "path": str(tmp_path / "records.db")},
            "routes": [{"name": ROUTE, "destination": "phase3", "key": ["payload.game"]}],
        }
    )


@pytest.fixture
def sync(config: Config) -> Iterator[SyncFilter]:
    f = SyncFilter(config, clock=ManualClock(time.time()))
    yield f
    within(f.close, name="close")


def message(status: str, message_id: str) -> Message:
    return Message(json.dumps({"game": "g1", "status": status}).encode(), {}, message_id)


def state_of(config: Config) -> Path:
    return Path(config.store.path)  # type: ignore[union-attr]


def records_of(config: Config) -> Path:
    return Path(config.records.path)  # type: ignore[union-attr]


def assert_failed_and_free(config: Config, message_id: str, reason: str) -> None:
    """The body's failure left the key free and a `failed` record (cause work) saying `reason`."""
    assert leased(state_of(config)) == []
    recorded = [(d, r) for mid, d, r in decisions(records_of(config)) if mid == message_id]
    assert len(recorded) == 1 and recorded[0][0] == "failed", recorded
    assert recorded[0][1] is not None and recorded[0][1].startswith("work failed: ") and reason in recorded[0][1]


def runs_again(f: SyncFilter, message_id: str) -> None:
    """Nothing was committed: the next copy of the content runs the body, and it is committed."""
    outcome = within(lambda: f.process(ROUTE, message("out", message_id), lambda fwd: "again")).result()
    assert (outcome.decision, outcome.ran, outcome.committed, outcome.result) == (
        Decision.FORWARDED,
        True,
        True,
        "again",
    )


# --- bodies raising what is not an Exception ---------------------------------------------------


def test_a_sync_body_raising_stopiteration_fails_the_message_frees_the_key_and_raises_it(
    sync: SyncFilter, config: Config
) -> None:
    def body(forward: Forward) -> Any:
        return next(iter(()))  # an exhausted iterator

    ended = within(lambda: sync.process(ROUTE, message("out", "m1"), body), name="process")
    assert type(ended.error) is StopIteration
    assert_failed_and_free(config, "m1", "StopIteration")
    runs_again(sync, "m2")


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_a_sync_body_raising_a_base_exception_fails_the_message_and_the_filter_keeps_working(
    sync: SyncFilter, config: Config, raised: type[BaseException]
) -> None:
    def body(forward: Forward) -> Any:
        raise raised("from the body")

    ended = within(lambda: sync.process(ROUTE, message("out", "m1"), body), name="process")
    assert type(ended.error) is raised and ended.error.args == ("from the body",)
    assert_failed_and_free(config, "m1", raised.__name__)
    runs_again(sync, "m2")  # the loop thread survived


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_an_async_body_raising_a_base_exception_fails_the_message_and_raises_it(
    config: Config, raised: type[BaseException]
) -> None:
    async def body(forward: Forward) -> Any:
        raise raised("from the body")

    async def scenario() -> None:
        async with Filter.open(config, ManualClock(time.time())) as f:
            await f.process(ROUTE, message("out", "m1"), body)

    ended = within(lambda: asyncio.run(scenario()), name="process")
    assert type(ended.error) is raised
    assert_failed_and_free(config, "m1", raised.__name__)


# --- bodies the API cannot run -----------------------------------------------------------------


def test_an_async_function_under_a_sync_payload_handler_is_refused_when_decorated(sync: SyncFilter) -> None:
    async def handle(payload: Any) -> None:
        raise AssertionError("never run")

    with pytest.raises(TypeError, match="async def"):
        on_payload(sync, ROUTE)(handle)


def test_an_async_body_passed_to_syncfilter_process_is_refused_before_any_claim(
    sync: SyncFilter, config: Config
) -> None:
    async def body(forward: Forward) -> None:
        raise AssertionError("never run")

    ended = within(lambda: sync.process(ROUTE, message("out", "m1"), body), name="process")
    assert isinstance(ended.error, TypeError) and "async def" in str(ended.error)
    assert leased(state_of(config)) == [] and decisions(records_of(config)) == []
    runs_again(sync, "m2")


def test_a_sync_body_returning_an_awaitable_fails_the_message_with_a_type_error(
    sync: SyncFilter, config: Config
) -> None:
    async def work(forward: Forward) -> None:
        raise AssertionError("never run")

    ended = within(lambda: sync.process(ROUTE, message("out", "m1"), lambda fwd: work(fwd)), name="process")
    assert isinstance(ended.error, TypeError) and "awaitable" in str(ended.error)
    assert_failed_and_free(config, "m1", "awaitable")
    runs_again(sync, "m2")


async def test_a_plain_function_under_an_async_handler_is_refused_when_decorated(config: Config) -> None:
    async with Filter.open(config) as f:

        def handle(payload: Any) -> None:
            raise AssertionError("never run")

        with pytest.raises(TypeError, match="async def"):
            on_payload(f, ROUTE)(handle)


# --- close() and fork ----------------------------------------------------------------------------


def test_close_waits_for_a_body_running_on_another_thread_whose_call_then_returns(config: Config) -> None:
    f = SyncFilter(config, clock=ManualClock(time.time()))
    entered, proceed = threading.Event(), threading.Event()

    def body(forward: Forward) -> str:
        entered.set()
        proceed.wait(WATCHDOG)
        return "done"

    processing = start(lambda: f.process(ROUTE, message("out", "m1"), body), name="process")
    assert entered.wait(WATCHDOG)
    closing = start(f.close, name="close")
    wait_until(lambda: f.closing, WATCHDOG, "close() never began", poll=0.001)  # close() waits for the body
    proceed.set()
    outcome = processing().result()
    closing().result()
    assert (outcome.decision, outcome.ran, outcome.committed) == (Decision.FORWARDED, True, True)
    assert leased(state_of(config)) == []
    assert [d for _, d, _ in decisions(records_of(config))] == ["forwarded"]


def test_process_after_close_raises_a_clear_error(config: Config) -> None:
    f = SyncFilter(config)
    within(f.close, name="close").result()
    ended = within(lambda: f.process(ROUTE, message("out", "m1"), lambda fwd: None), name="process")
    assert isinstance(ended.error, FilterClosed) and "closed" in str(ended.error)


def test_a_syncfilter_used_in_a_forked_child_raises_instead_of_hanging(sync: SyncFilter) -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, then leave without running any cleanup
        try:
            sync.process(ROUTE, message("out", "m1"), lambda fwd: None)
            said = b"returned"
        except BaseException as exc:
            said = f"{type(exc).__name__}: {exc}".encode()
        os.write(write_end, said)
        os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], WATCHDOG)
        said = os.read(read_end, 4096).decode() if ready else ""
    finally:
        os.close(read_end)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert said.startswith("FilterClosed") and "fork" in said, said or "the child hung"


# --- the caller's cancel ------------------------------------------------------------------------


async def _stuck(entered: asyncio.Event, saw: list[str]) -> Callable[[Forward], Awaitable[None]]:
    async def body(forward: Forward) -> None:
        entered.set()
        try:
            await asyncio.sleep(3600)  # stuck: only a cancel ends it
        except asyncio.CancelledError:
            saw.append("cancelled")
            raise

    return body


def _cancelled_by(config: Config, how: str) -> list[str]:
    """One body stuck under `how` (a task.cancel(), asyncio.timeout, wait_for): what the caller saw."""

    async def scenario() -> list[str]:
        entered, saw = asyncio.Event(), []
        body = await _stuck(entered, saw)
        async with Filter.open(config, ManualClock(time.time())) as f:
            call = f.process(ROUTE, message("out", "m1"), body)
            if how == "cancel":
                task = asyncio.create_task(call)
                await entered.wait()
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    saw.append("CancelledError")
            elif how == "timeout":
                try:
                    async with asyncio.timeout(None) as deadline:
                        task = asyncio.ensure_future(call)
                        await entered.wait()
                        deadline.reschedule(asyncio.get_running_loop().time())
                        await task
                except TimeoutError:
                    saw.append("TimeoutError")
            else:
                try:
                    await asyncio.wait_for(call, 1.0)
                except TimeoutError:
                    saw.append("TimeoutError")
        return saw

    return within(lambda: asyncio.run(scenario()), name=f"process under {how}").result()


@pytest.mark.parametrize(
    ("how", "caller_sees"), [("cancel", "CancelledError"), ("timeout", "TimeoutError"), ("wait_for", "TimeoutError")]
)
def test_a_callers_cancel_reaches_a_stuck_async_body_frees_the_key_and_propagates(
    config: Config, how: str, caller_sees: str
) -> None:
    assert _cancelled_by(config, how) == ["cancelled", caller_sees]
    assert_failed_and_free(config, "m1", "cancelled")
    with SyncFilter(config) as f:
        runs_again(f, "m2")


# --- a commit that fails past a body that returned ------------------------------------------------


class _CommitFails:
    """The SQLite store, whose commits raise: the body has run, the filter cannot record it."""

    def __init__(self, store: SqliteStore):
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def commit(self, *args: Any) -> bool:
        raise OSError("disk full")


async def test_after_a_commit_that_failed_past_its_body_the_next_copy_is_duplicate_until_the_lease_lapses(
    config: Config,
) -> None:
    """The README's word: the failed commit leaves the lease held, so the body runs again only once it lapsed."""
    clock = ManualClock(time.time())
    store = SqliteStore(state_of(config))
    f = Filter(Engine(config, _CommitFails(store), MemoryPublisher(), MemoryRecorder(), clock, "one"))  # type: ignore[arg-type]
    runs: list[int | None] = []

    async def body(forward: Forward) -> None:
        runs.append(forward.fence)

    first = await f.process(ROUTE, message("out", "m1"), body)
    assert (first.decision, first.ran, first.committed) == (Decision.FORWARDED, True, False)
    held = await f.process(ROUTE, message("out", "m2"), body)
    assert (held.decision, held.reason, held.acked, held.ran) == (
        Decision.DUPLICATE,
        "same content in flight",
        True,
        False,
    )
    clock.advance(config.lease.duration + 1)
    again = await f.process(ROUTE, message("out", "m3"), body)
    assert (again.decision, again.ran) == (Decision.FORWARDED, True) and runs == [1, 2]
    await store.close()


async def test_an_async_close_waits_for_a_body_running_in_another_task_and_refuses_later_calls(
    config: Config,
) -> None:
    f = Filter.open(config, ManualClock(time.time()))
    entered, proceed = asyncio.Event(), asyncio.Event()

    async def body(forward: Forward) -> str:
        entered.set()
        await proceed.wait()
        return "done"

    processing = asyncio.create_task(f.process(ROUTE, message("out", "m1"), body))
    await entered.wait()
    closing = asyncio.create_task(f.close())
    await asyncio.sleep(0)  # close() has begun: it waits for the body
    with pytest.raises(FilterClosed, match="closed"):
        await f.process(ROUTE, message("in", "m2"), body)
    proceed.set()
    outcome = await asyncio.wait_for(processing, WATCHDOG)
    await asyncio.wait_for(closing, WATCHDOG)
    assert (outcome.decision, outcome.ran, outcome.committed) == (Decision.FORWARDED, True, True)
    assert leased(state_of(config)) == []
    assert [d for _, d, _ in decisions(records_of(config))] == ["forwarded"]


def test_close_from_inside_a_sync_body_is_refused_instead_of_waiting_for_itself(sync: SyncFilter) -> None:
    def body(forward: Forward) -> str:
        with pytest.raises(RuntimeError, match="would wait for itself"):
            sync.close()
        return "done"

    outcome = within(lambda: sync.process(ROUTE, message("out", "m1"), body), name="process").result()
    assert (outcome.decision, outcome.committed, outcome.result) == (Decision.FORWARDED, True, "done")


async def test_close_from_inside_an_async_body_is_refused_instead_of_waiting_for_itself(config: Config) -> None:
    async with Filter.open(config) as f:

        async def body(forward: Forward) -> str:
            with pytest.raises(RuntimeError, match="would wait for itself"):
                await f.close()
            return "done"

        outcome = await asyncio.wait_for(f.process(ROUTE, message("out", "m1"), body), WATCHDOG)
    assert (outcome.decision, outcome.committed, outcome.result) == (Decision.FORWARDED, True, "done")


def test_a_callers_cancel_reaches_a_stuck_body_on_a_shadow_route_too(tmp_path: Path) -> None:
    shadow = parse(
        {
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "records": {"backend": "sqlite", "path": str(tmp_path / "records.db")},
            "routes": [{"name": ROUTE, "destination": "phase3", "key": ["payload.game"], "mode": "shadow"}],
        }
    )
    assert _cancelled_by(shadow, "cancel") == ["cancelled", "CancelledError"]
    [(_, decision, reason)] = decisions(records_of(shadow))
    assert decision == "failed" and reason is not None and "cancelled while it ran" in reason


class _ClaimWaits:
    """The embedded store, whose claim waits until it is cancelled: the caller is then waiting on the loop."""

    def __init__(self, store: Any):
        self.store = store
        self.reached = threading.Event()
        self.cancelled = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def claim(self, *args: Any) -> Any:
        self.reached.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def claims_wait(monkeypatch: pytest.MonkeyPatch) -> list[_ClaimWaits]:
    """The stores the filters opened from here on make: each a `_ClaimWaits` over the embedded one."""
    stores: list[_ClaimWaits] = []
    make_store = api.make_store

    def waiting_store(cfg: Config) -> Any:
        stores.append(_ClaimWaits(make_store(cfg)))
        return stores[-1]

    monkeypatch.setattr(api, "make_store", waiting_store)
    return stores


def test_a_ctrl_c_while_the_caller_waits_on_the_loop_cancels_the_decision_there(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real Ctrl-C lands in the main thread wherever it waits: here, for the loop's claim. The
    decision on the loop is cancelled with it, so close() does not wait on it for ever."""
    assert threading.current_thread() is threading.main_thread()
    # Python's own Ctrl-C handler, whatever an earlier test left installed (an asyncio.Runner's)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_while_the_caller_waits(config, monkeypatch)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_while_the_caller_waits(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    stores = claims_wait(monkeypatch)
    f = SyncFilter(config)

    def ctrl_c() -> None:
        if stores[0].reached.wait(WATCHDOG):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    interrupter = threading.Thread(target=ctrl_c)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            f.process(ROUTE, message("out", "m1"), lambda fwd: "never")
    finally:
        interrupter.join(WATCHDOG)
    within(f.close, name="close").result()
    assert stores[0].cancelled.is_set()
    assert leased(state_of(config)) == []


@pytest.mark.parametrize("where", ["as the decision is submitted", "once the loop has started it"])
def test_a_ctrl_c_landing_between_the_submission_and_the_wait_still_cancels_the_decision(
    config: Config, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A Ctrl-C is raised at whatever line the caller's thread is on: here, the one that hands the
    decision to the loop, after the loop has it. It is cancelled all the same: nothing stays
    leased, and close() returns."""
    stores = claims_wait(monkeypatch)
    f = SyncFilter(config)
    submit = asyncio.run_coroutine_threadsafe

    def interrupted(coro: Any, loop: asyncio.AbstractEventLoop) -> Any:
        submit(coro, loop)  # the loop has the decision...
        if where == "once the loop has started it":
            assert stores[0].reached.wait(WATCHDOG)
        raise KeyboardInterrupt  # ...and the caller's thread never sees its future

    monkeypatch.setattr(api.asyncio, "run_coroutine_threadsafe", interrupted)
    with pytest.raises(KeyboardInterrupt):
        f.process(ROUTE, message("out", "m1"), lambda fwd: "never")
    monkeypatch.undo()
    within(f.close, name="close").result()
    if where == "once the loop has started it":
        assert stores[0].cancelled.is_set()
    assert leased(state_of(config)) == []


# --- a result cache_result cannot keep -------------------------------------------------------------


def test_a_result_too_large_to_keep_is_committed_without_it_and_warned_of_once_a_route(tmp_path: Path) -> None:
    cfg = parse(
        {
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "records": {"backend": "sqlite", "path": str(tmp_path / "records.db")},
            "routes": [
                {"name": ROUTE, "destination": "phase3", "key": ["payload.game"], "cache_result": True},
                {"name": "other", "destination": "phase3", "key": ["payload.game"], "cache_result": True},
            ],
        }
    )
    runs: list[str] = []

    def too_large(forward: Forward) -> str:
        runs.append(forward.attributes["filter_source_message_id"])
        return "x" * (100 * 1024)

    deliveries = [
        (ROUTE, "m1", "out"),
        (ROUTE, "m1", "out"),  # redeliveries of m1
        (ROUTE, "m1", "out"),
        (ROUTE, "m2", "in"),  # new content on the same route: committed, not warned of again
        ("other", "m3", "out"),  # another route: warned of once there
    ]
    with capture_logs() as logs, SyncFilter(cfg, clock=ManualClock(time.time())) as f:

        def deliver(route: str, mid: str, status: str) -> Any:
            return within(lambda: f.process(route, message(status, mid), too_large), name="process").result()

        outcomes = [deliver(*d) for d in deliveries]

    assert runs == ["m1", "m2", "m3"]
    assert [(o.decision, o.ran, o.committed, o.cached) for o in outcomes] == [
        (Decision.FORWARDED, True, True, False),
        (Decision.DUPLICATE, False, False, False),
        (Decision.DUPLICATE, False, False, False),
        (Decision.FORWARDED, True, True, False),
        (Decision.FORWARDED, True, True, False),
    ]
    assert [o.result is None for o in outcomes] == [False, True, True, False, False]
    assert leased(state_of(cfg)) == []
    warned = [e for e in logs if e["event"] == "result_not_kept"]
    assert [(e["route"], e["message_id"], e["log_level"]) for e in warned] == [
        (ROUTE, "m1", "warning"),
        ("other", "m3", "warning"),
    ]
    assert "102402 bytes as JSON, more than the 65536 kept" in warned[0]["reason"]
