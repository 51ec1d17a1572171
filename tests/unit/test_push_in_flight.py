"""Push bodies in flight are bounded by `server.max_bytes_in_flight`: past it a push waits for
room, unread, up to `server.admission_wait`, and is decided once the bodies before it are
answered; one that finds no room in that time is answered 429 with `Retry-After` (a retry Pub/Sub
backs off on, never an ack), recorded as `failed` with cause `overloaded` and counted, and taken
when sent again. One push is always taken in, whatever its size."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.config.schema import load
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.push.app import create_app
from pubsub_filter.runtime.otel import from_config
from pubsub_filter.runtime.wiring import make_engine
from tests.support.asgi import call

BOUND = 4096

Message = dict[str, Any]


@pytest.fixture
async def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Engine, Any]]:
    monkeypatch.chdir(tmp_path)
    engine, app = served_with(tmp_path, "2s")  # the default wait
    yield engine, app
    await engine.close()


def push(key: str, size: int) -> bytes:
    return make_envelope(b"x" * size, f"m-{key}", {"id": key})


def push_scope(body: bytes) -> dict[str, Any]:
    """The ASGI scope of a push of `body` to the `raw` route, its length declared."""
    headers = [(b"content-length", str(len(body)).encode())]
    return {"type": "http", "method": "POST", "path": "/push/raw", "root_path": "", "headers": headers}


class Stalled:
    """A push whose body stops after its first part until `finish()`, as a slow upload arrives."""

    def __init__(self, app: Any, body: bytes) -> None:
        self.body = body
        self.rest = asyncio.Event()
        self.sent: list[Message] = []
        self.waiting = asyncio.Event()
        self.task = asyncio.create_task(app(push_scope(body), self.receive, self.send))
        self.parts = 0

    async def receive(self) -> Message:
        self.parts += 1
        if self.parts == 1:
            return {"type": "http.request", "body": self.body[:100], "more_body": True}
        self.waiting.set()
        await self.rest.wait()
        return {"type": "http.request", "body": self.body[100:], "more_body": False}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    async def finish(self) -> tuple[int, dict[str, Any]]:
        self.rest.set()
        await self.task
        return self.sent[0]["status"], json.loads(self.sent[1]["body"])


def served_with(tmp_path: Path, wait: str) -> tuple[Engine, Any]:
    (tmp_path / "filter.yaml").write_text(
        f"server: {{max_bytes_in_flight: {BOUND}, admission_wait: {wait}}}\n"
        "routes:\n  - {name: raw, destination: out, key: [attributes.id]}\n"
    )
    engine = make_engine(load(str(tmp_path / "filter.yaml")), from_config(metrics=False, traces=False, env={}))
    return engine, create_app(engine)


def recorded(path: str = "filter-decisions.db") -> list[tuple[str, str]]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT decision, message_id FROM decisions ORDER BY rowid").fetchall()
    finally:
        db.close()


class Waiting:
    """A push whose whole body is ready, but which says when it is first read (`read`)."""

    def __init__(self, app: Any, body: bytes, reads: list[bytes] | None = None) -> None:
        self.body = body
        self.reads = reads if reads is not None else []
        self.read = asyncio.Event()
        self.sent: list[Message] = []
        self.task = asyncio.create_task(app(push_scope(body), self.receive, self.send))

    async def receive(self) -> Message:
        self.read.set()
        self.reads.append(self.body)
        return {"type": "http.request", "body": self.body, "more_body": False}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    async def answered(self) -> tuple[int, dict[str, Any]]:
        await self.task
        return self.sent[0]["status"], json.loads(self.sent[1]["body"])


async def until_waiting(app: Any, count: int) -> None:
    """Until `count` pushes wait for room (the loop's turns: each push reaches its wait in a few)."""
    for _ in range(1000):
        if len(app.push.in_flight.waiting) == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{len(app.push.in_flight.waiting)} pushes wait for room, not {count}")


async def test_a_push_past_the_bound_waits_unread_and_is_decided_once_the_body_before_it_is_answered(
    served: tuple[Engine, Any],
) -> None:
    engine, app = served
    first = Stalled(app, push("a", 2000))
    await first.waiting.wait()  # its body is in flight
    over = Waiting(app, push("b", 2000))
    assert len(first.body) + len(over.body) > BOUND
    await until_waiting(app, 1)
    assert not over.read.is_set()  # its body waits in its connection, unread
    status, decided = await first.finish()
    assert (status, decided["decision"]) == (200, "forwarded")
    status, decided = await over.answered()
    assert (status, decided["decision"]) == (200, "forwarded")
    assert engine.counts["push_overloaded"] == 0
    assert app.push.in_flight.held == 0
    await engine.close()  # the records are written
    assert recorded() == [("forwarded", "m-a"), ("forwarded", "m-b")]


async def test_pushes_waiting_for_room_are_admitted_in_the_order_they_came_as_room_is_released(
    served: tuple[Engine, Any],
) -> None:
    _, app = served
    first = Stalled(app, push("a", 2000))
    await first.waiting.wait()
    reads: list[bytes] = []
    waiting = []
    for key in "bcd":
        waiting.append(Waiting(app, push(key, 1500), reads))
        await until_waiting(app, len(waiting))
    assert 2 * len(waiting[0].body) > BOUND  # room for one at a time
    await first.finish()
    for w in waiting:
        status, decided = await w.answered()
        assert (status, decided["decision"]) == (200, "forwarded")
    assert reads == [w.body for w in waiting]
    assert app.push.in_flight.held == 0 and not app.push.in_flight.waiting


@pytest.mark.parametrize("wait", ["0s", "50ms"], ids=["answered at once", "after its wait"])
async def test_a_push_that_finds_no_room_within_the_admission_wait_is_answered_429_recorded_and_taken_when_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait: str
) -> None:
    monkeypatch.chdir(tmp_path)
    engine, app = served_with(tmp_path, wait)
    first = Stalled(app, push("a", 2000))
    await first.waiting.wait()  # its body is in flight, and stays so past the wait
    over = push("b", 2000)
    refused: list[Message] = []
    drained_after_record: list[bool] = []

    async def receive() -> Message:
        # the body is read only to be dropped, once the push is recorded as turned away
        drained_after_record.append(engine.counts["push_overloaded"] == 1)
        return {"type": "http.request", "body": over, "more_body": False}

    async def send(message: Message) -> None:
        refused.append(message)

    await app(push_scope(over), receive, send)
    assert drained_after_record == [True]
    assert refused[0]["status"] == 429
    assert (b"retry-after", b"1") in refused[0]["headers"]
    answer = json.loads(refused[1]["body"])
    assert answer["decision"] == "failed"
    assert "server.max_bytes_in_flight" in answer["reason"]
    assert ("of waiting for room" in answer["reason"]) is (wait != "0s")
    assert engine.counts["push_overloaded"] == 1
    assert not app.push.in_flight.waiting
    status, decided = await first.finish()
    assert (status, decided["decision"]) == (200, "forwarded")
    status, body = await call(app, "POST", "/push/raw", over)  # sent again: the first is answered
    assert (status, json.loads(body)["decision"]) == (200, "forwarded")
    assert app.push.in_flight.held == 0
    await engine.close()  # the records are written
    assert recorded() == [("failed", ""), ("forwarded", "m-a"), ("forwarded", "m-b")]


