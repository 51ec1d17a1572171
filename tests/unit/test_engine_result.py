"""`Engine.handle` returns one value: the record, what the send returned, and a redelivery's kept result."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, KeyState, Message
from pubsub_filter.core.ports import Worked
from pubsub_filter.inprocess import Filter, Forward
from pubsub_filter.inprocess.body import BodySender
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder, PassingStore

ROUTE = "reports"


class CountingStore(PassingStore):
    """The sqlite store, counting its reads."""

    def __init__(self, inner: SqliteStore) -> None:
        super().__init__(inner)
        self.reads = 0

    async def read(self, route: str, key: str) -> KeyState | None:
        self.reads += 1
        return await self.inner.read(route, key)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return parse(
        {
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "routes": [{"name": ROUTE, "destination": "phase3", "key": ["payload.game"], "cache_result": True}],
        }
    )


def message(status: str, message_id: str) -> Message:
    return Message(json.dumps({"game": "g1", "status": status}).encode(), {}, message_id)


async def test_a_publish_is_handed_back_with_its_record_and_a_suppression_sends_nothing(config: Config) -> None:
    store = SqliteStore(config.store.path)  # type: ignore[arg-type]
    engine = Engine(config, store, MemoryPublisher(), MemoryRecorder(), ManualClock(time.time()))
    forwarded = await engine.handle(ROUTE, message("out", "m1"))
    suppressed = await engine.handle(ROUTE, message("out", "m2"))
    await store.close()
    assert (forwarded.record.decision, forwarded.sent, forwarded.kept) == (Decision.FORWARDED, "1", None)
    assert (suppressed.record.decision, suppressed.sent, suppressed.kept) == (Decision.SUPPRESSED, None, None)


async def test_a_redelivery_carries_the_result_kept_with_its_forward_from_the_state_it_was_decided_on(
    config: Config,
) -> None:
    store = CountingStore(SqliteStore(config.store.path))  # type: ignore[arg-type]
    f = Filter(Engine(config, store, None, MemoryRecorder(), ManualClock(time.time())))  # type: ignore[arg-type]

    async def body(forward: Forward) -> dict[str, str]:
        return {"handled": forward.attributes["filter_source_message_id"]}

    first = await f.process(ROUTE, message("out", "m1"), body)
    reads = store.reads
    again = await f.process(ROUTE, message("out", "m1"), body)  # Pub/Sub redelivers m1
    await f.close()
    assert (first.ran, first.result, first.cached) == (True, {"handled": "m1"}, False)
    assert (again.decision, again.ran, again.result, again.cached) == (
        Decision.DUPLICATE,
        False,
        {"handled": "m1"},
        True,
    )
    assert store.reads - reads == 1  # the look the decision was taken on, and no second read for the result


async def test_the_body_sender_holds_nothing_of_a_call_its_worked_carries_what_the_body_returned(
    config: Config,
) -> None:
    store = SqliteStore(config.store.path)  # type: ignore[arg-type]
    engine = Engine(config, store, None, MemoryRecorder(), ManualClock(time.time()))

    returned = object()  # not JSON: committed without it

    async def body(forward: Forward) -> object:
        return returned

    sender = BodySender(ROUTE, body, cache=True)
    handled = await engine.handle(ROUTE, message("out", "m1"), via=sender)
    await store.close()
    assert isinstance(handled.sent, Worked)
    assert (handled.sent.returned, handled.sent.result) == (returned, None)
    assert handled.sent.unkept is not None and "not JSON-encodable" in handled.sent.unkept
    assert vars(sender).keys() == {"route", "body", "cache"}


async def test_the_engine_is_the_one_registry_of_calls_in_flight_and_the_filter_waits_on_it(config: Config) -> None:
    engine = Engine(config, SqliteStore(config.store.path), None, MemoryRecorder(), ManualClock(time.time()))  # type: ignore[arg-type]
    f = Filter(engine)
    entered, release = asyncio.Event(), asyncio.Event()
    inside: list[bool] = []

    async def body(forward: Forward) -> None:
        inside.append(engine.deciding_here())
        entered.set()
        await release.wait()

    call = asyncio.create_task(f.process(ROUTE, message("out", "m1"), body))
    await entered.wait()
    assert len(engine.under_way()) == 1 and not engine.deciding_here()  # the call's, seen from another task
    closing = asyncio.create_task(f.close())
    for _ in range(20):  # loop steps, not time: nothing else is waited on
        await asyncio.sleep(0)
    assert not closing.done()  # waiting on the engine's decision under way
    release.set()
    await closing
    assert (await call).ran and inside == [True] and engine.under_way() == set()
