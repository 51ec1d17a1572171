"""The push endpoint's HTTP contract: 200 for every acked decision, 4xx for every bad input, never a 5xx for one."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pubsub_filter.backends.publishers.outbox import OutboxPublisher
from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.push.app import create_app
from tests.support.fakes import MemoryRecorder
from tests.support.oidc import LocalGoogleCerts, google_claims
from tests.support.push_client import AUDIENCE, PUSHER, authenticator, engine_on_sqlite, push_client

CONFIG: dict[str, Any] = {
    "server": {"max_body": 4096},
    "routes": [
        {"name": "reports", "destination": "phase3", "key": ["payload.game_date"], "subscription": "raw-reports"},
    ],
}


def engine_for(tmp_path: Path, **overrides: Any) -> Engine:
    return engine_on_sqlite(tmp_path, {**CONFIG, **overrides})


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with push_client(engine_for(tmp_path)) as c:
        yield c


def envelope(payload: Any = None, message_id: str = "1", **kw: Any) -> bytes:
    data = json.dumps({"game_date": "2025-01-10"} if payload is None else payload).encode()
    kw.setdefault("subscription", "projects/p/subscriptions/raw-reports")
    return make_envelope(data, message_id, **kw)


async def test_forwarded_answers_200_with_the_decision(client: httpx.AsyncClient) -> None:
    r = await client.post("/push/reports", content=envelope())
    assert r.status_code == 200
    assert r.json()["decision"] == "forwarded" and r.json()["fingerprint"].startswith("sha256:")


async def test_suppressed_answers_200(client: httpx.AsyncClient) -> None:
    await client.post("/push/reports", content=envelope(message_id="1"))
    r = await client.post("/push/reports", content=envelope(message_id="2"))
    assert (r.status_code, r.json()["decision"]) == (200, "suppressed")


async def test_duplicate_answers_200(client: httpx.AsyncClient) -> None:
    await client.post("/push/reports", content=envelope(message_id="1"))
    r = await client.post("/push/reports", content=envelope(message_id="1"))
    assert (r.status_code, r.json()["decision"]) == (200, "duplicate")


async def test_snake_case_envelope_fields_are_accepted(client: httpx.AsyncClient) -> None:
    body = {
        "message": {
            "data": base64.b64encode(b'{"game_date": "d"}').decode(),
            "message_id": "5",
            "publish_time": "2025-01-10T00:00:00.123456789Z",
        },
        "subscription": "projects/p/subscriptions/raw-reports",
    }
    r = await client.post("/push/reports", json=body)
    assert (r.status_code, r.json()["decision"]) == (200, "forwarded")


async def test_publish_failure_answers_500_so_pubsub_retries(client: httpx.AsyncClient) -> None:
    client.engine.publisher.fail = True  # type: ignore[attr-defined]
    r = await client.post("/push/reports", content=envelope())
    assert (r.status_code, r.json()["decision"]) == (500, "failed")


async def test_contended_answers_503_with_retry_after(client: httpx.AsyncClient) -> None:
    import asyncio

    pub = client.engine.publisher  # type: ignore[attr-defined]
    pub.gate = asyncio.Event()
    first = asyncio.create_task(client.post("/push/reports", content=envelope({"game_date": "d", "v": 1}, "1")))
    await pub.started.wait()
    r = await client.post("/push/reports", content=envelope({"game_date": "d", "v": 2}, "2"))
    pub.gate.set()
    await first
    assert (r.status_code, r.json()["decision"], r.headers["retry-after"]) == (503, "contended", "1")


# --- every malformed input class gets its 4xx -----------------------------------------

BAD_BODIES = {
    "empty body": (b"", "empty body"),
    "not JSON": (b"{nope", "not JSON"),
    "JSON but not an object": (b"[1, 2]", "not a push envelope"),
    "no message": (b'{"subscription": "s"}', "not a push envelope"),
    "message not an object": (b'{"message": "hi"}', "not a push envelope"),
    "no message id": (b'{"message": {"data": "e30="}}', "messageId is missing"),
    "data not a string": (b'{"message": {"data": 5, "messageId": "1"}}', "not a push envelope"),
    "bad base64": (b'{"message": {"data": "***", "messageId": "1"}}', "not valid base64"),
    "attributes not strings": (b'{"message": {"messageId": "1", "attributes": {"a": 1}}}', "not a push envelope"),
    "bad publish time": (b'{"message": {"messageId": "1", "publishTime": "yesterday"}}', "publishTime"),
    "invalid UTF-8": (b'{"message": {"messageId": "\xff\xfe"}}', "not valid UTF-8"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
async def test_malformed_envelope_answers_400_with_the_reason(client: httpx.AsyncClient, case: str) -> None:
    body, reason = BAD_BODIES[case]
    r = await client.post("/push/reports", content=body)
    assert r.status_code == 400
    assert r.json()["decision"] == "rejected" and reason in r.json()["reason"]


KEYLESS = [
    ({"other": 1}, "key field payload.game_date is missing"),
    ({"game_date": None}, "key field payload.game_date is null"),
    ({"game_date": {"a": 1}}, "key field payload.game_date is an object or list, not a value"),
]


@pytest.mark.parametrize(("payload", "reason"), KEYLESS)
async def test_payload_without_its_key_is_forwarded_fail_open_with_200(
    client: httpx.AsyncClient, payload: Any, reason: str
) -> None:
    r = await client.post("/push/reports", content=envelope(payload, "7"))
    assert (r.status_code, r.json()["decision"]) == (200, "fail_open")
    assert r.json()["reason"].startswith(reason + ": forwarded without a dedup decision")
    [sent] = client.engine.publisher.published  # type: ignore[attr-defined]
    assert sent.data == json.dumps(payload).encode()
    assert (sent.attributes["filter_source_message_id"], sent.attributes["filter_route"]) == ("7", "reports")
    assert sent.attributes["filter_fingerprint"].startswith("sha256:") and "filter_fence" not in sent.attributes


@pytest.mark.parametrize(("payload", "reason"), KEYLESS)
async def test_payload_without_its_key_answers_400_on_a_route_that_rejects_it(
    tmp_path: Path, payload: Any, reason: str
) -> None:
    route = {**CONFIG["routes"][0], "on_missing_key": "reject"}
    engine = engine_for(tmp_path, routes=[route])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://f") as c:
        r = await c.post("/push/reports", content=envelope(payload))
    assert (r.status_code, r.json()["decision"], r.json()["reason"]) == (400, "rejected", reason)
    assert engine.publisher.published == []  # type: ignore[union-attr]


async def test_push_from_another_subscription_answers_400(client: httpx.AsyncClient) -> None:
    r = await client.post("/push/reports", content=envelope(subscription="projects/p/subscriptions/elsewhere"))
    assert r.status_code == 400 and "elsewhere" in r.json()["reason"]


async def test_unknown_route_answers_404(client: httpx.AsyncClient) -> None:
    r = await client.post("/push/nope", content=envelope())
    assert (r.status_code, r.json()["decision"]) == (404, "rejected")


async def test_body_over_the_limit_answers_413(client: httpx.AsyncClient) -> None:
    r = await client.post("/push/reports", content=envelope({"game_date": "d", "pad": "x" * 5000}))
    assert (r.status_code, r.json()["decision"]) == (413, "rejected")


async def test_body_over_the_limit_without_content_length_answers_413(client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1000

    r = await client.post("/push/reports", content=chunks())
    assert r.status_code == 413


async def test_every_rejection_is_recorded(client: httpx.AsyncClient) -> None:
    await client.post("/push/reports", content=b"{nope")
    await client.post("/push/nope", content=envelope())
    records = client.engine.recorder.records  # type: ignore[attr-defined]
    assert [str(r.decision) for r in records] == ["rejected", "rejected"]


async def test_get_on_push_is_405(client: httpx.AsyncClient) -> None:
    assert (await client.get("/push/reports")).status_code == 405


# --- health ---------------------------------------------------------------------------


async def test_healthz_answers_200(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz")
    assert (r.status_code, r.json()["status"]) == (200, "ok")


async def test_readyz_answers_200_when_the_store_answers(client: httpx.AsyncClient) -> None:
    assert (await client.get("/readyz")).status_code == 200


async def test_readyz_answers_503_when_the_store_does_not(client: httpx.AsyncClient) -> None:
    from pubsub_filter.core.ports import StoreUnavailable

    class Down:
        async def ping(self) -> None:
            raise StoreUnavailable("gone")

    client.engine.store = Down()  # type: ignore[attr-defined]
    r = await client.get("/readyz")
    assert (r.status_code, r.json()["status"]) == (503, "unavailable")


async def readyz_with_outbox(tmp_path: Path, outbox: Path) -> httpx.Response:
    cfg = parse(CONFIG)
    store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors)
    engine = Engine(cfg, store, OutboxPublisher(outbox), MemoryRecorder())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://f") as c:
        response = await c.get("/readyz")
    await engine.publisher.close()
    await store.close()
    return response


async def test_readyz_answers_200_when_the_outbox_can_be_appended_to(tmp_path: Path) -> None:
    r = await readyz_with_outbox(tmp_path, tmp_path / "outbox.jsonl")
    assert (r.status_code, r.json()) == (200, {"status": "ready"})


async def test_readyz_answers_503_when_the_outbox_directory_is_gone(tmp_path: Path) -> None:
    r = await readyz_with_outbox(tmp_path, tmp_path / "vanished" / "outbox.jsonl")
    assert (r.status_code, r.json()["status"]) == (503, "unavailable")
    assert "vanished" in r.json()["publisher"] and "store" not in r.json()


async def test_readyz_answers_503_when_the_publisher_is_closed(client: httpx.AsyncClient) -> None:
    await client.engine.publisher.close()  # type: ignore[attr-defined]
    r = await client.get("/readyz")
    assert (r.status_code, r.json()["publisher"]) == (503, "MemoryPublisher: closed")


# --- OIDC on ---------------------------------------------------------------------------


@pytest.fixture
async def guarded(tmp_path: Path, certs: LocalGoogleCerts) -> AsyncIterator[httpx.AsyncClient]:
    async with push_client(engine_for(tmp_path), authenticator(certs)) as c:
        yield c


async def test_with_auth_on_a_valid_token_is_let_through(guarded: httpx.AsyncClient, certs: LocalGoogleCerts) -> None:
    token = certs.sign(google_claims(audience=AUDIENCE, email=PUSHER))
    r = await guarded.post("/push/reports", content=envelope(), headers={"Authorization": f"Bearer {token}"})
    assert (r.status_code, r.json()["decision"]) == (200, "forwarded")


async def test_with_auth_on_a_missing_token_answers_401(guarded: httpx.AsyncClient) -> None:
    assert (await guarded.post("/push/reports", content=envelope())).status_code == 401


async def test_with_auth_on_the_wrong_pusher_answers_403(guarded: httpx.AsyncClient, certs: LocalGoogleCerts) -> None:
    token = certs.sign(google_claims(audience=AUDIENCE, email="someone@else.com"))
    r = await guarded.post("/push/reports", content=envelope(), headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 403


async def test_with_auth_on_unknown_routes_are_not_revealed(guarded: httpx.AsyncClient) -> None:
    assert (await guarded.post("/push/nope", content=envelope())).status_code == 401


@pytest.mark.parametrize(
    ("decision", "cause", "status"),
    [
        ("forwarded", None, 200),
        ("suppressed", None, 200),
        ("duplicate", None, 200),
        ("stale", None, 200),
        ("fail_open", None, 200),
        ("noise_only", None, 200),
        ("contended", None, 503),
        ("failed", "store", 503),
        ("failed", "publish", 500),
        ("failed", "overloaded", 429),
        ("rejected", None, 400),
        ("rejected", "unknown_route", 404),
    ],
)
def test_every_decision_has_its_push_answer(decision: str, cause: str | None, status: int) -> None:
    from pubsub_filter.core.engine.answer import answer_for
    from pubsub_filter.core.model import Cause, Decision, DecisionRecord

    reason = Cause(cause) if cause else None
    rec = DecisionRecord(time=0, route="r", decision=Decision(decision), enforced=True, message_id="1", cause=reason)
    assert (answer_for(rec).status, answer_for(rec).retry_after) == (status, status in (429, 503))


async def test_a_replayed_message_is_judged_by_its_original_publish_time(client: httpx.AsyncClient) -> None:
    # forwarded at 12:00; then an old dead letter of other content, replayed at 13:00, first published at 11:00
    await client.post(
        "/push/reports", content=envelope({"game_date": "d", "v": 2}, "1", publish_time="2026-01-01T12:00:00Z")
    )
    replayed = envelope(
        {"game_date": "d", "v": 1},
        "2",
        publish_time="2026-01-01T13:00:00Z",
        attributes={"filter_replay_original_publish_time": "2026-01-01T11:00:00Z"},
    )
    r = await client.post("/push/reports", content=replayed)
    assert (r.status_code, r.json()["decision"]) == (200, "stale")


@pytest.mark.parametrize(
    "stamp", ["9999-12-31T23:59:59.999999-23:59", "0001-01-01T00:00:00+23:59", "2025-01-10T17:00:05.123Z"]
)
def test_any_publish_time_the_parser_accepts_can_be_formatted(stamp: str) -> None:
    from pubsub_filter.core.times import format_time, parse_time

    assert format_time(parse_time(stamp)).endswith("Z")
