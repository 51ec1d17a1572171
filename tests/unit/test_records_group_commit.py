"""The embedded default's decision records share a commit among the requests of one
event-loop step, and every request is answered only once the commit holding its record is
done: a record is never missing for an answered request, whatever else fails. The commit is
made by the recorder's writer thread, never on the event loop."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.backends.publishers.outbox import read_outbox
from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.records.inline import InlineSqliteRecorder
from pubsub_filter.backends.records.sqlite import Prepared, Refused, SqliteSink
from pubsub_filter.core.config.schema import load
from pubsub_filter.core.engine.engine import Engine, Handled
from pubsub_filter.core.envelope import make_envelope, parse_envelope
from pubsub_filter.core.model import Decision, DecisionRecord
from pubsub_filter.push.app import create_app
from pubsub_filter.runtime.wiring import make_engine
from tests.support.fakes import KeptSink, suppressed_record

ROOT = Path(__file__).resolve().parents[2]
ROUTE = "injury-report"
REPORT = (ROOT / "examples" / "injury-report.json").read_bytes()
Message = dict[str, Any]


def inline_recorder(engine: Engine) -> InlineSqliteRecorder:
    assert isinstance(engine.recorder, InlineSqliteRecorder)
    return engine.recorder


async def post(app: Any, body: bytes, sent: list[Message]) -> None:
    """One push request, called as uvicorn calls the app: the whole body already received."""

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    path = f"/push/{ROUTE}"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"filter"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8080),
    }
    await app(scope, receive, send)


def answer(sent: list[Message]) -> tuple[int, str]:
    return sent[0]["status"], json.loads(sent[1]["body"])["decision"]


def stored(db_path: Path) -> list[tuple[str, str]]:
    """(message_id, decision) of every committed row, read as `skip-rate` reads: another connection."""
    db = sqlite3.connect(db_path)
    try:
        return sorted(db.execute("SELECT message_id, decision FROM decisions").fetchall())
    finally:
        db.close()


async def close(engine: Engine) -> None:
    await engine.recorder.close()
    await engine.publisher.close()
    await engine.store.close()


def bad_envelope(message_id: str) -> bytes:
    """Refused by the push surface itself (`parse_envelope`), before the engine sees a message."""
    return b'{"message": {"messageId": "%s", "data": "!!"}, "subscription": "s"}' % message_id.encode()


async def together(app: Any, *bodies: bytes) -> list[list[Message]]:
    """The bodies pushed at once: their requests run in one event-loop step, as c connections' do."""
    sent: list[list[Message]] = [[] for _ in bodies]
    await asyncio.gather(*(post(app, body, out) for body, out in zip(bodies, sent, strict=True)))
    return sent


async def in_company(app: Any) -> None:
    """Two requests in one step: from the next step on, its records share one commit from the first."""
    for out in await together(app, bad_envelope("company-1"), bad_envelope("company-2")):
        assert answer(out) == (400, "rejected")


async def primed(config: Path) -> tuple[Engine, Any]:
    """An engine and its push app with the report forwarded once: later copies are suppressed."""
    engine = make_engine(load(str(config)))
    app = create_app(engine)
    sent: list[Message] = []
    await post(app, make_envelope(REPORT, "first"), sent)
    assert answer(sent) == (200, "forwarded")
    return engine, app


async def test_once_requests_arrive_together_the_records_of_one_step_share_one_commit_a_rejection_among_them(
    quick_start: Path,
) -> None:
    engine, app = await primed(quick_start)
    recorder = inline_recorder(engine)
    try:
        await in_company(app)
        commits = recorder.commits
        suppress, reject = await together(app, make_envelope(REPORT, "again"), bad_envelope("bad-1"))
        assert answer(suppress) == (200, "suppressed")
        assert answer(reject) == (400, "rejected")
        assert recorder.commits == commits + 1
        assert stored(quick_start.parent / "filter-decisions.db") == [
            ("again", "suppressed"),
            ("bad-1", "rejected"),
            ("company-1", "rejected"),
            ("company-2", "rejected"),
            ("first", "forwarded"),
        ]
    finally:
        await close(engine)


