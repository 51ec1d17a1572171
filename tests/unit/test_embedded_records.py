"""The embedded default's decision records: a decision is in `skip-rate` as soon as the
push has answered (the README's quick start runs a curl, then skip-rate, at once)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
import pytest

from pubsub_filter.backends.records.inline import InlineSqliteRecorder
from pubsub_filter.cli import main
from pubsub_filter.core.config.schema import load
from pubsub_filter.push.app import create_app
from pubsub_filter.runtime.wiring import make_engine

ROOT = Path(__file__).resolve().parents[2]


async def test_a_decision_is_in_skip_rate_as_soon_as_the_push_answered(
    quick_start: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = make_engine(load(str(quick_start)))
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://filter"
        ) as client:
            body = (ROOT / "examples" / "push-injury.json").read_bytes()
            answer = await client.post("/push/injury-report", content=body)
            assert answer.json()["decision"] == "forwarded"
            # no flush, no close, no wait: the next command a user types
            assert main(["skip-rate", "--format", "json"]) == 0
        (row,) = json.loads(capsys.readouterr().out.splitlines()[-1])  # after the decision log line
        assert (row["route"], row["total"], row["forwarded"]) == ("injury-report", 1, 1)
    finally:
        await engine.recorder.close()
        await engine.publisher.close()
        await engine.store.close()


async def test_a_failed_inline_write_is_retried_off_the_request_path_not_lost(quick_start: Path) -> None:
    engine = make_engine(load(str(quick_start)))
    recorder = engine.recorder
    assert isinstance(recorder, InlineSqliteRecorder)
    recorder.sink._db.close()  # the inline connection fails from now on
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://filter"
        ) as client:
            body = (ROOT / "examples" / "push-injury.json").read_bytes()
            assert (await client.post("/push/injury-report", content=body)).status_code == 200
        assert recorder.deferred == 1
    finally:
        await recorder.close()
        await engine.publisher.close()
        await engine.store.close()
    db = sqlite3.connect(quick_start.parent / "filter-decisions.db")
    try:
        assert db.execute("SELECT route, decision FROM decisions").fetchall() == [("injury-report", "forwarded")]
    finally:
        db.close()
