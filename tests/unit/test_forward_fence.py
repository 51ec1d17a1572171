"""What a forward carries for destination-side fencing: its fence and its key, written only by the filter."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.attributes import ATTRIBUTE_LIMIT
from pubsub_filter.core.compare.fingerprint import message_fingerprint
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTES = [
    {"name": "reports", "destination": "phase3", "key": ["payload.game"]},
    {"name": "shadow", "destination": "phase3", "key": ["payload.game"], "mode": "shadow"},
]


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    cfg = parse({"routes": ROUTES})
    store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors)
    return Engine(cfg, store, MemoryPublisher(), MemoryRecorder(), ManualClock(), "one")


def published(engine: Engine) -> list[dict[str, str]]:
    assert isinstance(engine.publisher, MemoryPublisher)
    return [p.attributes for p in engine.publisher.published]


def message(game: str, version: int, message_id: str, attributes: dict[str, str] | None = None) -> Message:
    return Message(json.dumps({"game": game, "v": version}).encode(), attributes or {}, message_id)


async def test_a_forward_carries_its_fence_and_key(engine: Engine) -> None:
    await engine.handle("reports", message("g1", 1, "m1"))
    rec = (await engine.handle("reports", message("g1", 2, "m2"))).record
    assert [(a["filter_fence"], a["filter_key"]) for a in published(engine)] == [("1", "g1"), ("2", "g1")]
    assert rec.fence == 2


async def test_a_key_longer_than_an_attribute_value_goes_as_its_sha256(engine: Engine) -> None:
    key = "é" * 600  # 1,200 bytes in UTF-8, 600 characters
    await engine.handle("reports", message(key, 1, "m1"))
    [attributes] = published(engine)
    assert "filter_key" not in attributes
    assert attributes["filter_key_sha256"] == hashlib.sha256(key.encode()).hexdigest()


async def test_a_key_of_exactly_the_attribute_limit_goes_as_itself(engine: Engine) -> None:
    key = "k" * ATTRIBUTE_LIMIT
    await engine.handle("reports", message(key, 1, "m1"))
    [attributes] = published(engine)
    assert attributes["filter_key"] == key and "filter_key_sha256" not in attributes


async def test_a_producers_own_fence_and_key_attributes_are_dropped(engine: Engine) -> None:
    forged = {"filter_fence": "999999", "filter_key": "other", "filter_key_sha256": "ab", "source": "nbac"}
    rec = (await engine.handle("reports", message("g1", 1, "m1", forged))).record
    [attributes] = published(engine)
    assert (attributes["filter_fence"], attributes["filter_key"], attributes["source"]) == ("1", "g1", "nbac")
    assert "filter_key_sha256" not in attributes
    # the message fingerprint is still the incoming message's, forged attributes included
    assert rec.message_fingerprint == message_fingerprint(message("g1", 1, "m1", forged).data, forged)


async def test_a_forward_without_a_lease_carries_no_fence(engine: Engine) -> None:
    await engine.handle("shadow", message("g1", 1, "m1"))
    rec = (
        await engine.handle("shadow", message("g1", 1, "m2", {"filter_fence": "7"}))
    ).record  # unchanged: shadow forwards
    assert rec.decision is Decision.SUPPRESSED and rec.published_id is not None
    assert ["filter_fence" in a for a in published(engine)] == [True, False]