async def test_a_record_is_written_by_the_writer_thread_never_on_the_event_loops(tmp_path: Path) -> None:
    recorder = InlineSqliteRecorder(SqliteSink(tmp_path / "d.db"), BatchingRecorder(KeptSink()))
    insert_apart = recorder.sink.insert_apart
    writers: set[int] = set()

    def watched(rows: list[Prepared]) -> Refused:
        writers.add(threading.get_ident())
        return insert_apart(rows)

    recorder.sink.insert_apart = watched  # type: ignore[method-assign]
    try:
        recorder.record(suppressed_record("a", route=ROUTE))
        assert stored(tmp_path / "d.db") == []  # not written on the loop's thread
        committing = recorder.committing()
        assert committing is not None
        await committing
        assert stored(tmp_path / "d.db") == [("a", "suppressed")]
        assert writers and threading.get_ident() not in writers
        assert recorder.committing() is None
    finally:
        await recorder.close()


async def test_the_records_of_one_step_share_one_commit(tmp_path: Path) -> None:
    recorder = InlineSqliteRecorder(SqliteSink(tmp_path / "d.db"), BatchingRecorder(KeptSink()))
    try:
        for message_id in ("a", "b", "c"):
            recorder.record(suppressed_record(message_id, route=ROUTE))
        committing = recorder.committing()
        assert committing is not None
        await committing
        assert (recorder.commits, stored(tmp_path / "d.db")) == (1, [(m, "suppressed") for m in "abc"])
    finally:
        await recorder.close()


