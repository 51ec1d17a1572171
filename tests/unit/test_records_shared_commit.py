"""The embedded default's records cost per commit, not per record: the decisions of one commit
are answered by one report from the writer thread, and what is handed over while it commits
goes into its next commit, in one piece. Still, each waiter's wait is its own: a cancelled
waiter leaves the commit, and the others' answers, alone."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.backends.records import inline
from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.records.inline import InlineSqliteRecorder
from pubsub_filter.backends.records.sqlite import Prepared, SqliteSink, prepared
from pubsub_filter.core.model import DecisionRecord
from tests.support.fakes import KeptSink, suppressed_record


def stored(db_path: Path) -> list[str]:
    db = sqlite3.connect(db_path)
    try:
        return sorted(m for (m,) in db.execute("SELECT message_id FROM decisions"))
    finally:
        db.close()


@pytest.fixture
async def recorder(tmp_path: Path) -> AsyncIterator[InlineSqliteRecorder]:
    made = InlineSqliteRecorder(SqliteSink(tmp_path / "d.db"), BatchingRecorder(KeptSink()))
    yield made
    await made.close()


async def decided(recorder: InlineSqliteRecorder, message_id: str) -> None:
    """As `Engine.handle` does after its decision: record, then wait for the commit."""
    recorder.record(suppressed_record(message_id))
    committing = recorder.committing()
    assert committing is not None
    await committing


class HeldCommits:
    """The writer's commits held until `held` is set: `writing` is set as one begins, `sizes`
    counts the rows of each."""

    def __init__(self, recorder: InlineSqliteRecorder, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writing, self.held = threading.Event(), threading.Event()
        self.sizes: list[int] = []
        insert = recorder.sink.insert_apart

        def held_insert(rows: list[Prepared]) -> Any:
            self.sizes.append(len(rows))
            self.writing.set()
            self.held.wait(10)
            return insert(rows)

        monkeypatch.setattr(recorder.sink, "insert_apart", held_insert)


async def test_the_decisions_of_one_commit_are_answered_by_one_report_from_the_writer(
    recorder: InlineSqliteRecorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await decided(recorder, "first")  # the writer thread started
    loop = asyncio.get_running_loop()
    reports: list[Callable[..., Any]] = []
    threadsafe = loop.call_soon_threadsafe

    def counted(callback: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        reports.append(callback)
        return threadsafe(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    commits = recorder.commits
    await asyncio.gather(*(decided(recorder, f"m{i}") for i in range(16)))
    assert (recorder.commits - commits, len(reports)) == (1, 1)
    assert stored(tmp_path / "d.db") == sorted(["first"] + [f"m{i}" for i in range(16)])


async def test_the_steps_handed_over_while_the_writer_commits_share_its_next_commit(
    recorder: InlineSqliteRecorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = HeldCommits(recorder, monkeypatch)
    writing, held = commits.writing, commits.held
    try:
        first = asyncio.create_task(decided(recorder, "a"))
        await asyncio.to_thread(writing.wait, 10)  # the writer holds "a"'s commit
        later = [asyncio.create_task(decided(recorder, "b"))]
        await asyncio.sleep(0)  # "b"'s step is handed over; "c" comes in a step of its own
        later.append(asyncio.create_task(decided(recorder, "c")))
        for _ in range(2):  # "c" recorded, then its step handed over, before the writer goes on
            await asyncio.sleep(0)
        held.set()
        await asyncio.gather(first, *later)
    finally:
        held.set()
    assert commits.sizes == [1, 2]
    assert stored(tmp_path / "d.db") == ["a", "b", "c"]


async def test_a_cancelled_waiter_leaves_every_other_waiter_of_its_commit_answered(
    recorder: InlineSqliteRecorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await decided(recorder, "first")
    held = HeldCommits(recorder, monkeypatch).held
    try:
        waiters = [asyncio.create_task(decided(recorder, f"m{i}")) for i in range(8)]
        await asyncio.sleep(0)  # all eight recorded and waiting, in one step
        waiters[3].cancel()
        await asyncio.sleep(0)
        assert waiters[3].cancelled()  # its own wait ends at once, the commit goes on
        held.set()
        await asyncio.gather(*(w for i, w in enumerate(waiters) if i != 3))
    finally:
        held.set()
    assert stored(tmp_path / "d.db") == sorted(["first"] + [f"m{i}" for i in range(8)])


async def test_the_records_of_one_commit_are_written_by_one_statement(
    recorder: InlineSqliteRecorder, tmp_path: Path
) -> None:
    """One call into SQLite a commit: each time the writer thread takes the GIL back while the
    loop runs costs both threads a wake-up, so not once a row (nor for a BEGIN and a COMMIT)."""
    await decided(recorder, "first")
    statements: list[str] = []
    recorder.sink._db.set_trace_callback(statements.append)
    await asyncio.gather(*(decided(recorder, f"m{i}") for i in range(16)))
    assert [s.split(" ", 1)[0] for s in statements] == ["INSERT"]
    assert stored(tmp_path / "d.db") == sorted(["first"] + [f"m{i}" for i in range(16)])


async def test_the_values_a_commit_binds_are_built_on_the_event_loop_not_by_the_writer_thread(
    recorder: InlineSqliteRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    builders: set[int] = set()

    def noted(record: DecisionRecord) -> Prepared:
        builders.add(threading.get_ident())
        return prepared(record)

    monkeypatch.setattr(inline, "prepared", noted)
    await asyncio.gather(*(decided(recorder, f"m{i}") for i in range(4)))
    assert builders == {threading.get_ident()}


async def test_a_record_made_while_close_waits_for_the_last_commit_is_written_before_the_writer_stops(
    tmp_path: Path,
) -> None:
    recorder = InlineSqliteRecorder(SqliteSink(tmp_path / "d.db"), BatchingRecorder(KeptSink()))
    recorder.record(suppressed_record("a"))
    committing = recorder.committing()
    assert isinstance(committing, asyncio.Future)
    late: list[Awaitable[None] | None] = []

    def record_late(_: object) -> None:
        """Runs once "a" is committed, before close (waiting for that commit too) goes on to stop the writer."""
        recorder.record(suppressed_record("late"))
        late.append(recorder.committing())

    committing.add_done_callback(record_late)
    await recorder.close()
    assert late[0] is not None
    await asyncio.wait_for(late[0], 5)  # answered, not left waiting for a writer that is gone
    assert (stored(tmp_path / "d.db"), recorder.deferred) == (["a", "late"], 0)


async def test_past_max_waiting_rows_a_new_record_goes_to_the_batching_recorder_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk far slower than the requests: the rows waiting for the writer are bounded, and
    what comes past the bound is written by the batching recorder instead, not lost."""
    kept = KeptSink()
    recorder = InlineSqliteRecorder(SqliteSink(tmp_path / "d.db"), BatchingRecorder(kept), max_waiting=2)
    held = HeldCommits(recorder, monkeypatch).held
    try:
        for message_id in ("a", "b", "c"):
            recorder.record(suppressed_record(message_id))
        assert (recorder.deferred, recorder.fallback.pending) == (1, 1)  # "c", at once
        held.set()
        committing = recorder.committing()
        assert committing is not None
        await committing
        await recorder.flush()
        assert (stored(tmp_path / "d.db"), [r.message_id for r in kept.rows]) == (["a", "b"], ["c"])
    finally:
        held.set()
        await recorder.close()


