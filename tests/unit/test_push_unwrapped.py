"""Pushes with payload unwrapping: the data as the body, with Pub/Sub's metadata and the
attributes as headers (write metadata) or nothing but the body (docs/deploying.md, "Payload
unwrapping"). Both forms and the wrapped envelope are taken on the same `/push/<route>`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pubsub_filter.core.attributes import ATTR_SOURCE_ID
from pubsub_filter.core.config.schema import ConfigError, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.push.unwrapped import parse_push
from tests.support.oidc import LocalGoogleCerts, google_claims
from tests.support.push_client import AUDIENCE, PUSHER, authenticator, engine_on_sqlite, push_client

SUB = "projects/p/subscriptions/raw-reports"
ROUTES: list[dict[str, Any]] = [
    {"name": "reports", "destination": "phase3", "key": ["payload.game_date"], "subscription": "raw-reports"},
    {"name": "by-attr", "destination": "phase3", "key": ["attributes.entity"], "push_format": "unwrapped"},
    {
        "name": "bare",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "push_format": "unwrapped_no_metadata",
    },
]


def engine_for(tmp_path: Path) -> Engine:
    return engine_on_sqlite(tmp_path, {"routes": ROUTES})


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    """Built before the loop runs, as `serve` builds its engine: opening the SQLite file is a disk's
    write and sync (0.1 s seen on a busy CI disk), and no part of a push."""
    return engine_for(tmp_path)


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    async with push_client(engine) as c:
        yield c


def published(client: httpx.AsyncClient) -> list[Any]:
    return client.engine.publisher.published  # type: ignore[attr-defined,no-any-return]


def data(game_date: str = "2025-01-10", **more: Any) -> bytes:
    return json.dumps({"game_date": game_date, **more}).encode()


def metadata(message_id: str, *, publish_time: str = "2026-01-01T00:00:00.123Z", **extra: str) -> list[Any]:
    """The headers Pub/Sub writes on an unwrapped push with write metadata (Cloud Run's own besides)."""
    return [
        ("Content-Type", "application/octet-stream"),
        ("User-Agent", "CloudPubSub-Google"),
        ("x-goog-pubsub-subscription-name", SUB),
        ("x-goog-pubsub-message-id", message_id),
        ("x-goog-pubsub-publish-time", publish_time),
        ("X-Cloud-Trace-Context", "0123456789abcdef0123456789abcdef/1;o=1"),
        ("traceparent", "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"),
        ("X-Forwarded-For", "10.0.0.1"),
        ("Forwarded", "for=10.0.0.1;proto=https"),
        *extra.items(),
    ]


async def push(client: httpx.AsyncClient, route: str, body: bytes, headers: Any = ()) -> tuple[int, dict[str, Any]]:
    r = await client.post(f"/push/{route}", content=body, headers=list(headers))
    return r.status_code, r.json()


# --- with metadata: decided exactly as a wrapped push --------------------------------------


async def test_unwrapped_with_metadata_is_forwarded_then_a_duplicate_for_the_same_id(
    client: httpx.AsyncClient,
) -> None:
    first = await push(client, "reports", data(), metadata("41"))
    again = await push(client, "reports", data(), metadata("41"))
    assert (first[0], first[1]["decision"], first[1]["message_id"]) == (200, "forwarded", "41")
    assert (again[0], again[1]["decision"]) == (200, "duplicate")
    (out,) = published(client)
    assert out.data == data() and out.attributes[ATTR_SOURCE_ID] == "41"


async def test_unwrapped_with_metadata_is_suppressed_for_another_id_with_the_same_content(
    client: httpx.AsyncClient,
) -> None:
    await push(client, "reports", data(), metadata("1"))
    assert (await push(client, "reports", data(), metadata("2")))[1]["decision"] == "suppressed"


async def test_attributes_come_back_exactly_with_their_names_lower_cased(client: httpx.AsyncClient) -> None:
    """Attributes are headers: their names arrive lower-cased (HTTP), their values exactly (UTF-8),
    and no header of the request, Cloud Run's or Pub/Sub's metadata becomes an attribute."""
    attributes = [("Entity", "k1"), ("Source-System", "Scraper"), ("Unicode_Value", "värde 😀"), ("x", "a" * 1024)]
    raw = [(name.encode("utf-8"), value.encode("utf-8")) for name, value in attributes]
    status, answer = await push(client, "by-attr", b"not json at all", [*metadata("7"), *raw])
    assert (status, answer["decision"], answer["key"]) == (200, "forwarded", "k1")
    (out,) = published(client)
    own = {k: v for k, v in out.attributes.items() if not k.startswith("filter_")}
    assert own == {"entity": "k1", "source-system": "Scraper", "unicode_value": "värde 😀", "x": "a" * 1024}
    assert out.data == b"not json at all"


async def test_the_publish_time_header_is_the_stale_guards(client: httpx.AsyncClient) -> None:
    await push(client, "reports", data(v=2), metadata("2", publish_time="2026-01-02T00:00:00Z"))
    status, answer = await push(client, "reports", data(v=1), metadata("1", publish_time="2026-01-01T00:00:00Z"))
    assert (status, answer["decision"]) == (200, "stale")


async def test_wrapped_and_unwrapped_pushes_are_taken_on_one_route_as_one_message(client: httpx.AsyncClient) -> None:
    """The same message pushed wrapped, then unwrapped (a subscription switched over): one forward."""
    wrapped = await push(client, "reports", make_envelope(data(), "9", subscription=SUB))
    unwrapped = await push(client, "reports", data(), metadata("9"))
    assert (wrapped[1]["decision"], unwrapped[1]["decision"]) == ("forwarded", "duplicate")
    assert len(published(client)) == 1


async def test_an_envelope_shaped_payload_with_metadata_is_data_and_decides_nothing_else(
    client: httpx.AsyncClient,
) -> None:
    """A producer's payload shaped like an envelope (a forged id and a publish time far ahead)
    is the data of its own message: the message it names is still decided as itself."""
    forged = make_envelope(data("d"), "real-1", publish_time="2999-01-01T00:00:00Z", subscription=SUB)
    status, answer = await push(client, "by-attr", forged, [*metadata("p-1"), ("entity", "k")])
    assert (status, answer["decision"], answer["message_id"]) == (200, "forwarded", "p-1")
    later = await push(client, "by-attr", data("d", v=2), [*metadata("real-1"), ("entity", "k")])
    assert (later[0], later[1]["decision"]) == (200, "forwarded")
    assert [p.data for p in published(client)] == [forged, data("d", v=2)]


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ([("Entity", "a"), ("entity", "b")], "sent more than once"),
        ([("x-goog-pubsub-message-id", "other")], "sent more than once"),
        ([("entity", b"\xff\xfe")], "not UTF-8"),
    ],
)
async def test_headers_pubsub_never_sends_are_rejected(client: httpx.AsyncClient, extra: Any, reason: str) -> None:
    status, answer = await push(client, "by-attr", b"x", [*metadata("5"), *extra])
    assert (status, answer["decision"]) == (400, "rejected")
    assert reason in answer["reason"] and published(client) == []
    assert client.engine.recorder.records[-1].message_id == "5"  # type: ignore[attr-defined]


