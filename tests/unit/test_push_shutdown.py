"""SIGTERM while publishes outlast `server.shutdown_grace`, on the push app as served.

uvicorn waits the grace for the requests, cancels those still running, then runs the
lifespan's shutdown (`Engine.close`); `asyncio.run` then cancels whatever is still left. Every
message answered 2xx must by then have its decision row and its decision log line, nothing may
be closed under a decision still using it, and no request may end in uvicorn's plain 500 with
a traceback. Found by hand before the push model (test_push_shutdown_model.py) existed; kept as
its named cases.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
import uvicorn

from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.model import KeyState
from pubsub_filter.core.ports import StateStore
from tests.support.clock import ManualClock
from tests.support.fakes import SwitchStore
from tests.support.served import WATCHDOG, Answer, Downstream, ServedPush, StallingPublisher, stored_states

GRACE = 0.02
#: the whole stop: the engine's close gets what is left of it after the requests' share (core.engine.stopping)
BUDGET = 0.4


def config(tmp_path: Path) -> Config:
    return parse(
        {
            "routes": [{"name": "reports", "destination": "phase3", "key": ["payload.k"]}],
            "server": {"shutdown_budget": BUDGET},
            # a closed store is retried for the whole budget: keep it short
            "store_errors": {"timeout": "0.01s", "budget": "0.02s"},
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "records": {"backend": "sqlite", "path": str(tmp_path / "records.db")},
        }
    )


def envelope(message_id: str, key: str = "a", content: int = 0) -> bytes:
    return make_envelope(json.dumps({"k": key, "v": content}).encode(), message_id)


def rows(path: Path) -> list[dict[str, Any]]:
    db = sqlite3.connect(str(path))
    try:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM decisions")]
    finally:
        db.close()


class GatedReads(SwitchStore):
    """Reads wait for `gate` once it is set; `reading` says one is waiting."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.gate: asyncio.Event | None = None
        self.reading = asyncio.Event()

    async def read(self, route: str, key: str) -> KeyState | None:
        if self.gate is not None:
            self.reading.set()
            await self.gate.wait()
        return await super().read(route, key)


@pytest.fixture
def logs() -> Any:
    with structlog.testing.capture_logs() as captured:
        yield captured


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[ServedPush]:
    publisher = StallingPublisher(Downstream(), on_close=None)
    yield await ServedPush(config(tmp_path), tmp_path, publisher, ManualClock()).start()


async def publish_stalled(served: ServedPush, message_id: str, content: int = 0) -> asyncio.Task[Answer]:
    served.publisher.mode = "stall"
    served.publisher.stalling.clear()
    task = served.post("reports", envelope(message_id, content=content))
    await served.publisher.stalling.wait()
    return task


def decision_lines(logs: list[dict[str, Any]], message_id: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "decision" and e.get("message_id") == message_id]


def assert_closed_under_nothing(logs: list[dict[str, Any]]) -> None:
    closed_under = [e["event"] for e in logs if e["event"] in ("lease_release_failed", "commit_failed")]
    assert closed_under == []


async def test_a_publish_flushed_by_the_publishers_close_is_answered_200_with_its_record_and_log_line(
    tmp_path: Path, logs: list[dict[str, Any]]
) -> None:
    """Pub/Sub's stop() flushes what it holds: the forward lands while the engine closes.
    Before, records and store were closed first: a 200 with no row, and `commit_failed`."""
    served = await ServedPush(
        config(tmp_path), tmp_path, StallingPublisher(Downstream(), on_close=True), ManualClock()
    ).start()
    await publish_stalled(served, "m1")
    [answer] = await served.shutdown(GRACE)
    assert (answer.status, answer.body.get("decision"), answer.raised) == (200, "forwarded", None)
    assert [(r["message_id"], r["decision"]) for r in rows(served.records_path)] == [("m1", "forwarded")]
    assert [e["decision"] for e in decision_lines(logs, "m1")] == ["forwarded"]
    assert_closed_under_nothing(logs)
    state = (await stored_states(served.store_path, "reports", ["a"]))["a"]
    assert state is not None and state.lease is None and state.fingerprint == answer.body["fingerprint"]


async def test_a_publish_that_never_returns_is_answered_503_with_a_record_and_frees_the_key(
    logs: list[dict[str, Any]], served: ServedPush
) -> None:
    """Before: the store was closed under the decision (`lease_release_failed`, the key leased
    for `lease.duration`), and the second cancel escaped as uvicorn's plain 500 with a traceback."""
    await publish_stalled(served, "m1")
    [answer] = await served.shutdown(GRACE)
    assert answer.raised is None and answer.status == 503
    assert_closed_under_nothing(logs)
    assert [r["decision"] for r in rows(served.records_path) if r["message_id"] == "m1"] == ["failed"]
    assert [e["decision"] for e in decision_lines(logs, "m1")] == ["failed"]
    state = (await stored_states(served.store_path, "reports", ["a"]))["a"]
    assert state is not None and state.lease is None and state.fingerprint is None


async def test_a_publish_settled_while_the_engine_closes_is_answered_with_its_record(
    logs: list[dict[str, Any]], served: ServedPush
) -> None:
    """The publisher resumes once uvicorn has cancelled the request and the close has begun."""
    await publish_stalled(served, "m1")
    loop = asyncio.get_running_loop()
    [answer] = await served.shutdown(GRACE, after_cancel=lambda: loop.call_soon(served.publisher.settle, 0, True))
    assert (answer.status, answer.raised) == (200, None)
    assert [r["decision"] for r in rows(served.records_path)] == ["forwarded"]
    assert [e["decision"] for e in decision_lines(logs, "m1")] == ["forwarded"]
    assert_closed_under_nothing(logs)