class HeldPause:
    """The writer's commit delay (`inline._pause`) held until `go` is set: `pausing` is set as it begins."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pausing, self.go = threading.Event(), threading.Event()
        self.calls: list[float] = []

        def held(seconds: float) -> None:
            self.calls.append(seconds)
            self.pausing.set()
            self.go.wait(10)

        monkeypatch.setattr(inline, "_pause", held)


async def test_once_commits_are_shared_the_writer_waits_its_window_and_the_steps_handed_over_meanwhile_join_the_commit(
    recorder: InlineSqliteRecorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await asyncio.gather(decided(recorder, "a1"), decided(recorder, "a2"))  # a shared commit: two rows
    pause = HeldPause(monkeypatch)
    commits = HeldCommits(recorder, monkeypatch)
    commits.held.set()  # counted, not held
    try:
        first = asyncio.create_task(decided(recorder, "b"))
        await asyncio.to_thread(pause.pausing.wait, 10)  # the writer has "b"'s step and waits its window
        later = asyncio.create_task(decided(recorder, "c"))
        for _ in range(2):  # "c" recorded, then its step handed over, while the writer waits
            await asyncio.sleep(0)
        pause.go.set()
        await asyncio.gather(first, later)
    finally:
        pause.go.set()
    assert pause.calls == [inline.COMMIT_WINDOW]
    assert commits.sizes == [2]  # "b" and "c": one commit
    assert stored(tmp_path / "d.db") == ["a1", "a2", "b", "c"]


async def test_a_lone_request_after_a_commit_of_one_row_is_not_held_up_by_the_window(
    recorder: InlineSqliteRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    pause = HeldPause(monkeypatch)
    pause.go.set()
    for i in range(3):  # one request at a time: every commit holds one row
        await decided(recorder, f"m{i}")
    assert pause.calls == []
    await asyncio.gather(decided(recorder, "x"), decided(recorder, "y"))  # together: a shared commit
    await decided(recorder, "z")  # the next commit waits the window
    assert pause.calls == [inline.COMMIT_WINDOW]
