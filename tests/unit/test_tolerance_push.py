"""Tolerance through the push endpoint: a move within tolerance is acked (200) and held back; a
forward carries its flags to the destination."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.push.app import create_app
from tests.support.fakes import MemoryPublisher, MemoryRecorder


async def test_push_acks_a_move_within_tolerance_and_forwards_flags(tmp_path: Path) -> None:
    route = {
        "name": "odds",
        "destination": "phase5",
        "key": ["payload.game_id"],
        "tolerance": {"price": 12},
        "changed_attributes": ["price", "status"],
    }
    cfg = parse({"routes": [route]})
    publisher = MemoryPublisher()
    engine = Engine(cfg, GuardedStore(SqliteStore(tmp_path / "s.db"), cfg.store_errors), publisher, MemoryRecorder())
    answers = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://f") as c:
        for i, price in enumerate((100, 108, 113)):
            body = make_envelope(json.dumps({"game_id": "g1", "price": price, "status": "open"}).encode(), f"m{i}")
            r = await c.post("/push/odds", content=body)
            answers.append((r.status_code, r.json()["decision"], r.json()["reason"]))
    await engine.store.close()
    assert answers == [
        (200, "forwarded", "new key"),
        (200, "suppressed", "moved within tolerance"),
        (200, "forwarded", "content changed"),
    ]
    assert [p.attributes.get("filter_changed_price") for p in publisher.published] == ["true", "true"]
    assert "filter_changed_status" not in publisher.published[-1].attributes