async def test_an_empty_message_id_header_is_rejected(client: httpx.AsyncClient) -> None:
    status, answer = await push(client, "reports", data(), metadata(""))
    assert (status, answer["decision"]) == (400, "rejected") and "message id" in answer["reason"]


async def test_a_bad_publish_time_header_is_rejected(client: httpx.AsyncClient) -> None:
    status, answer = await push(client, "reports", data(), metadata("3", publish_time="yesterday"))
    assert (status, answer["decision"]) == (400, "rejected") and "publish-time" in answer["reason"]


async def test_a_push_from_another_subscription_header_is_rejected(client: httpx.AsyncClient) -> None:
    headers = [h for h in metadata("3") if h[0] != "x-goog-pubsub-subscription-name"]
    headers.append(("x-goog-pubsub-subscription-name", "projects/p/subscriptions/other"))
    assert (await push(client, "reports", data(), headers))[0] == 400


# --- without metadata: the body is all there is ------------------------------------------


async def test_unwrapped_without_metadata_is_forwarded_then_suppressed(client: httpx.AsyncClient) -> None:
    first = await push(client, "bare", data())
    again = await push(client, "bare", data())  # a redelivery, or the same content again: one cannot tell
    assert (first[0], first[1]["decision"]) == (200, "forwarded")
    assert (again[0], again[1]["decision"]) == (200, "suppressed")
    assert first[1]["message_id"] == again[1]["message_id"] and first[1]["message_id"].startswith("data-sha256:")
    assert [p.data for p in published(client)] == [data()]


