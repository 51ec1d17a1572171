"""Push bodies in flight are bounded by `server.max_bytes_in_flight`: past it a push is answered
at once, unread, 429 with `Retry-After` (a retry Pub/Sub backs off on, never an ack), recorded as
`failed` with cause `overloaded` and counted; taken again once the bodies before it are answered.
One push is always taken in, whatever its size."""

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
    (tmp_path / "filter.yaml").write_text(
        f"server: {{max_bytes_in_flight: {BOUND}}}\n"
        "routes:\n  - {name: raw, destination: out, key: [attributes.id]}\n"
    )
    engine = make_engine(load(str(tmp_path / "filter.yaml")), from_config(metrics=False, traces=False, env={}))
    yield engine, create_app(engine)
    await engine.close()


def push(key: str, size: int) -> bytes:
    return make_envelope(b"x" * size, f"m-{key}", {"id": key})


class Stalled:
    """A push whose body stops after its first part until `finish()`, as a slow upload arrives."""

    def __init__(self, app: Any, body: bytes) -> None:
        self.body = body
        self.rest = asyncio.Event()
        self.sent: list[Message] = []
        self.waiting = asyncio.Event()
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/push/raw",
            "root_path": "",
            "headers": [(b"content-length", str(len(body)).encode())],
        }
        self.task = asyncio.create_task(app(scope, self.receive, self.send))
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


async def test_a_push_past_the_bound_is_answered_429_at_once_unread_recorded_and_taken_when_sent_again(
    served: tuple[Engine, Any],
) -> None:
    engine, app = served
    first = Stalled(app, push("a", 2000))
    await first.waiting.wait()  # its body is in flight
    over = push("b", 2000)
    assert len(first.body) + len(over) > BOUND
    refused: list[Message] = []

    async def unread() -> Message:
        raise AssertionError("a push past the bound is answered before its body is read")

    async def send(message: Message) -> None:
        refused.append(message)

    headers = [(b"content-length", str(len(over)).encode())]
    scope = {"type": "http", "method": "POST", "path": "/push/raw", "root_path": "", "headers": headers}
    await app(scope, unread, send)
    assert refused[0]["status"] == 429
    assert (b"retry-after", b"1") in refused[0]["headers"]
    answer = json.loads(refused[1]["body"])
    assert answer["decision"] == "failed"
    assert "server.max_bytes_in_flight" in answer["reason"]
    assert engine.counts["push_overloaded"] == 1
    status, decided = await first.finish()
    assert (status, decided["decision"]) == (200, "forwarded")
    status, body = await call(app, "POST", "/push/raw", over)  # sent again: the first is answered
    assert (status, json.loads(body)["decision"]) == (200, "forwarded")
    await engine.close()  # the records are written
    db = sqlite3.connect("filter-decisions.db")
    try:
        rows = db.execute("SELECT decision, message_id FROM decisions ORDER BY rowid").fetchall()
    finally:
        db.close()
    assert rows == [("failed", ""), ("forwarded", "m-a"), ("forwarded", "m-b")]


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
