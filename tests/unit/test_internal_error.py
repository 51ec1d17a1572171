"""A bug met on one message (anything the filter itself raises while deciding it) is a recorded
`failed` decision, cause `internal`: answered 500 so Pub/Sub retries it and in time dead-letters
it, counted in the records and logged with its traceback, never an answer nothing recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.model import Cause, Decision
from tests.support.fakes import MemoryRecorder
from tests.support.jsonlogs import production_logs
from tests.support.push_client import engine_on_sqlite, push_client

ROUTES = {"routes": [{"name": "reports", "destination": "phase3", "key": ["payload.game_date"]}]}


def body(day: str, message_id: str) -> bytes:
    return make_envelope(json.dumps({"game_date": day}).encode(), message_id)


async def test_a_message_the_filter_raises_on_is_recorded_failed_and_answered_500_and_others_still_flow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = RouteRules.bypassed

    def bypassed(self: RouteRules, payload: Any, attributes: Any) -> bool:
        if payload.get("game_date") == "bad":
            raise ZeroDivisionError("division by zero")
        return plain(self, payload, attributes)

    monkeypatch.setattr(RouteRules, "bypassed", bypassed)
    engine = engine_on_sqlite(tmp_path, ROUTES)
    with production_logs() as logs:  # the JSON lines `serve` writes
        async with push_client(engine) as client:
            failed = await client.post("/push/reports", content=body("bad", "1"))
            fine = await client.post("/push/reports", content=body("2025-01-10", "2"))
    [traceback] = logs.tracebacks
    assert '"message":"decision_raised"' in traceback and "ZeroDivisionError: division by zero" in traceback
    assert (failed.status_code, failed.json()["decision"]) == (500, "failed")
    assert failed.json()["reason"] == "internal error: ZeroDivisionError: division by zero"
    assert (fine.status_code, fine.json()["decision"]) == (200, "forwarded")
    recorder = engine.recorder
    assert isinstance(recorder, MemoryRecorder)
    [rec, _] = recorder.records
    assert (rec.decision, rec.cause, rec.message_id) == (Decision.FAILED, Cause.INTERNAL, "1")
