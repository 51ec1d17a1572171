"""The pull worker's /healthz sees a stream that pulls nothing any more: its future done, or its
consumer thread dead (the client library then never completes the future)."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.pull.health import CONSUMER_LOGGER, ConsumerDeaths, Watchdog, health_app, stream_failures
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTES = [{"name": "r", "destination": "phase3", "key": ["payload.k"]}]


class Worker:
    """What `health_app` reads of a `PullWorker`, its streams being the futures given."""

    def __init__(self, engine: Engine, streams: dict[str, concurrent.futures.Future[Any]]):
        self.engine, self.streams = engine, streams
        self.failure: BaseException | None = None
        self.handled = 0
        self.ready = threading.Event()
        self.ready.set()
        self.watchdog = Watchdog({}, 10.0, lambda path, timeout: None)

    def stream_failures(self) -> dict[str, str]:
        return stream_failures(self.streams)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    cfg = parse({"routes": ROUTES})
    store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors)
    yield Engine(cfg, store, MemoryPublisher(), MemoryRecorder())
    await store.close()


async def healthz(worker: Worker) -> httpx.Response:
    transport = httpx.ASGITransport(app=health_app(worker))
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        return await client.get("/healthz")


async def test_healthz_is_200_while_every_stream_runs(engine: Engine) -> None:
    resp = await healthz(Worker(engine, {"r": concurrent.futures.Future()}))
    assert (resp.status_code, resp.json()["status"]) == (200, "ok")


async def test_healthz_is_503_naming_the_reason_once_a_streams_future_failed(engine: Engine) -> None:
    dead: concurrent.futures.Future[Any] = concurrent.futures.Future()
    dead.set_exception(ZeroDivisionError("division by zero"))
    resp = await healthz(Worker(engine, {"r": dead, "other": concurrent.futures.Future()}))
    assert resp.status_code == 503
    body = resp.json()
    assert (body["status"], body["error"]) == ("failed", "ZeroDivisionError: division by zero")
    assert body["streams"] == {"r": "ZeroDivisionError: division by zero"}


def test_a_stream_that_ended_or_was_cancelled_is_a_failure_too() -> None:
    ended: concurrent.futures.Future[Any] = concurrent.futures.Future()
    ended.set_result(True)
    cancelled: concurrent.futures.Future[Any] = concurrent.futures.Future()
    cancelled.cancel()
    assert stream_failures({"a": ended, "b": cancelled, "c": concurrent.futures.Future()}) == {
        "a": "the streaming pull ended by itself",
        "b": "the streaming pull was cancelled",
    }


def test_a_consumer_thread_the_client_library_reports_dead_is_seen_with_its_reason() -> None:
    died: list[str] = []
    deaths = ConsumerDeaths(died.append)
    deaths.attach()
    try:
        # What google-api-core's BackgroundConsumer does when its thread dies on an unexpected exception.
        try:
            1 / 0  # noqa: B018
        except ZeroDivisionError as exc:
            logging.getLogger(CONSUMER_LOGGER).exception("%s caught unexpected exception %s and will exit.", "T", exc)
        logging.getLogger(CONSUMER_LOGGER).info("a line that is not a death")
    finally:
        deaths.detach()
    logging.getLogger(CONSUMER_LOGGER).error("after detach: not seen")
    assert died == ["ZeroDivisionError: division by zero"]


async def test_healthz_has_the_shape_serves_has(engine: Engine) -> None:
    from pubsub_filter.push.app import create_app
    from tests.support.asgi import call

    pulled = (await healthz(Worker(engine, {"r": concurrent.futures.Future()}))).json()
    status, body = await call(create_app(engine), "GET", "/healthz")
    served = json.loads(body)
    assert status == 200 and pulled["status"] == served["status"] == "ok"
    assert set(served) == {"status", "in_flight", "counts"}
    assert set(pulled) == set(served) | {"handled"}
