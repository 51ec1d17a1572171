"""The handler decorators and the sync API on the embedded default (SQLite state and records)."""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pubsub_filter.backends.records.inline import InlineSqliteRecorder
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.errors import UnknownRouteError
from pubsub_filter.core.model import Decision, Message
from pubsub_filter.inprocess import Filter, Forward, SyncFilter
from pubsub_filter.inprocess.handlers import Nack, on_cloudevent, on_payload, on_push
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTE = "reports"


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return parse(
        {
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "records": {"backend": "sqlite", "path": str(tmp_path / "records.db")},
            "routes": [{"name": ROUTE, "destination": "phase3", "key": ["payload.game"], "exclude": ["scraped"]}],
        }
    )


@pytest.fixture
def sync(config: Config) -> Iterator[SyncFilter]:
    with SyncFilter(config) as f:
        yield f


def report(status: str, scraped: str = "09:00") -> dict[str, Any]:
    return {"game": "g1", "status": status, "scraped": scraped}


def cloudevent(data: dict[str, Any], message_id: str) -> dict[str, Any]:
    message = {
        "data": base64.b64encode(json.dumps(data).encode()).decode(),
        "attributes": {"source": "nbac"},
        "messageId": message_id,
        "publishTime": "2026-01-01T00:00:00Z",
    }
    return {"id": message_id, "type": "google.cloud.pubsub.topic.v1.messagePublished", "data": {"message": message}}


def test_a_payload_handler_runs_its_body_on_new_content_and_returns_the_outcome(sync: SyncFilter) -> None:
    @on_payload(sync, ROUTE)
    def handle(payload: Any) -> str:
        return f"processed {payload['status']}"

    outcome = handle(report("out"))
    assert (outcome.decision, outcome.ran, outcome.result) == (Decision.FORWARDED, True, "processed out")


def test_a_payload_handler_skips_its_body_when_the_content_is_unchanged_and_says_so(sync: SyncFilter) -> None:
    runs: list[Any] = []

    @on_payload(sync, ROUTE)
    def handle(payload: Any) -> None:
        runs.append(payload)

    handle(report("out", scraped="09:00"))
    again = handle(report("out", scraped="13:00"))  # only a field that never counts moved
    assert len(runs) == 1
    assert (again.skipped, again.decision, again.reason) == (True, Decision.SUPPRESSED, "unchanged since last forward")


def test_the_sync_body_runs_on_the_callers_thread(sync: SyncFilter) -> None:
    @on_payload(sync, ROUTE)
    def handle(payload: Any) -> int:
        return threading.get_ident()

    assert handle(report("out")).result == threading.get_ident()


def test_an_exception_in_a_sync_body_propagates_and_its_redelivery_runs_it_again(sync: SyncFilter) -> None:
    attempts: list[str] = []

    @on_payload(sync, ROUTE)
    def handle(payload: Any) -> None:
        attempts.append(payload["status"])
        if len(attempts) == 1:
            raise ConnectionError("the warehouse is down")

    with pytest.raises(ConnectionError, match="the warehouse is down"):
        handle(report("out"), message_id="m1")
    assert handle(report("out"), message_id="m1").ran
    assert attempts == ["out", "out"]


def test_a_push_handler_gets_the_envelope_it_was_called_with(sync: SyncFilter) -> None:
    got: list[Any] = []

    @on_push(sync, ROUTE)
    def handle(envelope: Any) -> None:
        got.append(envelope)

    body = make_envelope(json.dumps(report("out")).encode(), "m1")
    outcome = handle(body)
    assert outcome.ran and got == [body]
    assert handle(json.loads(body)).decision is Decision.DUPLICATE  # the same message id, decoded


def test_a_push_body_that_is_not_an_envelope_is_a_nack_with_a_400(sync: SyncFilter) -> None:
    @on_push(sync, ROUTE)
    def handle(envelope: Any) -> None:
        raise AssertionError("the body must not run")

    with pytest.raises(Nack) as caught:
        handle(b'{"nope": 1}')
    assert caught.value.status == 400 and caught.value.outcome.decision is Decision.REJECTED


def test_a_cloudevent_handler_skips_an_unchanged_pubsub_message(sync: SyncFilter) -> None:
    events: list[Any] = []

    @on_cloudevent(sync, ROUTE)
    def handle(event: Any) -> None:
        events.append(event["id"])

    first = handle(cloudevent(report("out", scraped="1"), "e1"))
    rerun = handle(cloudevent(report("out", scraped="2"), "e2"))
    assert events == ["e1"] and first.ran and rerun.skipped


def test_a_cloudevent_object_with_a_data_attribute_is_read_like_the_dict(sync: SyncFilter) -> None:
    @on_cloudevent(sync, ROUTE)
    def handle(event: Any) -> str:
        return str(event.data["message"]["messageId"])

    as_object = SimpleNamespace(data=cloudevent(report("out"), "e1")["data"])
    assert handle(as_object).result == "e1"


def test_a_cloudevent_that_is_not_a_pubsub_message_is_a_nack_with_a_400(sync: SyncFilter) -> None:
    @on_cloudevent(sync, ROUTE)
    def handle(event: Any) -> None:
        raise AssertionError("the body must not run")

    with pytest.raises(Nack, match="no message object") as caught:
        handle({"id": "x", "data": {"bucket": "b"}})
    assert caught.value.status == 400


