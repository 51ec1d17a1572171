"""A message whose forward Pub/Sub could not take (more than 100 attributes once the filter's own
are added, a name over 256 bytes, a value over 1,024) is rejected before anything is claimed or
published: one clear `rejected` decision (push answers 400; a dead-letter policy takes it), never
a publish that fails on every delivery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from filter.backends.stores.guard import GuardedStore
from filter.backends.stores.sqlite import SqliteStore
from filter.core.attributes import MAX_ATTRIBUTES, OWN_ATTRIBUTES, own_attributes_at_most
from filter.core.config import parse
from filter.core.engine import Engine
from filter.core.model import Decision, Message
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTES = [
    {"name": "whole", "destination": "phase3", "key": ["payload.game"]},
    {
        "name": "rows",
        "destination": "phase3",
        "key": ["payload.game"],
        "rows": "payload.players",
        "row_key": ["id"],
        "rows_mode": "changed",
    },
]


@pytest.fixture
async def engine(tmp_path: Path) -> Engine:
    cfg = parse({"routes": ROUTES})
    store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors)
    return Engine(cfg, store, MemoryPublisher(), MemoryRecorder(), ManualClock(), "one")


def published(engine: Engine) -> list[dict[str, str]]:
    assert isinstance(engine.publisher, MemoryPublisher)
    return [p.attributes for p in engine.publisher.published]


def message(attributes: dict[str, str], message_id: str = "m1") -> Message:
    payload = {"game": "g1", "players": [{"id": 1, "status": "out"}]}
    return Message(json.dumps(payload).encode(), attributes, message_id, publish_time=1.0)


def producer_attributes(count: int) -> dict[str, str]:
    return {f"a{i:03d}": "v" for i in range(count)}


@pytest.mark.parametrize("route", ["whole", "rows"])
async def test_a_message_whose_forward_would_carry_more_than_100_attributes_is_rejected_unpublished(
    engine: Engine, route: str
) -> None:
    room = MAX_ATTRIBUTES - own_attributes_at_most(engine.config.route(route))  # type: ignore[arg-type]
    rec = await engine.handle(route, message(producer_attributes(room + 1)))
    assert rec.decision is Decision.REJECTED
    assert rec.reason == (
        f"the message has {room + 1} attributes; with the filter's own (up to {MAX_ATTRIBUTES - room} on this "
        f"route) its forward could carry more than Pub/Sub's {MAX_ATTRIBUTES}: at most {room} can be forwarded"
    )
    assert published(engine) == []
    assert await engine.store.read(route, "g1") is None  # nothing claimed


@pytest.mark.parametrize("route", ["whole", "rows"])
async def test_a_message_with_as_many_attributes_as_fit_is_forwarded_with_them_all(engine: Engine, route: str) -> None:
    room = MAX_ATTRIBUTES - own_attributes_at_most(engine.config.route(route))  # type: ignore[arg-type]
    attributes = producer_attributes(room)
    rec = await engine.handle(route, message(attributes))
    assert rec.decision is Decision.FORWARDED
    [sent] = published(engine)
    assert attributes.items() <= sent.items()
    assert len(sent) <= MAX_ATTRIBUTES - 1  # room left for the trace context a traced publisher adds


async def test_the_producers_own_copies_of_the_filters_attributes_do_not_count(engine: Engine) -> None:
    room = MAX_ATTRIBUTES - own_attributes_at_most(engine.config.route("whole"))  # type: ignore[arg-type]
    attributes = {**producer_attributes(room), **dict.fromkeys(OWN_ATTRIBUTES, "forged")}
    assert (await engine.handle("whole", message(attributes))).decision is Decision.FORWARDED


@pytest.mark.parametrize(
    ("attributes", "reason"),
    [
        (
            {"k" * 257: "v"},
            "attribute name 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk...' is 257 bytes: Pub/Sub takes at most 256",
        ),
        ({"é" * 129: "v"}, "is 258 bytes: Pub/Sub takes at most 256"),
        ({"note": "v" * 1025}, "attribute 'note' has a value of 1025 bytes: Pub/Sub takes at most 1024"),
    ],
)
async def test_an_attribute_pubsub_would_refuse_is_rejected_unpublished(
    engine: Engine, attributes: dict[str, str], reason: str
) -> None:
    rec = await engine.handle("whole", message(attributes))
    assert rec.decision is Decision.REJECTED
    assert rec.reason is not None and reason in rec.reason
    assert published(engine) == []


async def test_a_name_and_value_at_pubsubs_limits_are_forwarded(engine: Engine) -> None:
    attributes = {"k" * 256: "v" * 1024}
    assert (await engine.handle("whole", message(attributes))).decision is Decision.FORWARDED
    assert attributes.items() <= published(engine)[0].items()