async def test_a_request_cancelled_before_its_decision_is_answered_503_with_a_record_saying_so(
    tmp_path: Path, logs: list[dict[str, Any]]
) -> None:
    gated: list[GatedReads] = []

    def wrap(store: StateStore) -> StateStore:
        gated.append(GatedReads(store))
        return gated[0]

    served = await ServedPush(
        config(tmp_path), tmp_path, StallingPublisher(Downstream()), ManualClock(), wrap_store=wrap
    ).start()
    gated[0].gate = asyncio.Event()
    served.post("reports", envelope("m1"))
    await gated[0].reading.wait()
    [answer] = await served.shutdown(GRACE)
    assert (answer.status, answer.raised) == (503, None)
    [row] = rows(served.records_path)
    assert (row["message_id"], row["decision"]) == ("m1", "failed")
    assert "cancelled" in row["reason"] and json.loads(row["extra"])["cause"] == "cancelled"
    assert [e["decision"] for e in decision_lines(logs, "m1")] == ["failed"]


async def under_uvicorn(served: ServedPush, message_id: str) -> tuple[httpx.Response | BaseException, str]:
    """SIGTERM to a real uvicorn server (its own drain, cancel and lifespan shutdown) while the
    publish of `message_id` stalls; what the client got, and uvicorn's own log."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = uvicorn.Config(
        served.app,
        lifespan="on",
        log_config=None,
        log_level="error",
        # as `serve` runs it: no websocket implementation imported inside this loop as uvicorn starts
        ws="none",
        access_log=False,
        timeout_graceful_shutdown=GRACE,  # type: ignore[arg-type]  # typed int; a float is waited as well
    )
    server = uvicorn.Server(settings)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logging.getLogger("uvicorn.error").addHandler(handler)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        served.publisher.mode = "stall"
        served.publisher.stalling.clear()
        # plain HTTP to this loop's own server: no certificates to load (50-100 ms of the loop's time)
        async with httpx.AsyncClient(timeout=WATCHDOG, verify=False) as client:
            # the socket listens already: the request waits in its backlog until uvicorn serves
            url = f"http://127.0.0.1:{port}/push/reports"
            request = asyncio.create_task(client.post(url, content=envelope(message_id)))
            await served.publisher.stalling.wait()
            server.should_exit = True  # what uvicorn's SIGTERM handler sets
            await asyncio.wait_for(serving, WATCHDOG)
            got: httpx.Response | BaseException
            try:
                got = await asyncio.wait_for(request, WATCHDOG)
            except httpx.HTTPError as exc:
                got = exc
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
        sock.close()
    return got, out.getvalue()


async def test_under_uvicorn_a_publish_that_never_returns_is_answered_503_not_a_500_with_a_traceback(
    tmp_path: Path, logs: list[dict[str, Any]]
) -> None:
    served = ServedPush(config(tmp_path), tmp_path, StallingPublisher(Downstream(), on_close=None), ManualClock())
    got, uvicorn_log = await under_uvicorn(served, "m1")
    assert "Exception in ASGI application" not in uvicorn_log
    assert isinstance(got, httpx.Response) and got.status_code == 503
    assert [r["decision"] for r in rows(served.records_path)] == ["failed"]
    assert_closed_under_nothing(logs)
    state = (await stored_states(served.store_path, "reports", ["a"]))["a"]
    assert state is not None and state.lease is None


async def test_under_uvicorn_a_publish_flushed_at_close_is_answered_200_with_its_record(
    tmp_path: Path, logs: list[dict[str, Any]]
) -> None:
    served = ServedPush(config(tmp_path), tmp_path, StallingPublisher(Downstream(), on_close=True), ManualClock())
    got, uvicorn_log = await under_uvicorn(served, "m1")
    assert "Exception in ASGI application" not in uvicorn_log
    assert isinstance(got, httpx.Response) and got.status_code == 200
    assert [r["decision"] for r in rows(served.records_path)] == ["forwarded"]
    assert_closed_under_nothing(logs)


async def test_a_redelivered_holder_whose_publish_fails_is_nacked_so_the_copies_acked_as_duplicates_still_arrive(
    served: ServedPush,
) -> None:
    """A copy acked as `duplicate` ("same content in flight") relies on the holder: until the
    holder is acked, Pub/Sub delivers it again. That holds for a holder delivered again after an
    ack Pub/Sub lost (it is outstanding again): its failed publish is a 503, and its next
    delivery forwards the content. (The push model once counted any earlier ack as final and
    called this content lost.)"""

    async def answer(message_id: str) -> Answer:
        served.publisher.mode = "ok"
        return await served.post("reports", envelope(message_id, content=7))

    holder = await publish_stalled(served, "m2", content=7)
    assert (await answer("m1")).body["decision"] == "duplicate"  # m1 acked: m2 carries content 7
    served.publisher.settle(0, False)
    assert not (await holder).acked  # a nack: 5xx
    again = await publish_stalled(served, "m1", content=7)  # m1 delivered again: its ack was lost
    assert (await answer("m2")).body["decision"] == "duplicate"  # m2 acked: m1 now carries it
    served.publisher.settle(0, False)
    assert not (await again).acked  # m1 is outstanding: Pub/Sub delivers it again
    last = await answer("m1")
    assert (last.status, last.body["decision"]) == (200, "forwarded")
    assert [p.source_id for p in served.publisher.downstream.landed] == ["m1"]
    await served.shutdown(GRACE)
