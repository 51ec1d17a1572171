"""A message whose key cannot be read: forwarded without a dedup decision (`on_missing_key: forward`,
the default), recorded and counted as fail-open, or rejected where the route says so."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client.parser import text_string_to_metric_families

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.attributes import ATTR_FENCE, ATTR_FINGERPRINT, ATTR_KEY, ATTR_ROUTE, ATTR_SOURCE_ID
from pubsub_filter.core.compare.fingerprint import raw_fingerprint
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from pubsub_filter.observability.telemetry import PrometheusText, Telemetry
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTES: list[dict[str, Any]] = [
    {"name": "games", "destination": "phase3", "key": ["payload.game_date", "payload.game_id"]},
    {"name": "by-attribute", "destination": "phase3", "key": ["attributes.id"]},
    {"name": "reports", "destination": "phase3", "key": ["payload.game_date"], "rows": "payload.players"},
    {"name": "shadow", "destination": "phase3", "key": ["payload.game_date"], "mode": "shadow"},
    {"name": "strict", "destination": "phase3", "key": ["payload.game_date"], "on_missing_key": "reject"},
    {
        "name": "strict-rows",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "on_missing_key": "reject",
    },
]


class World:
    def __init__(self, tmp_path: Path):
        self.prometheus = PrometheusText()
        telemetry = Telemetry(MeterProvider(metric_readers=[self.prometheus.reader]), None, self.prometheus)
        self.store = SqliteStore(tmp_path / "state.db")
        self.publisher = MemoryPublisher()
        self.recorder = MemoryRecorder()
        self.engine = Engine(parse({"routes": ROUTES}), self.store, self.publisher, self.recorder, telemetry=telemetry)

    async def send(self, route: str, data: Any, message_id: str = "m1", **attributes: str) -> Any:
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        return (
            await self.engine.handle(route, Message(raw, attributes, message_id, publish_time=1_767_225_600.0))
        ).record

    def fail_open_count(self) -> float:
        families = {f.name: f for f in text_string_to_metric_families(self.prometheus.render().decode())}
        samples = [s for s in families["pubsub_filter_fail_open"].samples if s.name.endswith("_total")]
        return sum(s.value for s in samples if s.labels == {"route": "games"})


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    yield w
    await w.store.close()


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ({"game_id": 7}, "key field payload.game_date is missing"),
        ({"game_date": None, "game_id": 7}, "key field payload.game_date is null"),
        ({"game_date": "d", "game_id": {"n": 7}}, "key field payload.game_id is an object or list, not a value"),
        ({"game_date": "d", "game_id": [7]}, "key field payload.game_id is an object or list, not a value"),
        ([1, 2], "key field payload.game_date is missing"),
    ],
)
async def test_a_message_whose_key_cannot_be_read_is_forwarded_as_it_came_and_recorded_fail_open(
    world: World, payload: Any, problem: str
) -> None:
    rec = await world.send("games", payload)
    assert rec.decision is Decision.FAIL_OPEN and rec.acked
    assert rec.reason == f"{problem}: forwarded without a dedup decision (on_missing_key: forward)"
    assert rec.extra["missing_field"] == problem.split()[2]
    assert (rec.key, rec.fence, rec.published_id) == (None, None, "1")
    [sent] = world.publisher.published
    assert sent.data == json.dumps(payload).encode()
    assert (sent.attributes[ATTR_SOURCE_ID], sent.attributes[ATTR_ROUTE]) == ("m1", "games")
    assert sent.attributes[ATTR_FINGERPRINT] == rec.fingerprint and rec.fingerprint.startswith("sha256:")
    assert ATTR_FENCE not in sent.attributes and ATTR_KEY not in sent.attributes  # no lease, no key
    assert world.fail_open_count() == 1


async def test_no_state_is_read_or_written_for_a_message_without_its_key(world: World) -> None:
    await world.send("games", {"game_id": 7})
    assert sum(world.store.ops.values()) == 0


async def test_the_redelivery_of_a_message_without_its_key_is_forwarded_again(world: World) -> None:
    first = await world.send("games", {"game_id": 7}, "m1")
    again = await world.send("games", {"game_id": 7}, "m1")  # Pub/Sub redelivers it: nothing recorded it
    assert (first.decision, again.decision) == (Decision.FAIL_OPEN, Decision.FAIL_OPEN)
    # the same source id and fingerprint on both copies: what a consumer drops the second by
    assert [p.attributes[ATTR_SOURCE_ID] for p in world.publisher.published] == ["m1", "m1"]
    assert len({p.attributes[ATTR_FINGERPRINT] for p in world.publisher.published}) == 1


async def test_a_missing_key_fails_open_on_a_key_that_is_fine_for_the_next_message(world: World) -> None:
    assert (await world.send("games", {"game_id": 7}, "m1")).decision is Decision.FAIL_OPEN
    ok = await world.send("games", {"game_date": "d", "game_id": 7}, "m2")
    assert (ok.decision, ok.key, ok.fence) == (Decision.FORWARDED, "d|7", 1)


async def test_a_missing_attribute_key_fails_open(world: World) -> None:
    rec = await world.send("by-attribute", {"v": 1}, other="x")
    assert (rec.decision, rec.extra["missing_field"]) == (Decision.FAIL_OPEN, "attributes.id")
    assert world.publisher.published[0].attributes["other"] == "x"


async def test_a_payload_key_on_a_payload_that_is_not_json_fails_open_on_its_raw_bytes(world: World) -> None:
    rec = await world.send("games", b"\x00not json")
    assert rec.decision is Decision.FAIL_OPEN
    assert rec.reason.startswith("key field payload.game_date needs a JSON payload, and this payload is not JSON")
    assert (rec.extra["payload_kind"], rec.fingerprint) == ("raw", raw_fingerprint(b"\x00not json"))


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ({"game_date": "d", "players": "none"}, "payload.players is a string, not a list of rows"),
        ({"game_date": "d", "players": {"p1": "out"}}, "payload.players is an object, not a list of rows"),
        # in JSON's words, never Python's (a NoneType, a bool)
        ({"game_date": "d", "players": None}, "payload.players is null, not a list of rows"),
        ({"game_date": "d", "players": True}, "payload.players is true, not a list of rows"),
        ({"game_date": "d", "players": 2.5}, "payload.players is a number, not a list of rows"),
        ({"game_date": "d"}, "payload.players is missing from the payload"),
    ],
)
async def test_rows_that_are_not_a_list_fail_open_and_forward_the_whole_payload(
    world: World, payload: Any, problem: str
) -> None:
    rec = await world.send("reports", payload)
    assert rec.decision is Decision.FAIL_OPEN and rec.reason.startswith(problem + ": forwarded without")
    assert (rec.extra["missing_field"], rec.key, rec.fence) == ("payload.players", None, None)
    data = json.dumps(payload).encode()
    assert rec.fingerprint == raw_fingerprint(data) and rec.extra["payload_kind"] == "raw"
    assert [p.data for p in world.publisher.published] == [data]
    assert sum(world.store.ops.values()) == 0


async def test_a_shadow_route_forwards_a_message_without_its_key_and_acks_it(world: World) -> None:
    rec = await world.send("shadow", {"v": 1})
    assert (rec.decision, rec.enforced, rec.acked) == (Decision.FAIL_OPEN, False, True)
    assert len(world.publisher.published) == 1


async def test_a_failed_forward_of_a_message_without_its_key_is_nacked(world: World) -> None:
    world.publisher.fail = True
    rec = await world.send("games", {"game_id": 7})
    assert (rec.decision, rec.acked, rec.extra["cause"]) == (Decision.FAILED, False, "publish")
    assert rec.reason.startswith("key field payload.game_date is missing: forwarded without a dedup decision")
    assert sum(world.store.ops.values()) == 0


@pytest.mark.parametrize(
    ("route", "payload", "reason"),
    [
        ("strict", {"v": 1}, "key field payload.game_date is missing"),
        ("strict", b"\x00", "key field payload.game_date needs a JSON payload, and this payload is not JSON"),
        ("strict-rows", {"game_date": "d", "players": 3}, "payload.players is a number, not a list of rows"),
    ],
)
async def test_a_route_that_says_reject_rejects_a_message_without_its_key(
    world: World, route: str, payload: Any, reason: str
) -> None:
    rec = await world.send(route, payload)
    assert (rec.decision, rec.reason, rec.acked) == (Decision.REJECTED, reason, False)
    assert world.publisher.published == []


async def test_the_decision_line_of_a_message_without_its_key_names_the_field(world: World) -> None:
    # structlog's capture: whichever way an earlier test left the library's loggers routed
    with structlog.testing.capture_logs() as logs:
        await world.send("games", {"game_id": 7})
    [line] = [e for e in logs if e["event"] == "decision"]
    assert line["log_level"] == "error"
    assert line["missing_field"] == "payload.game_date"
    assert line["reason"].startswith("key field payload.game_date is missing")
