"""Field paths: what `check` accepts is exactly what resolves, on every message, with no exception.

A list index is a segment of ASCII digits; any other segment is an object key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import ConfigError, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.paths import MISSING, PathError, list_index
from pubsub_filter.core.paths import Path as FieldPath
from pubsub_filter.push.app import create_app
from tests.support.fakes import MemoryPublisher, MemoryRecorder


def route(**kw: Any) -> dict[str, Any]:
    return {"name": "r", "destination": "phase3", "key": ["payload.game_date"], **kw}


async def push(tmp_path: Path, raw_route: dict[str, Any], payload: Any) -> httpx.Response:
    cfg = parse({"routes": [raw_route]})
    store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors)
    engine = Engine(cfg, store, MemoryPublisher(), MemoryRecorder())
    transport = httpx.ASGITransport(app=create_app(engine), raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://filter") as client:
            return await client.post("/push/r", content=make_envelope(json.dumps(payload).encode(), "m1"))
    finally:
        await engine.store.close()


@pytest.mark.parametrize(
    ("segment", "index"), [("0", 0), ("12", 12), ("007", 7), ("²", None), ("٣", None), ("x", None)]
)
def test_a_list_index_is_ascii_digits_only(segment: str, index: int | None) -> None:
    assert list_index(segment) == index


def test_a_superscript_digit_on_a_list_is_missing_not_an_exception() -> None:
    assert FieldPath.parse("payload.items.²").resolve({"items": ["a", "b", "c"]}, {}) is MISSING


def test_a_superscript_digit_is_an_object_key() -> None:
    assert FieldPath.parse("payload.items.²").resolve({"items": {"²": "squared"}}, {}) == "squared"


async def test_a_key_path_with_a_superscript_digit_answers_400_on_a_list_not_500(tmp_path: Path) -> None:
    r = await push(tmp_path, route(key=["payload.items.²"], on_missing_key="reject"), {"items": ["a"]})
    assert r.status_code == 400 and "is missing" in r.json()["reason"]


async def test_a_rows_path_with_a_superscript_digit_answers_400_on_a_list_not_500(tmp_path: Path) -> None:
    raw = route(rows="payload.pages.²", row_key=["id"], rows_mode="changed", on_missing_key="reject")
    r = await push(tmp_path, raw, {"game_date": "d", "pages": [[{"id": 1}]]})
    assert r.status_code == 400 and "missing" in r.json()["reason"]


@pytest.mark.parametrize("text", ["payload.items.-1.id", "payload.items.-0"])
def test_a_negative_list_index_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse({"routes": [route(key=[text])]})
    assert exc.value.problems == [
        f"route 'r': key[0]: {text!r}: list indexes count from 0 at the start; {text.split('.')[2]!r} is not supported"
    ]


def test_a_bracketed_list_index_is_a_config_error() -> None:
    with pytest.raises(PathError, match=r"payload\.players\.0\.id"):
        FieldPath.parse("payload.players[0].id")


def test_an_ascii_index_reaches_into_a_list() -> None:
    assert FieldPath.parse("payload.players.1.id").resolve({"players": [{"id": 1}, {"id": 2}]}, {}) == 2
