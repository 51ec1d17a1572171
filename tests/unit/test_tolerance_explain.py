"""`explain` on a route with a tolerance and changed-field flags: what it says, in words."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pubsub_filter.cli import main
from pubsub_filter.core.config.schema import load
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Message
from pubsub_filter.runtime.wiring import make_store
from tests.support.fakes import MemoryPublisher, MemoryRecorder


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "filter.yaml"
    route = {
        "name": "odds",
        "destination": "phase3",
        "key": ["payload.game_id"],
        "tolerance": {"price": 12, "total": "3%"},
        "changed_attributes": ["price", "status"],
    }
    path.write_text(yaml.safe_dump({"store": {"backend": "sqlite", "path": str(tmp_path / "s.db")}, "routes": [route]}))
    return path


async def forward(path: Path, payload: dict[str, Any]) -> None:
    cfg = load(path)
    engine = Engine(cfg, make_store(cfg), MemoryPublisher(), MemoryRecorder())
    await engine.handle("odds", Message(json.dumps(payload).encode(), {}, "m1"))
    await engine.store.close()


def explained(path: Path, payload: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    file = path.parent / "payload.json"
    file.write_text(json.dumps(payload))
    assert main(["explain", "--config", str(path), "--route", "odds", str(file)]) == 0
    return capsys.readouterr().out


def test_explain_says_which_fields_moved_within_tolerance_and_by_how_much(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(forward(config, {"game_id": "g1", "price": 100, "total": 200, "status": "open"}))
    said = explained(config, {"game_id": "g1", "price": 104, "total": 203, "status": "open"}, capsys)
    assert "decision:     suppressed: moved within tolerance" in said
    assert "price moved 4 (tolerance 12), total moved 3 (tolerance 3%)" in said


def test_explain_says_which_fields_a_forward_flags(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(forward(config, {"game_id": "g1", "price": 100, "total": 200, "status": "open"}))
    said = explained(config, {"game_id": "g1", "price": 104, "total": 200, "status": "closed"}, capsys)
    assert "decision:     forwarded: content changed" in said
    assert "flags:        filter_changed_status (changed since the last forward" in said
