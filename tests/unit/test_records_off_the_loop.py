"""A records file someone else holds locked (a retention `DELETE`, an open `sqlite3` shell)
holds up neither the event loop nor the requests: the inline records commit runs on a
writer thread, waits for the lock only briefly, and hands what it could not write to the
batching recorder, which writes it once the lock is gone. Nothing is lost."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from pubsub_filter.backends.records.inline import InlineSqliteRecorder
from pubsub_filter.core.config.schema import load
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.push.app import create_app
from pubsub_filter.runtime.wiring import make_engine
from tests.support.asgi import call

ROOT = Path(__file__).resolve().parents[2]
REPORT = json.loads((ROOT / "examples" / "injury-report.json").read_bytes())
PROMPT = 0.1  # seconds: what "at once" means for an answer here


def report_of(day: str, message_id: str) -> bytes:
    """The example injury report for another game day: a key of its own."""
    return make_envelope(json.dumps({**REPORT, "game_date": day}).encode(), message_id)


async def timed(app: Any, started: float, method: str, path: str, body: bytes = b"") -> tuple[int, float]:
    """(status, seconds from `started` to the answer) of one request."""
    status, _ = await call(app, method, path, body)
    return status, time.perf_counter() - started


def stored(db_path: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(db_path)
    try:
        return sorted(db.execute("SELECT message_id, decision FROM decisions").fetchall())
    finally:
        db.close()


async def test_a_locked_records_file_holds_up_neither_healthz_nor_a_push_and_loses_nothing(quick_start: Path) -> None:
    engine = make_engine(load(str(quick_start)))
    app = create_app(engine)
    records = quick_start.parent / "filter-decisions.db"
    recorder = engine.recorder
    assert isinstance(recorder, InlineSqliteRecorder)
    holder = sqlite3.connect(records, isolation_level=None)
    try:
        assert (await call(app, "POST", "/push/injury-report", report_of("2025-01-01", "before")))[0] == 200
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the file's write lock from now on
        record = recorder.record
        probes: list[asyncio.Task[tuple[int, float]]] = []
        started = 0.0

        def record_then_probe(rec: Any) -> None:
            """`/healthz` asked the moment a push's record is made, while its write is under way."""
            record(rec)
            probes.append(asyncio.create_task(timed(app, started, "GET", "/healthz")))

        recorder.record = record_then_probe  # type: ignore[method-assign]
        for n in range(3):
            started = time.perf_counter()
            body = report_of(f"2025-02-0{n + 1}", f"m{n}")
            push_status, push_took = await timed(app, started, "POST", "/push/injury-report", body)
            health_status, health_took = await probes[n]
            assert (push_status, health_status) == (200, 200)
            assert push_took < PROMPT and health_took < PROMPT, (push_took, health_took)
        recorder.record = record  # type: ignore[method-assign]
        assert recorder.deferred == 3  # each handed to the batched path
        holder.execute("ROLLBACK")
        await recorder.flush()
        assert stored(records) == [("before", "forwarded")] + [(f"m{n}", "forwarded") for n in range(3)]
    finally:
        holder.close()
        await engine.close()