async def test_a_push_cancelled_while_it_waits_for_room_is_answered_503_and_holds_nothing(
    served: tuple[Engine, Any],
) -> None:
    _, app = served
    first = Stalled(app, push("a", 2000))
    await first.waiting.wait()
    over = Waiting(app, push("b", 2000))
    await until_waiting(app, 1)
    over.task.cancel()  # the shutdown's cancel
    status, answer = await over.answered()
    assert (status, answer["decision"]) == (503, "failed")
    assert not over.read.is_set()
    assert not app.push.in_flight.waiting
    status, _ = await first.finish()
    assert status == 200
    assert app.push.in_flight.held == 0


async def test_one_push_larger_than_the_bound_is_taken_when_nothing_else_is_in_flight(
    served: tuple[Engine, Any],
) -> None:
    _, app = served
    status, body = await call(app, "POST", "/push/raw", push("big", 3 * BOUND))
    assert (status, json.loads(body)["decision"]) == (200, "forwarded")


async def test_a_body_of_no_declared_length_counts_once_read(served: tuple[Engine, Any]) -> None:
    engine, app = served
    first = Stalled(app, push("a", 2000))
    await first.waiting.wait()
    over = push("c", 2000)
    status, body = await call(
        app, "POST", "/push/raw", headers=[(b"content-length", b"")], chunks=[over[:10], over[10:]]
    )
    assert status == 429, body
    assert engine.counts["push_overloaded"] == 1
    status, _ = await first.finish()
    assert status == 200


def test_the_overloaded_cause_is_answered_429_with_a_retry() -> None:
    from pubsub_filter.core.engine.answer import answer_for
    from pubsub_filter.core.model import Cause, Decision, DecisionRecord

    rec = DecisionRecord(
        time=0, route="r", decision=Decision.FAILED, enforced=True, message_id=None, cause=Cause.OVERLOADED
    )
    answer = answer_for(rec)
    assert (answer.ack, answer.status, answer.retry_after) == (False, 429, True)
