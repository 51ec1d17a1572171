"""A push answered before its body is read (unknown route 404, declared too large 413, past the
bytes in flight 429) is recorded first, then its body is read to its end a part at a time and
dropped, and only then answered: the loop takes it at the pace of a body being read, never all
that has arrived in one turn. A body that does not end within the sender's `server.body_timeout`
is answered with the connection closed (its rest must not be read as the next request)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.config.schema import load
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.push.admission import LoopLag
from pubsub_filter.push.app import _drained, create_app
from pubsub_filter.runtime.otel import from_config
from pubsub_filter.runtime.wiring import make_engine

Message = dict[str, Any]
BOUND = 4096


@pytest.fixture
async def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Engine, Any]]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "filter.yaml").write_text(
        f"server: {{max_bytes_in_flight: {BOUND}, admission_wait: 0s, max_body: 8192, body_timeout: 200ms}}\n"
        "routes:\n  - {name: raw, destination: out, key: [attributes.id]}\n"
    )
    engine = make_engine(load(str(tmp_path / "filter.yaml")), from_config(metrics=False, traces=False, env={}))
    yield engine, create_app(engine)
    await engine.close()


class Upload:
    """A request whose body arrives in `parts`, each handed over by one `receive`; the log says
    what happened in which order (`recv` per part, `send` per answer message)."""

    def __init__(self, path: str, parts: list[bytes], declared: int | None = None, stall: bool = False) -> None:
        self.path, self.parts, self.stall = path, list(parts), stall
        self.declared = sum(map(len, parts)) if declared is None else declared
        self.log: list[str] = []
        self.sent: list[Message] = []
        self.reading = asyncio.Event()

    async def receive(self) -> Message:
        if not self.parts:
            if self.stall:
                await asyncio.Event().wait()  # the sender went quiet
            return {"type": "http.disconnect"}
        self.log.append("recv")
        self.reading.set()
        part = self.parts.pop(0)
        return {"type": "http.request", "body": part, "more_body": bool(self.parts) or self.stall}

    async def send(self, message: Message) -> None:
        self.log.append("send")
        self.sent.append(message)

    async def run(self, app: Any) -> tuple[int, dict[bytes, bytes], dict[str, Any]]:
        headers = [(b"content-length", str(self.declared).encode())]
        scope = {"type": "http", "method": "POST", "path": self.path, "root_path": "", "headers": headers}
        await app(scope, self.receive, self.send)
        return self.sent[0]["status"], dict(self.sent[0]["headers"]), json.loads(self.sent[1]["body"])


def body_of(size: int, key: str = "k") -> list[bytes]:
    whole = make_envelope(b"x" * size, f"m-{key}", {"id": key})
    return [whole[i : i + 500] for i in range(0, len(whole), 500)]


async def test_an_unknown_routes_body_is_read_to_its_end_before_its_404(served: tuple[Engine, Any]) -> None:
    _, app = served
    upload = Upload("/push/nowhere", body_of(3000))
    count = len(upload.parts)
    status, headers, answer = await upload.run(app)
    assert (status, answer["decision"]) == (404, "rejected")
    assert upload.log == ["recv"] * count + ["send", "send"]
    assert b"connection" not in headers  # the connection serves the next request


async def test_a_body_declared_too_large_is_read_to_its_end_before_its_413(served: tuple[Engine, Any]) -> None:
    _, app = served
    upload = Upload("/push/raw", body_of(9000))
    assert upload.declared > 8192
    count = len(upload.parts)
    status, _, answer = await upload.run(app)
    assert (status, answer["decision"]) == (413, "rejected")
    assert upload.log == ["recv"] * count + ["send", "send"]


async def test_a_body_larger_than_it_was_declared_is_read_to_its_end_before_its_413(
    served: tuple[Engine, Any],
) -> None:
    _, app = served
    upload = Upload("/push/raw", body_of(9000), declared=1000)
    count = len(upload.parts)
    status, _, answer = await upload.run(app)
    assert (status, answer["decision"]) == (413, "rejected")
    assert upload.log == ["recv"] * count + ["send", "send"]


async def test_a_push_turned_away_is_recorded_then_its_body_read_then_answered_429(
    served: tuple[Engine, Any],
) -> None:
    engine, app = served
    first = Upload("/push/raw", body_of(2000, "a"), stall=True)
    in_flight = asyncio.create_task(first.run(app))
    await first.reading.wait()  # its body is in flight
    over = Upload("/push/raw", body_of(2000, "b"))
    count = len(over.parts)
    recorded_first: list[bool] = []
    receive = over.receive

    async def noting() -> Message:
        recorded_first.append(engine.counts["push_overloaded"] == 1)
        return await receive()

    over.receive = noting  # type: ignore[method-assign]
    status, _, answer = await over.run(app)
    assert (status, answer["decision"]) == (429, "failed")
    assert over.log == ["recv"] * count + ["send", "send"]
    assert all(recorded_first)
    status, headers, _ = await in_flight  # the stalled first: its sender's time runs out
    assert status == 408 and headers[b"connection"] == b"close"


async def test_an_early_answers_body_that_stalls_is_answered_with_the_connection_closed(
    served: tuple[Engine, Any],
) -> None:
    _, app = served
    upload = Upload("/push/nowhere", body_of(3000), stall=True)
    status, headers, _ = await upload.run(app)  # within the 200 ms body timeout of the sender's
    assert status == 404
    assert headers[b"connection"] == b"close"


async def test_a_client_that_leaves_ends_the_drain() -> None:
    calls = 0

    async def receive() -> Message:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": b"part", "more_body": True}
        return {"type": "http.disconnect"}

    lag = LoopLag()
    assert await _drained(receive, 5.0, lag)
    assert calls == 2
    assert lag.watchers == 0  # the watch ends with the drain