async def test_unwrapped_without_metadata_never_loses_a_change_back(client: httpx.AsyncClient) -> None:
    """A→B→A forwards all three: an id made from the data must not make the third a duplicate."""
    answers = [await push(client, "bare", data(v=v)) for v in (1, 2, 1)]
    assert [a[1]["decision"] for a in answers] == ["forwarded", "forwarded", "forwarded"]


async def test_unwrapped_without_metadata_redelivered_while_in_flight_is_retried_not_acked(
    client: httpx.AsyncClient,
) -> None:
    """Acking a redelivery acks the message: with its first delivery's publish still under way
    (it may fail), the redelivery must be answered 503 (retried), not 200."""
    pub = client.engine.publisher  # type: ignore[attr-defined]
    pub.gate = asyncio.Event()
    first = asyncio.create_task(push(client, "bare", data()))
    await pub.started.wait()
    status, answer = await push(client, "bare", data())
    pub.gate.set()
    assert (status, answer["decision"]) == (503, "contended")
    assert (await first)[1]["decision"] == "forwarded"


async def test_an_envelope_on_a_route_without_metadata_is_its_data(client: httpx.AsyncClient) -> None:
    """On a route whose subscription sends bare data, a body is never read as an envelope."""
    body = json.dumps({"game_date": "d", "message": {"messageId": "1"}, "subscription": SUB}).encode()
    status, answer = await push(client, "bare", body)
    assert (status, answer["decision"]) == (200, "forwarded")
    assert published(client)[0].data == body and published(client)[0].attributes[ATTR_SOURCE_ID].startswith("data-")


async def test_a_push_without_metadata_on_a_wrapped_route_is_still_rejected(client: httpx.AsyncClient) -> None:
    status, answer = await push(client, "reports", data())
    assert (status, answer["decision"]) == (400, "rejected")


# --- the same authentication for every form -------------------------------------------------


@pytest.fixture
async def guarded(engine: Engine, certs: LocalGoogleCerts) -> AsyncIterator[httpx.AsyncClient]:
    async with push_client(engine, authenticator(certs)) as c:
        yield c


FORMS = {
    "wrapped": ("reports", make_envelope(data(), "1", subscription=SUB), []),
    "with metadata": ("reports", data(), metadata("1")),
    "without metadata": ("bare", data(), []),
}


@pytest.mark.parametrize("form", list(FORMS))
async def test_every_form_needs_a_valid_token(guarded: httpx.AsyncClient, certs: LocalGoogleCerts, form: str) -> None:
    route, body, headers = FORMS[form]
    assert (await push(guarded, route, body, headers))[0] == 401
    forged = certs.sign(google_claims(audience=AUDIENCE, email="someone@else.com"))
    assert (await push(guarded, route, body, [*headers, ("Authorization", f"Bearer {forged}")]))[0] == 403
    token = certs.sign(google_claims(audience=AUDIENCE, email=PUSHER))
    status, answer = await push(guarded, route, body, [*headers, ("Authorization", f"Bearer {token}")])
    assert (status, answer["decision"]) == (200, "forwarded")
    assert "authorization" not in str(answer)


# --- the config -------------------------------------------------------------------------------


def test_an_unwrapped_route_must_name_its_attributes_in_lower_case() -> None:
    route = {"name": "r", "destination": "phase3", "key": ["attributes.EntityId"], "push_format": "unwrapped"}
    with pytest.raises(ConfigError, match=r"attributes\.entityid"):
        parse({"routes": [route]})
    parse({"routes": [{**route, "key": ["attributes.entityid"]}]})


def test_a_route_without_metadata_cannot_read_attributes() -> None:
    route = {"name": "r", "destination": "phase3", "key": ["attributes.id"], "push_format": "unwrapped_no_metadata"}
    with pytest.raises(ConfigError, match="carries no attributes"):
        parse({"routes": [route]})
    parse({"routes": [{**route, "push_format": "unwrapped"}]})


@pytest.mark.parametrize("form", list(FORMS))
def test_a_body_gathered_in_parts_is_the_same_message_in_every_form(form: str) -> None:
    """A body read in parts comes as the `bytearray` it was gathered in; the message made of it is
    the one its bytes make, with `bytes` for data (a message's values do not change)."""
    route, body, headers = FORMS[form]
    raw = [(name.lower().encode(), value.encode()) for name, value in headers]
    metadata, bare = bool(headers), route == "bare"
    gathered = parse_push(bytearray(body), raw, metadata, bare)
    assert gathered == parse_push(body, raw, metadata, bare)
    assert type(gathered.data) is bytes
