"""A message whose forward Pub/Sub could not take (more than 100 attributes once the filter's own
are added, a name over 256 bytes, a value over 1,024) is rejected before anything is claimed or
published: one clear `rejected` decision (push answers 400; a dead-letter policy takes it), never
a publish that fails on every delivery. A forward over Pub/Sub's 10 MB Publish request is
rejected the same way, sized just before it is sent (the lease taken for it is released)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.attributes import (
    MAX_ATTRIBUTES,
    OWN_ATTRIBUTES,
    fence_attributes,
    forward_attributes,
    unpublishable,
)
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.answer import answer_for
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from pubsub_filter.core.pubsub_limits import PUBLISH_REQUEST_LIMIT
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTES = [
    {"name": "whole", "destination": "phase3", "key": ["payload.game"]},
    {"name": "shadow", "destination": "phase3", "key": ["payload.game"], "exclude": ["pad"], "mode": "shadow"},
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
    room = MAX_ATTRIBUTES - RouteRules(engine.config.route(route)).own_attributes_at_most  # type: ignore[arg-type]
    rec = (await engine.handle(route, message(producer_attributes(room + 1)))).record
    assert rec.decision is Decision.REJECTED
    assert rec.reason == (
        f"the message has {room + 1} attributes; with the filter's own (up to {MAX_ATTRIBUTES - room} on this "
        f"route) its forward could carry more than Pub/Sub's {MAX_ATTRIBUTES}: at most {room} can be forwarded"
    )
    assert published(engine) == []
    assert await engine.store.read(route, "g1") is None  # nothing claimed


@pytest.mark.parametrize("route", ["whole", "rows"])
async def test_a_message_with_as_many_attributes_as_fit_is_forwarded_with_them_all(engine: Engine, route: str) -> None:
    room = MAX_ATTRIBUTES - RouteRules(engine.config.route(route)).own_attributes_at_most  # type: ignore[arg-type]
    attributes = producer_attributes(room)
    rec = (await engine.handle(route, message(attributes))).record
    assert rec.decision is Decision.FORWARDED
    [sent] = published(engine)
    assert attributes.items() <= sent.items()
    assert len(sent) <= MAX_ATTRIBUTES - 1  # room left for the trace context a traced publisher adds


async def test_the_producers_own_copies_of_the_filters_attributes_do_not_count(engine: Engine) -> None:
    room = MAX_ATTRIBUTES - RouteRules(engine.config.route("whole")).own_attributes_at_most  # type: ignore[arg-type]
    attributes = {**producer_attributes(room), **dict.fromkeys(OWN_ATTRIBUTES, "forged")}
    assert (await engine.handle("whole", message(attributes))).record.decision is Decision.FORWARDED


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
    rec = (await engine.handle("whole", message(attributes))).record
    assert rec.decision is Decision.REJECTED
    assert rec.reason is not None and reason in rec.reason
    assert published(engine) == []


async def test_a_name_and_value_at_pubsubs_limits_are_forwarded(engine: Engine) -> None:
    attributes = {"k" * 256: "v" * 1024}
    assert (await engine.handle("whole", message(attributes))).record.decision is Decision.FORWARDED
    assert attributes.items() <= published(engine)[0].items()


# --- the size of the forward ---------------------------------------------------------------------


def sized(pad: int, message_id: str = "m1") -> Message:
    return Message(json.dumps({"game": "g1", "pad": "x" * pad}).encode(), {"a": "v"}, message_id, publish_time=1.0)


def largest_pad_that_fits(message_id: str, fence: int) -> int:
    """The pad whose forward on `whole` (under `fence`) is the largest Pub/Sub takes, found with
    the rule the engine applies (`unpublishable`) on the attributes the forward will carry."""

    def fits(pad: int) -> bool:
        msg = sized(pad, message_id)
        attributes = forward_attributes("whole", msg, "sha256:" + "0" * 64, fence_attributes("g1", fence))
        return unpublishable("phase3", msg.data, attributes, None) is None

    low, high = 0, PUBLISH_REQUEST_LIMIT
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


@pytest.mark.loop_may_block("10 MB payloads fingerprinted on the loop, each ~100 ms")
async def test_a_forward_at_pubsubs_request_limit_is_published_and_one_byte_more_is_rejected(engine: Engine) -> None:
    at_limit = sized(largest_pad_that_fits("m1", 1), "m1")
    assert (await engine.handle("whole", at_limit)).record.decision is Decision.FORWARDED
    [sent] = engine.publisher.published  # type: ignore[attr-defined]
    assert sent.data == at_limit.data
    # one byte more (fence 2: the key's next claim) is rejected, nothing published, 400 not 5xx
    over = sized(largest_pad_that_fits("m2", 2) + 1, "m2")
    rec = (await engine.handle("whole", over)).record
    assert rec.decision is Decision.REJECTED
    assert rec.reason is not None and rec.reason.startswith("cannot be forwarded: its forward would be a Publish")
    assert f"Pub/Sub takes at most {PUBLISH_REQUEST_LIMIT}" in rec.reason
    assert answer_for(rec).status == 400  # the dead-letter policy takes it
    # the same on the next delivery; the key was left free for the next message (fence 4 by then)
    assert (await engine.handle("whole", over)).record.decision is Decision.REJECTED
    assert len(published(engine)) == 1
    fits = sized(largest_pad_that_fits("m3", 4) - 1, "m3")  # other content than m1
    assert (await engine.handle("whole", fits)).record.decision is Decision.FORWARDED


@pytest.mark.loop_may_block("10 MB payloads fingerprinted on the loop, each ~100 ms")
async def test_an_unleased_forward_over_the_request_limit_is_rejected_unpublished(engine: Engine) -> None:
    """Shadow mode publishes what enforce mode would suppress, with no lease (as fail-open does)."""
    assert (await engine.handle("shadow", sized(0, "m1"))).record.decision is Decision.FORWARDED
    over = sized(largest_pad_that_fits("m2", 2) + 100, "m2")  # the same fingerprint: `pad` is excluded
    rec = (await engine.handle("shadow", over)).record
    assert rec.decision is Decision.REJECTED
    assert rec.reason is not None and "; cannot be forwarded: its forward would be a Publish request" in rec.reason
    assert len(published(engine)) == 1