async def test_other_content_for_a_key_in_flight_is_a_nack_with_a_503(config: Config) -> None:
    async with Filter.open(config) as f:

        @on_payload(f, ROUTE)
        async def handle(payload: Any) -> Any:
            if payload["status"] == "out":
                with pytest.raises(Nack) as caught:
                    await handle(report("in"))  # while "out" holds the key's lease
                return caught.value
            raise AssertionError("the contended body must not run")

        nack = (await handle(report("out"))).result
    assert nack.status == 503 and nack.outcome.decision is Decision.CONTENDED and not nack.outcome.ran


async def test_an_async_payload_handler_awaits_its_body(config: Config) -> None:
    async with Filter.open(config) as f:

        @on_payload(f, ROUTE)
        async def handle(payload: Any) -> str:
            return str(payload["status"])

        assert (await handle(report("out"))).result == "out"
        assert (await handle(report("out"))).skipped


class _CommitFails:
    """The SQLite store, whose commits raise: the body has run, the filter cannot record it."""

    def __init__(self, store: Any):
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def commit(self, *args: Any) -> bool:
        raise OSError("disk full")


async def test_a_body_whose_commit_fails_is_done_and_acked_and_the_next_copy_runs_it_again(config: Config) -> None:
    store = _CommitFails(SqliteStore(config.store.path))  # type: ignore[union-attr]
    publisher = MemoryPublisher()
    f = Filter(Engine(config, store, publisher, MemoryRecorder(), ManualClock(), "one"))
    runs: list[int | None] = []

    async def body(forward: Forward) -> None:
        runs.append(forward.fence)

    data = json.dumps(report("out")).encode()
    outcome = await f.process(ROUTE, Message(data, {}, "m1"), body)
    assert (outcome.decision, outcome.ran, outcome.acked, outcome.committed) == (Decision.FORWARDED, True, True, False)
    f.engine.clock.advance(config.lease.duration + 1)  # type: ignore[attr-defined]
    again = await f.process(ROUTE, Message(data, {}, "m2"), body)
    assert again.ran and runs == [1, 2]
    assert publisher.published == []  # in-process, nothing is ever published


async def test_a_shadow_route_runs_the_body_for_unchanged_content_and_records_the_suppression(tmp_path: Path) -> None:
    cfg = parse(
        {
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "records": {"backend": "sqlite", "path": str(tmp_path / "records.db")},
            "routes": [{"name": ROUTE, "destination": "phase3", "key": ["payload.game"], "mode": "shadow"}],
        }
    )
    fences: list[int | None] = []

    async def body(forward: Forward) -> None:
        fences.append(forward.fence)

    async with Filter.open(cfg) as f:
        data = json.dumps(report("out")).encode()
        await f.process(ROUTE, Message(data, {}, "m1"), body)
        again = await f.process(ROUTE, Message(data, {}, "m2"), body)

    assert (again.decision, again.ran, again.acked, again.committed) == (Decision.SUPPRESSED, True, True, False)
    assert fences == [1, None]  # the would-be suppression ran without a lease


def test_decorating_a_handler_for_a_route_the_config_lacks_fails_at_decoration_naming_the_routes(
    sync: SyncFilter,
) -> None:
    with pytest.raises(UnknownRouteError, match=r"unknown route 'no-such-route'.*reports"):

        @on_payload(sync, "no-such-route")
        def handle(payload: Any) -> None:
            raise AssertionError("the body must not run")


def committed_decisions(path: Path) -> list[tuple[str, str]]:
    """(message_id, decision) of the committed records, read as `skip-rate` reads: another connection."""
    db = sqlite3.connect(path)
    try:
        return sorted(db.execute("SELECT message_id, decision FROM decisions").fetchall())
    finally:
        db.close()


async def test_an_async_handler_raises_its_nack_for_an_unreadable_body_only_once_the_rejection_is_committed(
    config: Config,
) -> None:
    async with Filter.open(config) as f:
        recorder = f.engine.recorder
        assert isinstance(recorder, InlineSqliteRecorder)
        # Two records in one step: the recorder then expects company, and the next record waits for its step's commit.
        await asyncio.gather(
            f.engine.reject(ROUTE, None, "company", message_id="company-1"),
            f.engine.reject(ROUTE, None, "company", message_id="company-2"),
        )

        @on_push(f, ROUTE)
        async def handle(envelope: Any) -> None:
            raise AssertionError("the body must not run")

        with pytest.raises(Nack):
            await handle(b'{"message": {"messageId": "bad-1", "data": "!!"}}')
        # Nothing awaited since the Nack: what is committed now is what a crash here would leave.
        assert ("bad-1", "rejected") in committed_decisions(config.records.path)


def test_a_sync_handler_records_its_rejection_on_the_filters_loop_thread_not_the_callers(
    sync: SyncFilter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records' connection is the recorder's writer thread's: a write from the caller's thread could
    land inside a commit the writer has open, and go with it when that commit is rolled back."""
    recorder = sync.engine.recorder
    assert isinstance(recorder, InlineSqliteRecorder)
    writers: list[str] = []
    insert_apart = recorder.sink.insert_apart

    def noted(rows: list[Any]) -> Any:
        writers.append(threading.current_thread().name)
        return insert_apart(rows)

    monkeypatch.setattr(recorder.sink, "insert_apart", noted)

    @on_push(sync, ROUTE)
    def handle(envelope: Any) -> None:
        raise AssertionError("the body must not run")

    with pytest.raises(Nack):
        handle(b'{"message": {"messageId": "bad-1", "data": "!!"}}')
    assert writers == ["records-inline-writer"]  # the recorder's own thread: never the caller's
    assert ("bad-1", "rejected") in committed_decisions(sync.engine.config.records.path)