async def test_no_answer_is_sent_before_the_commit_that_holds_its_record(
    quick_start: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, app = await primed(quick_start)
    recorder = inline_recorder(engine)
    answers: dict[str, list[Message]] = {}
    committed: list[list[tuple[str, int]]] = []  # per commit: (message id, messages its request had sent)
    insert_apart = recorder.sink.insert_apart

    def watched(rows: list[Prepared]) -> Refused:
        committed.append([(r.message_id, len(answers[r.message_id])) for r, _, _ in rows])
        return insert_apart(rows)

    async def push(body: bytes, message_id: str) -> None:
        await post(app, body, answers.setdefault(message_id, []))

    monkeypatch.setattr(recorder.sink, "insert_apart", watched)
    try:
        for step in ("1", "2"):  # a step after one alone (the priming), then a step after one with company
            ids = (f"s{step}a", f"s{step}b", f"r{step}")
            bodies = (make_envelope(REPORT, ids[0]), make_envelope(REPORT, ids[1]), bad_envelope(ids[2]))
            await asyncio.gather(*(push(body, mid) for body, mid in zip(bodies, ids, strict=True)))
            assert [answer(answers[mid]) for mid in ids] == [(200, "suppressed")] * 2 + [(400, "rejected")]
        assert committed == [  # one commit a step, before any of its requests had sent anything
            [("s1a", 0), ("s1b", 0), ("r1", 0)],
            [("s2a", 0), ("s2b", 0), ("r2", 0)],
        ]
    finally:
        await close(engine)


def test_a_crash_between_record_and_commit_answers_nothing_and_the_redelivery_is_not_published_again(
    quick_start: Path,
) -> None:
    """The process dies once the forward's record is made, before its commit runs: Pub/Sub
    got no answer, so it redelivers; the restarted filter must not publish it a second time."""
    loop = asyncio.new_event_loop()
    engine = make_engine(load(str(quick_start)))
    recorder = inline_recorder(engine)
    record: Callable[[DecisionRecord], None] = recorder.record

    def record_then_die(rec: DecisionRecord) -> None:
        record(rec)
        loop.stop()  # this loop step is the last: the hand-over to the writer, due at its end, never runs

    app = create_app(engine)
    loop.run_until_complete(in_company(app))  # so the forward's record waits for its step's commit
    recorder.record = record_then_die  # type: ignore[method-assign]
    sent: list[Message] = []
    body = make_envelope(REPORT, "first")
    task = loop.create_task(post(app, body, sent))
    loop.run_forever()
    db = quick_start.parent / "filter-decisions.db"
    try:
        assert sent == []  # no answer: Pub/Sub redelivers
        assert stored(db) == [("company-1", "rejected"), ("company-2", "rejected")]
        assert len(read_outbox(quick_start.parent / "outbox.jsonl").messages) == 1  # the forward landed

        async def restarted() -> list[Message]:
            again = make_engine(load(str(quick_start)))
            redelivered: list[Message] = []
            try:
                await post(create_app(again), body, redelivered)
            finally:
                await close(again)
            return redelivered

        assert answer(asyncio.run(restarted())) == (200, "duplicate")
        assert len(read_outbox(quick_start.parent / "outbox.jsonl").messages) == 1
        assert stored(db) == [("company-1", "rejected"), ("company-2", "rejected"), ("first", "duplicate")]
    finally:
        recorder.record = record  # type: ignore[method-assign]
        loop.run_until_complete(task)  # the dead process's step, let run out so the test leaves nothing open
        loop.run_until_complete(close(engine))
        loop.close()


async def test_a_failed_commit_answers_as_before_and_hands_every_row_to_the_fallback(quick_start: Path) -> None:
    engine, app = await primed(quick_start)
    recorder = inline_recorder(engine)
    db_path = quick_start.parent / "filter-decisions.db"
    recorder.sink._db.execute("PRAGMA busy_timeout = 0")  # fail at once rather than after 10 s
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the file's write lock
    try:
        suppress, reject = await together(app, make_envelope(REPORT, "again"), bad_envelope("bad-1"))
        assert (answer(suppress), answer(reject)) == ((200, "suppressed"), (400, "rejected"))
        assert (recorder.deferred, recorder.fallback.pending) == (2, 2)
        holder.execute("ROLLBACK")
        await recorder.flush()  # the fallback writes them off the request path
        assert stored(db_path) == [("again", "suppressed"), ("bad-1", "rejected"), ("first", "forwarded")]
    finally:
        holder.close()
        await close(engine)


async def recorded_in_company(recorder: InlineSqliteRecorder) -> None:
    """Two records in one step: from the next step on, its records share one commit from the first."""
    recorder.record(suppressed_record("company-1", route=ROUTE))
    recorder.record(suppressed_record("company-2", route=ROUTE))
    committing = recorder.committing()
    assert committing is not None
    await committing


async def test_a_record_that_cannot_be_stored_costs_only_itself_not_the_records_it_shared_a_commit_with(
    tmp_path: Path,
) -> None:
    kept = KeptSink()
    recorder = InlineSqliteRecorder(SqliteSink(tmp_path / "d.db"), BatchingRecorder(kept))
    try:
        await recorded_in_company(recorder)
        commits, written = recorder.commits, recorder.written
        unbindable = suppressed_record("bad", route=ROUTE, reason=object())  # no such value reaches a record today
        for rec in (suppressed_record("a", route=ROUTE), unbindable, suppressed_record("b", route=ROUTE)):
            recorder.record(rec)
        committing = recorder.committing()
        assert committing is not None
        await committing
        assert (recorder.commits, recorder.written, recorder.deferred) == (commits + 1, written + 2, 1)
        assert stored(tmp_path / "d.db")[:2] == [("a", "suppressed"), ("b", "suppressed")]
        await recorder.flush()
        assert kept.rows == [unbindable]
    finally:
        await recorder.close()


async def test_a_waiter_cancelled_does_not_cancel_the_commit_the_others_wait_for(tmp_path: Path) -> None:
    recorder = InlineSqliteRecorder(SqliteSink(tmp_path / "d.db"), BatchingRecorder(KeptSink()))

    async def decided(message_id: str) -> None:  # as `Engine.handle` does after `_finish`
        recorder.record(suppressed_record(message_id, route=ROUTE))
        committing = recorder.committing()
        assert committing is not None
        await committing

    try:
        await recorded_in_company(recorder)
        first, second = asyncio.create_task(decided("a")), asyncio.create_task(decided("b"))
        await asyncio.sleep(0)  # both record and wait, in one step, before their commit runs
        first.cancel()  # e.g. its client went away
        await second
        assert first.cancelled()
        assert stored(tmp_path / "d.db")[:2] == [("a", "suppressed"), ("b", "suppressed")]
    finally:
        await recorder.close()


def test_a_record_made_outside_an_event_loop_is_written_at_once(tmp_path: Path) -> None:
    recorder = InlineSqliteRecorder(SqliteSink(tmp_path / "d.db"), BatchingRecorder(KeptSink()))
    try:
        recorder.record(suppressed_record("a", route=ROUTE))
        assert recorder.committing() is None
        assert stored(tmp_path / "d.db") == [("a", "suppressed")]
    finally:
        asyncio.run(recorder.close())


async def test_close_writes_the_records_whose_commit_has_not_run_yet(tmp_path: Path) -> None:
    recorder = InlineSqliteRecorder(SqliteSink(tmp_path / "d.db"), BatchingRecorder(KeptSink()))
    await recorded_in_company(recorder)
    recorder.record(suppressed_record("a", route=ROUTE))
    assert recorder.committing() is not None  # its step's commit is still to run
    await recorder.close()
    assert stored(tmp_path / "d.db")[0] == ("a", "suppressed")


async def test_engine_handle_returns_once_its_record_is_committed(quick_start: Path) -> None:
    """Pull, replay and the in-process API answer from `Engine.handle`: the row is there when it returns."""
    engine = make_engine(load(str(quick_start)))
    try:
        await recorded_in_company(inline_recorder(engine))
        rec = (await engine.handle(ROUTE, parse_envelope(make_envelope(REPORT, "first")))).record
        assert rec.decision is Decision.FORWARDED
        assert ("first", "forwarded") in stored(quick_start.parent / "filter-decisions.db")
    finally:
        await close(engine)


async def test_a_cancel_while_a_shadow_forward_waits_for_its_records_commit_still_answers_it(
    quick_start: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shutdown past its grace cancels what is in flight, and a cancelled decision is nacked. A
    shadow (or fail-open) forward has already published and writes no state, so a nack then would
    have its redelivery published again: the cancel must not land in the wait for the record."""
    engine = make_engine(load(str(quick_start)))
    recorder = inline_recorder(engine)
    try:
        await recorded_in_company(recorder)
        waiting_for = recorder.committing
        handling: list[asyncio.Task[Handled]] = []
        cancels: list[None] = []

        def cancelled_while_committing() -> Any:
            committing = waiting_for()
            if not cancels:  # the shutdown's one cancel, as the request starts to wait for its commit
                cancels.append(None)
                handling[0].cancel()
            return committing

        monkeypatch.setattr(recorder, "committing", cancelled_while_committing)
        score = b'{"game_id": "g1", "game_status": "Final", "home": 101, "away": 99}'
        handling.append(asyncio.create_task(engine.handle("scoreboard", parse_envelope(make_envelope(score, "s1")))))
        rec = (await handling[0]).record
        assert rec.decision is Decision.FORWARDED and rec.acked
        assert len(read_outbox(quick_start.parent / "outbox.jsonl").messages) == 1
        assert ("s1", "forwarded") in stored(quick_start.parent / "filter-decisions.db")
    finally:
        await close(engine)


async def test_a_second_cancel_while_waiting_for_the_records_commit_goes_through_and_the_record_is_kept(
    quick_start: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for a record takes back one cancel, not two (a shutdown that will not wait): the
    decision is then answered as cancelled, and its record is still committed."""
    engine, _ = await primed(quick_start)
    recorder = inline_recorder(engine)
    held = threading.Event()  # the writer thread's commit, held until the two cancels are in
    insert = recorder.sink.insert_apart
    waiting = asyncio.Event()
    waiting_for = recorder.committing

    def held_insert(rows: list[Prepared]) -> Any:
        held.wait(10)
        return insert(rows)

    def committing() -> Any:
        waiting.set()
        return waiting_for()

    monkeypatch.setattr(recorder.sink, "insert_apart", held_insert)
    monkeypatch.setattr(recorder, "committing", committing)
    try:
        task = asyncio.create_task(engine.handle(ROUTE, parse_envelope(make_envelope(REPORT, "again"))))
        await waiting.wait()
        task.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
        assert not task.done()  # the first cancel is taken back: still waiting for the commit
        task.cancel()
        held.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await recorder.flush()
        assert ("again", "suppressed") in stored(quick_start.parent / "filter-decisions.db")
    finally:
        held.set()
        await close(engine)


async def test_a_record_made_after_close_is_counted_dropped_and_waits_for_nothing(tmp_path: Path) -> None:
    recorder = InlineSqliteRecorder(SqliteSink(tmp_path / "d.db"), BatchingRecorder(KeptSink()))
    recorder.record(suppressed_record("a", route=ROUTE))
    await recorder.close()
    recorder.record(suppressed_record("late", route=ROUTE))
    assert recorder.committing() is None
    assert (recorder.fallback.dropped, stored(tmp_path / "d.db")) == (1, [("a", "suppressed")])
