"""The push endpoint under a real server, driven by a raw socket: clients that stall or vanish mid-body."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision
from pubsub_filter.push.app import create_app
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.net import free_port
from tests.support.polling import eventually, wait_until
from tests.support.serve import ServeProcess, write_config

ROUTE = {"name": "reports", "destination": "phase3", "key": ["payload.game_date"]}
# Declares 1,000 bytes of body and sends 11 of them.
HALF_SENT = (
    b"POST /push/reports HTTP/1.1\r\nHost: filter\r\nContent-Type: application/json\r\n"
    b'Content-Length: 1000\r\n\r\n{"message":'
)


class Served:
    def __init__(self, engine: Engine, port: int) -> None:
        self.engine, self.port = engine, port


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """`create_app` under uvicorn on a free port, in this event loop, with a 0.3 s body timeout."""
    cfg = parse({"routes": [ROUTE]})
    store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors)
    engine = Engine(cfg, store, MemoryPublisher(), MemoryRecorder())
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(engine, body_timeout=0.3),
            host="127.0.0.1",
            port=port,
            lifespan="off",
            access_log=False,
            log_level="warning",
        )
    )
    task = asyncio.create_task(server.serve())

    def started() -> bool:  # uvicorn says so by a flag only
        assert not task.done(), task.exception()
        return server.started

    await eventually(started, 10, "uvicorn did not start")
    try:
        yield Served(engine, port)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        await store.close()


async def test_a_half_sent_body_is_answered_408_and_recorded_as_rejected(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        writer.write(HALF_SENT)
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 5)
        rest = await asyncio.wait_for(reader.read(), 5)  # EOF: the server closed the connection
    finally:
        writer.close()
    assert status.startswith(b"HTTP/1.1 408 "), status
    body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert body == {"decision": "rejected", "reason": "body not received in full within 0.3s"}
    recorder = served.engine.recorder
    assert isinstance(recorder, MemoryRecorder)
    assert [(r.decision, r.route) for r in recorder.records] == [(Decision.REJECTED, "reports")]


async def test_a_whole_body_is_still_decided_under_the_body_timeout(served: Served) -> None:
    body = json.dumps(
        {
            "message": {"data": "eyJnYW1lX2RhdGUiOiAiZDEifQ==", "messageId": "1"},
            "subscription": "projects/p/subscriptions/s",
        }
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        writer.write(b"POST /push/reports HTTP/1.1\r\nHost: filter\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()
    assert status.startswith(b"HTTP/1.1 200 "), status


def test_a_client_that_disconnects_mid_body_logs_one_json_line_and_no_traceback(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "filter.yaml",
        {
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "publisher": {"backend": "outbox", "path": str(tmp_path / "outbox.jsonl")},
            "records": {"backend": "sqlite", "path": str(tmp_path / "decisions.db")},
            "routes": [ROUTE],
        },
    )
    log = tmp_path / "serve.log"
    with ServeProcess(config, log) as proc:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=5) as s:
            s.sendall(HALF_SENT)
        wait_until(
            lambda: any(e.get("message") == "push_client_disconnected" for e in proc.events()),
            10,
            lambda: f"no push_client_disconnected line:\n{proc.tail()}",
        )
    # stopped: everything it wrote is in the log
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    not_json = [line for line in lines if not line.startswith("{")]
    assert not_json == [], "\n".join(lines)
    events = [json.loads(line) for line in lines]
    disconnected = [e for e in events if e["message"] == "push_client_disconnected"]
    assert len(disconnected) == 1 and disconnected[0]["route"] == "reports"
    assert not any("exception" in e for e in events)
    assert not any(e["message"] == "decision" for e in events)  # nothing was decided: Pub/Sub sends it again
