"""The one probe builder: what a surface adds to `/healthz` and `/readyz`, and what it does not."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Message
from pubsub_filter.runtime.probes import probe_routes
from tests.support.fakes import MemoryPublisher, MemoryRecorder


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    cfg = parse({"routes": [{"name": "r", "destination": "phase3", "key": ["payload.k"]}]})
    store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors)
    yield Engine(cfg, store, MemoryPublisher(), MemoryRecorder())
    await store.close()


async def probe(engine: Engine, path: str, **given: Any) -> tuple[int, dict[str, Any]]:
    transport = httpx.ASGITransport(app=Starlette(routes=probe_routes(engine, **given)))
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as client:
        resp = await client.get(path)
    return resp.status_code, resp.json()


async def test_without_a_surfaces_own_state_the_probes_answer_for_the_engine_alone(engine: Engine) -> None:
    status, body = await probe(engine, "/healthz")
    assert (status, list(body), body["status"]) == (200, ["status", "in_flight", "counts"], "ok")
    assert await probe(engine, "/readyz") == (200, {"status": "ready"})


async def test_a_failure_is_503_failed_with_the_surfaces_fields_then_the_failures(engine: Engine) -> None:
    def failure() -> Mapping[str, Any]:
        return {"error": "stream ended"}

    status, body = await probe(engine, "/healthz", fields=lambda: {"handled": 2}, failure=failure)
    assert status == 503
    assert list(body) == ["status", "in_flight", "counts", "handled", "error"]
    assert (body["status"], body["handled"], body["error"]) == ("failed", 2, "stream ended")


async def test_a_surface_that_is_not_ready_makes_readyz_503_naming_why(engine: Engine) -> None:
    status, body = await probe(engine, "/readyz", not_ready=lambda: {"streams": "not open yet"})
    assert (status, body) == (503, {"status": "unavailable", "streams": "not open yet"})


async def test_healthz_counts_the_decisions_made_so_far_by_decision(engine: Engine) -> None:
    same, changed = b'{"k": 1}', b'{"k": 1, "v": 2}'
    for data, message_id in [(same, "m1"), (same, "m1"), (same, "m2"), (changed, "m3")]:
        await engine.handle("r", Message(data, {}, message_id, None))
    status, body = await probe(engine, "/healthz")
    assert status == 200
    assert body["counts"] == {"forwarded": 2, "duplicate": 1, "suppressed": 1}
