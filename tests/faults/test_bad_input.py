"""Bad input, generated: whatever arrives at the push endpoint is answered 2xx or 4xx, never 5xx or a crash.

One app per test (embedded SQLite store in `tmp_path`, in-memory publisher, the real
batched SQLite decision records), driven in-process through `httpx.ASGITransport` on one
event loop. Hypothesis runs derandomized, so every CI run sends the same cases. An app
exception reaches the test (ASGITransport re-raises it), so "never 5xx" also means
"never an unhandled exception". After each run the app must still be healthy:
`/healthz` answers 200, a well-formed push is forwarded and published, and no decision
record was lost.

The `test_regression_*` tests are minimal examples of the bugs found while writing these generators.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import re
import string
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.records.sqlite import SqliteSink
from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.compare.fingerprint import PayloadError
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import ConfigError, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import ATTR_ORIGINAL_TIME, make_envelope
from pubsub_filter.core.model import ACKED
from pubsub_filter.push.app import create_app
from tests.support.fakes import MemoryPublisher
from tests.support.jsonlogs import JsonLines, production_logs

pytestmark = pytest.mark.faults

MAX_BODY = 64 * 1024
SUB = "projects/p/subscriptions/raw-reports"
ROUTES: list[dict[str, Any]] = [
    # payload key, subscription check
    {"name": "reports", "destination": "phase3", "key": ["payload.game_date"], "subscription": "raw-reports"},
    # attribute key: any payload, JSON or not
    {"name": "by-attr", "destination": "phase3", "key": ["attributes.id"]},
    # composite key, window, exclude list
    {
        "name": "mixed-key",
        "destination": "phase3",
        "key": ["attributes.id", "payload.game_date"],
        "window": "1h",
        "exclude": ["t", "processed_at"],
    },
    # rows + include covering row_key: the typed fast path
    {
        "name": "players",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "row_key": ["id"],
        "include": ["id", "status"],
    },
    # rows + exclude only: the generic canonical path; a key or rows it cannot read is rejected
    {
        "name": "players-generic",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "row_key": ["id"],
        "exclude": ["t"],
        "on_missing_key": "reject",
    },
    # seed 002's data_hash
    {
        "name": "seed-002",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "row_key": ["id"],
        "scheme": "data_hash",
        "exclude": ["processed_at"],
    },
    # seed 001's event fingerprint
    {
        "name": "seed-001",
        "destination": "phase3",
        "key": ["attributes.id"],
        "scheme": "event",
        "rows": "payload.events",
    },
    # bypass rules, shadow mode
    {
        "name": "live",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "mode": "shadow",
        "bypass": [
            {"field": "payload.live", "equals": True},
            {"field": "attributes.kind", "in": ["a", "b"]},
            {"field": "payload.x", "exists": True},
        ],
    },
    {
        "name": "stale-forward",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "stale": "forward",
        "on_missing_key": "reject",
    },
]
ROUTE_NAMES = [r["name"] for r in ROUTES]
REJECTS_KEYLESS = {r["name"] for r in ROUTES if r.get("on_missing_key") == "reject"}
SETTINGS = {
    "deadline": None,
    "derandomize": True,  # the same cases on every run
    "database": None,
    "print_blob": True,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
}

#: Requests (or configs) each generated test sent, by test: the suite's case count.
CASES: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def report_case_count(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and CASES:
        reporter.write_line(
            f"\nbad input: {CASES.total()} generated cases ({', '.join(f'{k} {v}' for k, v in CASES.items())})"
        )


# --- the app ---------------------------------------------------------------------------


class Harness:
    """One app on one event loop, driven synchronously from hypothesis examples."""

    def __init__(self, runner: asyncio.Runner, tmp_path: Path) -> None:
        cfg = parse({"server": {"max_body": MAX_BODY}, "routes": ROUTES})
        self.runner = runner
        self.publisher = MemoryPublisher()
        self.recorder = BatchingRecorder(
            SqliteSink(tmp_path / "decisions.db"), batch_size=200, flush_interval=0.5, retry_backoff=0.01
        )
        self.store = SqliteStore(tmp_path / "state.db")
        self.engine = Engine(cfg, GuardedStore(self.store, cfg.store_errors), self.publisher, self.recorder)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(self.engine)), base_url="http://filter"
        )
        self.statuses: Counter[int] = Counter()
        self._health_n = 0

    def post(self, route: str, body: Any, headers: dict[str, Any] | None = None) -> httpx.Response:
        response = self.runner.run(self.client.post(f"/push/{route}", content=body, headers=headers))
        self.statuses[response.status_code] += 1
        return response

    def answered(self, route: str, body: Any, headers: dict[str, Any] | None = None) -> httpx.Response:
        """POST and check the contract: 2xx or 4xx, a JSON answer that says what was decided and why."""
        r = self.post(route, body, headers)
        assert 200 <= r.status_code < 500, (r.status_code, r.text)
        if r.status_code == 404 and "/" in route.replace("%2F", "/"):
            return r  # not a push path at all: the router's own 404
        answer = r.json()
        if r.status_code < 300:
            assert answer["decision"] in ACKED, answer
        else:
            assert r.status_code in (400, 404, 413), (r.status_code, answer)
            assert answer["decision"] == "rejected" and answer["reason"], answer
        return r

    def assert_healthy(self) -> None:
        r = self.runner.run(self.client.get("/healthz"))
        assert (r.status_code, r.json()["status"]) == (200, "ok")
        assert self.engine.in_flight == 0
        self._health_n += 1
        payload = json.dumps({"game_date": f"health-{self._health_n}", "v": 1}).encode()
        before = len(self.publisher.published)
        r = self.post("reports", make_envelope(payload, f"health-{self._health_n}", subscription=SUB))
        assert (r.status_code, r.json()["decision"]) == (200, "forwarded"), r.text
        assert len(self.publisher.published) == before + 1 and self.publisher.published[-1].data == payload
        self.runner.run(self.recorder.flush())
        assert (self.recorder.dropped, self.recorder.failed_batches) == (0, 0), "a decision record was lost"
        assert self.recorder.written > 0

    async def close(self) -> None:
        await self.client.aclose()
        await self.recorder.close()
        await self.store.close()


@pytest.fixture
def logs() -> Iterator[JsonLines]:
    """The app logs as in production (JSON lines, level info), each line checked; set-up restored after."""
    with production_logs() as sink:
        yield sink


@pytest.fixture
def app(tmp_path: Path, logs: JsonLines) -> Iterator[Harness]:
    with asyncio.Runner() as runner:
        h = Harness(runner, tmp_path)
        try:
            yield h
        finally:
            runner.run(h.close())


def envelope(data: bytes, message_id: str = "1", attributes: dict[str, str] | None = None) -> bytes:
    """A well-formed push envelope, as Pub/Sub sends it (any text, lone surrogates too, JSON-escaped)."""
    message = {
        "data": base64.b64encode(data).decode(),
        "attributes": {"id": "k"} if attributes is None else attributes,
        "messageId": message_id,
        "publishTime": "2026-01-01T00:00:00.123456789Z",
    }
    return json.dumps({"message": message, "subscription": SUB}).encode()


# --- generators ------------------------------------------------------------------------
# A hypothesis draw costs ~50 µs, about as much as the request it feeds, so the
# strategies are shaped for few draws: hypothesis chooses the structure (which route,
# which field, present or absent, usual or pathological, which fault where) and most
# values come from pools built once, below, from a fixed seed: a few hundred interesting
# values cost one draw each. Strategies are built once, at import: building one inside a
# draw costs more than the request.

CHOICE = st.integers(0, 9)  # 0-6: the usual value, 7-9: absent, null or junk
KEY_VALUES = ["d1", "d2", "d3"]  # few keys: the suppress / change / redeliver paths get hit
GOOD_IDS = st.sampled_from([f"m{i}" for i in range(30)])  # redeliveries now and then
ODD_TEXT = ["", " ", "\x00", "é", "😀", "\u202e", "\ud800", "a|b", "a\\|b", "\\", "null", "..", "$", "x" * 2000]
TEXT = st.text(max_size=30)
WEIRD_TEXT = st.one_of(
    TEXT,
    st.text(alphabet=st.characters(codec="utf-8"), max_size=30),  # any code point: NUL, RTL marks, emoji
    st.sampled_from(ODD_TEXT),
)
LEAVES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    2**64,
    2**70,
    -(2**70),
    0.1,
    -0.0,
    1.0,
    25.50,
    1e308,
    5e-324,
    *(t for t in ODD_TEXT if t != "\ud800"),  # a lone surrogate makes the whole payload "not JSON": see FRAGMENTS
    *KEY_VALUES,
    "2025-01-10",
]
POOL_KEYS = ["", "a", "id", "status", "t", "game_date", "players", "events", "live", "x", "price", "timestamp", "é"]


def _json_value(rnd: random.Random, depth: int = 0) -> Any:
    r = rnd.random()
    if depth >= 4 or r < 0.5:
        return rnd.choice(LEAVES)
    if r < 0.75:
        return [_json_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    return {rnd.choice(POOL_KEYS): _json_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))}


def _rows(rnd: random.Random) -> list[Any]:
    """A list of rows: objects with some of the fields the routes read, and now and then not an object."""
    fields = ["id", "status", "t", "processed_at", "timestamp", "price", "account_id", "side", "quantity"]
    rows: list[Any] = []
    for _ in range(rnd.randint(0, 8)):
        if rnd.random() < 0.1:
            rows.append(_json_value(rnd))
            continue
        row = {f: rnd.choice([_json_value(rnd, 2), rnd.randint(0, 3), "d1"]) for f in fields if rnd.random() < 0.5}
        if rnd.random() < 0.8:
            row["id"] = rnd.choice([0, 1, 2, "a", "b", None, 1.5, [1], {"k": 1}, True])
        rows.append(row)
    return rows


def _usual_payload(rnd: random.Random) -> bytes:
    return json.dumps(
        {
            "game_date": rnd.choice(KEY_VALUES),
            "players": _rows(rnd),
            "events": _rows(rnd),
            "live": rnd.random() < 0.1,
            "v": rnd.randint(0, 3),
        }
    ).encode()


_rnd = random.Random(20260101)
JSON_POOL = [_json_value(_rnd) for _ in range(500)]
JSON_VALUES = st.sampled_from(JSON_POOL)
JSON_TEXT = st.sampled_from([json.dumps(v).encode() for v in JSON_POOL])
ROWS = st.sampled_from([json.dumps(_rows(_rnd)).encode() for _ in range(300)])
USUAL_PAYLOADS = st.sampled_from([_usual_payload(_rnd) for _ in range(500)])


def _nest(n: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * n + b"]" * n
    if kind == "object":
        return b'{"a":' * n + b"1" + b"}" * n
    return b"[" * n  # unclosed: malformed, but only after n levels


NESTED = st.builds(_nest, st.integers(1, 20_000), st.sampled_from(["list", "object", "open"]))
#: Raw JSON text, valid and not: what one field of a payload may hold.
FRAGMENTS = st.one_of(
    JSON_TEXT,
    st.sampled_from(
        [
            b"1e400",
            b"-1e400",
            b"1e-400",
            str(2**70).encode(),
            str(-(2**70)).encode(),
            str(2**64).encode(),
            b"9" * 4300,  # CPython's int_max_str_digits
            b"9" * 4301,
            b"0.1e99999",
            b"NaN",
            b"Infinity",
            b"-Infinity",
            b"nan",
            b"-0.0",
            b"1.0",
            b"1E2",
            b"null",
            b"true",
            b"{}",
            b"[]",
            b'""',
            b'"\xff\xfe"',  # invalid UTF-8 inside a string
            b'"\\ud800"',  # a lone surrogate escape
            b'"\\u0000"',
            b"[1,2",
            b"{",
            b"}",
            b"'single'",
            b'{"a":1,"a":2}',
            b'{"id":"d1","id":{"x":1}}',
        ]
    ),
    NESTED,
)
KEY_FRAGMENTS = st.one_of(st.sampled_from([json.dumps(k).encode() for k in KEY_VALUES]), FRAGMENTS)
ROW_FRAGMENTS = st.one_of(
    ROWS,
    FRAGMENTS,  # rows that are not a list at all
    st.lists(FRAGMENTS, min_size=1, max_size=3).map(lambda items: b"[" + b",".join(items) + b"]"),
)
PAYLOAD_FIELDS = (
    (b'"game_date":', KEY_FRAGMENTS),
    (b'"players":', ROW_FRAGMENTS),
    (b'"events":', ROW_FRAGMENTS),
    (b'"live":', st.one_of(st.just(b"true"), FRAGMENTS)),
    (b'"x":', FRAGMENTS),
    (b'"t":', FRAGMENTS),
)
WRAPPERS = st.sampled_from([b"[%s]", b"\xef\xbb\xbf%s", b"%s garbage", b"  %s\n", b"%s\xff", b"%s%s"])
ANY_BYTES = st.binary(max_size=200)


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """A payload aimed at the routes above: each field present or not, usual or pathological; or no object."""
    kind = draw(CHOICE)
    if kind == 7:
        return draw(JSON_TEXT)
    if kind == 8:
        return draw(st.one_of(ANY_BYTES, NESTED))
    present = draw(st.integers(0, 2 ** len(PAYLOAD_FIELDS) - 1))  # one draw for which fields are there
    fields = [name + draw(fragment) for i, (name, fragment) in enumerate(PAYLOAD_FIELDS) if present >> i & 1]
    if fields and kind == 0:
        fields.append(fields[-1])  # a duplicate key
    text = b"{" + b",".join(fields) + b"}"
    if kind == 9:
        wrapper = draw(WRAPPERS)
        text = wrapper % ((text, text) if wrapper.count(b"%s") == 2 else text)
    return text


EDGE_TIMES = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2026-01-01T00:00:00Z", "yesterday", "0"]


def _attributes(rnd: random.Random) -> dict[str, str]:
    texts = [*ODD_TEXT, *EDGE_TIMES, "id", "kind", "a", "b", "d1", "filter_fingerprint", "googclient_schemaencoding"]
    attributes = {rnd.choice(texts): rnd.choice(texts) for _ in range(rnd.randint(0, 8))}
    if rnd.random() < 0.2:  # what `replay` sets: the stale guard reads it
        attributes[ATTR_ORIGINAL_TIME] = rnd.choice([*EDGE_TIMES, *ODD_TEXT])
    return attributes


ATTRIBUTES = st.one_of(
    st.sampled_from([_attributes(_rnd) for _ in range(200)]),
    st.sampled_from([{**_attributes(_rnd), "id": "d1"} for _ in range(100)]),
    st.dictionaries(WEIRD_TEXT, WEIRD_TEXT, max_size=3),
    st.just({"": "", "id": ""}),  # empty key and empty values
    st.integers(500, 3_000).map(lambda n: {"id": "d1", **{f"a{i}": "v" * (i % 20) for i in range(n)}}),
    st.tuples(WEIRD_TEXT, st.integers(1_000, 60_000)).map(lambda t: {"id": t[0], "big": "x" * t[1]}),
)
USUAL_ATTRIBUTES = st.sampled_from(
    [{"id": k, **kind} for k in KEY_VALUES for kind in ({}, {"kind": "a"}, {"kind": "c"})]
)


def _rfc3339(parts: tuple[int, int, int, int, int, int, str, str]) -> str:
    y, mo, d, h, mi, s, frac, tz = parts
    return f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{'.' + frac if frac else ''}{tz}"


def _valid_time(rnd: random.Random) -> str:
    t = time.gmtime(rnd.randint(0, 4_102_444_800))
    frac = "".join(rnd.choice(string.digits) for _ in range(rnd.choice([0, 0, 3, 6, 9, 12])))
    tz = rnd.choice(["Z", "z", "+00:00", "-07:30", "+14:00", "-00:00"])
    return _rfc3339((t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, frac, tz))


ODD_TIMES = st.one_of(
    st.tuples(
        st.integers(0, 9999),
        st.integers(0, 13),
        st.integers(0, 32),
        st.integers(0, 25),
        st.integers(0, 61),
        st.integers(0, 61),
        st.text(alphabet=string.digits, max_size=12),
        st.sampled_from(["Z", "+99:99", "", "UTC", "+1:00"]),
    ).map(_rfc3339),
    TEXT,
)


def _usual_message(rnd: random.Random) -> dict[str, Any]:
    """Everything of a push message but its data and id, the way Pub/Sub sends it."""
    message: dict[str, Any] = {
        "attributes": {"id": rnd.choice(KEY_VALUES), **({"kind": rnd.choice("abc")} if rnd.random() < 0.3 else {})},
        "publishTime": _valid_time(rnd),
    }
    if rnd.random() < 0.2:
        message["orderingKey"] = rnd.choice(["", "k1", "é", "x" * 1000])
    if rnd.random() < 0.05:
        message["attributes"][ATTR_ORIGINAL_TIME] = rnd.choice([*EDGE_TIMES, _valid_time(rnd)])
    return message


USUAL_MESSAGES = st.sampled_from([_usual_message(_rnd) for _ in range(400)])
ABSENT = object()
#: Where an envelope fault goes, and what goes there.
FAULT_AT = st.sampled_from(
    [
        ("message",),
        ("message", "data"),
        ("message", "attributes"),
        ("message", "messageId"),
        ("message", "message_id"),
        ("message", "publishTime"),
        ("message", "publish_time"),
        ("message", "orderingKey"),
        ("message", "ordering_key"),
        ("subscription",),
        ("deliveryAttempt",),
        ("unknown",),
        ("message", "unknown"),
    ]
)
FAULT_VALUES = st.one_of(
    st.just(ABSENT),
    st.none(),
    JSON_VALUES,
    WEIRD_TEXT,
    ATTRIBUTES,
    ODD_TIMES,
    st.sampled_from([-1, 0, 2**31, 2**63, 2**70, -(2**70), 1.5, "1", True]),
)


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    """A push envelope as Pub/Sub sends it, then up to three faults put into it: a field absent, null or wrong."""
    payload = draw(payloads() if draw(CHOICE) >= 7 else USUAL_PAYLOADS)
    how = draw(CHOICE)
    if how <= 7:
        data = base64.b64encode(payload).decode()
    elif how == 8:
        data = base64.urlsafe_b64encode(payload).decode()
    else:
        data = base64.b64encode(payload).decode().rstrip("=")
    message = {**draw(USUAL_MESSAGES), "data": data, "messageId": draw(GOOD_IDS)}
    body: dict[str, Any] = {"message": message, "subscription": SUB}
    if how <= 3:
        body["deliveryAttempt"] = how + 1
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3]))):
        path, value = draw(FAULT_AT), draw(FAULT_VALUES)
        if path == ("message",) and isinstance(value, dict):
            value = dict(value)  # a later fault may edit it, and pooled values are shared
        node = body if len(path) == 1 else body.get("message")
        if not isinstance(node, dict):
            continue
        if value is ABSENT:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    text = json.dumps(body, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    if how == 9 and draw(st.booleans()):
        text = text[:-1] + b', "deep": ' + draw(NESTED) + b"}"  # nested in a field the parser skips
    return text


ROUTES_TO_POST = st.sampled_from(
    [*ROUTE_NAMES, *ROUTE_NAMES, "no-such-route", "%2e%2e", "a%2Fb", "%00", "é", "reports%20", "REPORTS", "x" * 300]
)


# --- generated: the push endpoint ------------------------------------------------------


def test_any_envelope_is_answered_with_a_2xx_or_4xx(app: Harness) -> None:
    """Whole envelopes: valid structure with random data, attributes, ids, publish times, ordering keys;
    then faults: fields absent, null, of the wrong type, out of range."""

    @settings(max_examples=2500, **SETTINGS)
    @given(route=ROUTES_TO_POST, body=envelopes())
    def case(route: str, body: bytes) -> None:
        CASES["envelopes"] += 1
        app.answered(route, body)

    case()
    app.assert_healthy()
    assert CASES["envelopes"] >= 2500
    # the generator reaches past the envelope parser: decisions were made, not only rejections
    assert app.statuses[200] > 400 and app.statuses[400] > 400, app.statuses


def test_any_payload_in_a_valid_envelope_is_answered_with_a_2xx_or_4xx(app: Harness) -> None:
    """Payloads: deep nesting, huge numbers, NaN/Infinity, duplicate keys, invalid UTF-8, non-JSON
    bytes, a key field that is an object, list, null or missing, rows that are not lists or hold
    non-objects."""

    @settings(max_examples=2500, **SETTINGS)
    @given(route=st.sampled_from(ROUTE_NAMES), data=payloads(), attributes=USUAL_ATTRIBUTES, message_id=GOOD_IDS)
    def case(route: str, data: bytes, attributes: dict[str, str], message_id: str) -> None:
        CASES["payloads"] += 1
        app.answered(route, envelope(data, message_id, attributes))

    case()
    app.assert_healthy()
    assert CASES["payloads"] >= 2500
    # both answers are reached: a payload without its key is forwarded fail-open (200) on the routes
    # that keep the default on_missing_key, so 400 (unreadable payloads, routes that reject) is rarer
    assert app.statuses[200] > 500 and app.statuses[400] > 200, app.statuses


def test_attributes_are_answered_with_a_2xx_or_4xx(app: Harness) -> None:
    """Attributes: huge maps, huge values, unicode, empty keys, the key attribute missing."""

    @settings(max_examples=600, **SETTINGS)
    @given(
        route=st.sampled_from(["by-attr", "mixed-key", "seed-001", "live", "reports"]),
        attributes=ATTRIBUTES,
        message_id=st.one_of(GOOD_IDS, WEIRD_TEXT),
    )
    def case(route: str, attributes: dict[str, str], message_id: str) -> None:
        CASES["attributes"] += 1
        data = json.dumps({"game_date": "d1", "events": [], "live": False}).encode()
        app.answered(route, envelope(data, message_id, attributes))

    case()
    app.assert_healthy()
    assert CASES["attributes"] >= 600


RANDOM_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), WEIRD_TEXT),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(WEIRD_TEXT, children, max_size=4),
    max_leaves=8,
)


def test_random_json_and_random_bytes_bodies_are_answered_with_a_4xx(app: Harness) -> None:
    """Bodies that are not envelopes: any JSON value, any bytes, a valid envelope cut short or with a byte changed."""
    valid = envelope(b'{"game_date": "d1"}', "m1")

    @settings(max_examples=1000, **SETTINGS)
    @given(
        route=ROUTES_TO_POST,
        body=st.one_of(
            RANDOM_JSON.map(lambda v: json.dumps(v).encode()),
            JSON_TEXT,
            ANY_BYTES,
            st.integers(0, len(valid)).map(lambda n: valid[:n]),
            st.tuples(st.integers(0, len(valid) - 1), st.integers(0, 255)).map(
                lambda t: valid[: t[0]] + bytes([t[1]]) + valid[t[0] + 1 :]
            ),
            FRAGMENTS,
        ),
    )
    def case(route: str, body: bytes) -> None:
        CASES["bodies"] += 1
        app.answered(route, body)

    case()
    app.assert_healthy()
    assert CASES["bodies"] >= 1000


def test_bodies_over_the_size_limit_answer_413(app: Harness) -> None:
    """Over `server.max_body`: 413, whether the length is declared or the body is streamed."""

    async def chunks(size: int, chunk: int) -> AsyncIterator[bytes]:
        for start in range(0, size, chunk):
            yield b"x" * min(chunk, size - start)

    @settings(max_examples=200, **SETTINGS)
    @given(
        route=st.sampled_from(ROUTE_NAMES),
        excess=st.integers(1, 3 * MAX_BODY),
        streamed=st.booleans(),
        chunk=st.integers(1024, 32 * 1024),
    )
    def case(route: str, excess: int, streamed: bool, chunk: int) -> None:
        CASES["oversize"] += 1
        size = MAX_BODY + excess
        body: Any = chunks(size, chunk) if streamed else b"{" + b" " * (size - 2) + b"}"
        r = app.answered(route, body)
        assert r.status_code == 413, r.text

    case()
    app.assert_healthy()
    assert CASES["oversize"] >= 200


def test_wrong_content_types_are_answered_with_a_2xx_or_4xx(app: Harness) -> None:
    """The body, not the content type, tells an envelope from junk. Never a 5xx either way."""

    @settings(max_examples=400, **SETTINGS)
    @given(
        content_type=st.one_of(
            st.sampled_from(
                [
                    "text/plain",
                    "application/octet-stream",
                    "application/x-www-form-urlencoded",
                    "multipart/form-data; boundary=xyz",
                    "application/json; charset=latin-1",
                    "application/json; charset=utf-16",
                    "",
                    ";;;",
                ]
            ),
            st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60),
        ),
        valid=st.booleans(),
        message_id=GOOD_IDS,
    )
    def case(content_type: str, valid: bool, message_id: str) -> None:
        CASES["content_types"] += 1
        body = envelope(b'{"game_date": "d2"}', message_id) if valid else b"a=1&b=2"
        r = app.answered("reports", body, headers={"content-type": content_type})
        assert r.status_code == (200 if valid else 400), r.text

    case()
    app.assert_healthy()
    assert CASES["content_types"] >= 400


# --- generated: configs ----------------------------------------------------------------
# Configs are made like envelopes: valid routes (this file's), then up to four faults,
# each a field set to a value that fits it or to junk, or removed; sometimes a whole
# section or the route list replaced by junk.

JUNK = st.sampled_from([*JSON_POOL[:200], 2**70, -(2**70), float("nan"), float("inf"), -0.0, "", [], {}])
PATHS = [
    "payload",
    "payload.a",
    "payload.a.b",
    "payload.players",
    "attributes.id",
    "attributes",
    "attributes.a.b",
    "payload.",
    "payload..a",
    ".a",
    "body.a",
    "",
    "payload.0",
    "payload.a b",
    "Payload.a",
]
DURATIONS = [
    "90s",
    "15m",
    "24h",
    "7d",
    "500ms",
    "0s",
    "-1s",
    "1.5h",
    " 2 m ",
    "1y",
    "s",
    "\u0661\u0662s",
    "1e3s",
    90,
    0,
    -5,
    0.001,
    2**70,
    float("nan"),
    float("inf"),
    True,
]
CONDITIONS = [
    {"field": "payload.live", "equals": True},
    {"field": "attributes.kind", "in": ["a", "b"]},
    {"field": "payload.x", "exists": True},
    {"field": "payload.x"},
    {"field": "payload.x", "equals": 1, "exists": True},
    {"field": "payload.x", "in": "ab"},
    {"field": "nowhere.x", "exists": False},
    {"field": "payload.x", "equals": None},
    {"field": "payload.x", "other": 1},
    {"equals": 1},
]
NAMES = ["id", "status", "t", "price", "a.b", "", "é", "\x00", "f" * 300]
FIELD_VALUES: dict[str, list[Any]] = {
    "name": ["r1", "r2", "a" * 63, "a" * 64, "-bad", "x y", "é", 5],
    "subscription": ["raw", "projects/p/subscriptions/raw", "", "/"],
    "destination": ["phase3", "projects/p/topics/t", ""],
    "key": [[p] for p in PATHS] + [PATHS[:3], [], "payload.a"],
    "rows": PATHS,
    "row_key": [[n] for n in NAMES] + [NAMES[:3], [], "id"],
    "include": [[n] for n in NAMES] + [NAMES[:4], [], "id"],
    "exclude": [[n] for n in NAMES] + [NAMES[2:5], [], "t"],
    "window": DURATIONS,
    "mode": ["enforce", "shadow", "off", "ENFORCE"],
    "scheme": ["canonical", "data_hash", "event", "md5"],
    "on_store_error": ["forward", "retry", "drop"],
    "on_missing_key": ["forward", "reject", "retry"],
    "stale": ["suppress", "forward", "keep"],
    "bypass": [*CONDITIONS, [*CONDITIONS[:3]], [CONDITIONS[3]], []],
    "in": [["a"]],
    "typo": [1],
}
SECTION_VALUES: dict[tuple[str, ...], list[Any]] = {
    ("lease", "duration"): DURATIONS,
    ("lease", "heartbeat"): DURATIONS,
    ("lease", "ack_deadline"): DURATIONS,
    ("server", "max_body"): ["10MiB", "1 KB", "5GB", "-1", -1, 0, 2**70, "1.5MiB"],
    ("server", "shutdown_budget"): DURATIONS,
    ("server", "shutdown_grace"): ["10s"],
    ("store_errors", "timeout"): DURATIONS,
    ("store_errors", "budget"): DURATIONS,
    ("store", "backend"): ["sqlite", "firestore", "redis", None],
    ("store", "path"): ["x.db", "", 5],
    ("publisher", "backend"): ["outbox", "pubsub", "kafka"],
    ("publisher", "timeout"): DURATIONS,
    ("records", "backend"): ["sqlite", "bigquery", "csv"],
    ("records", "batch_size"): [1, 0, -1, "x", 2**70],
    ("records", "partition_expiration_days"): [1, 0, 90.5],
    ("auth", "audience"): ["https://a", "", 5],
    ("auth", "issuers"): [["https://accounts.google.com"], "x", []],
    ("state_ttl",): DURATIONS,
    ("project",): ["p", 5, None],
    ("unknown_section",): [1],
}
ROUTE_FAULTS = st.one_of(
    *(
        st.tuples(st.just(field), st.one_of(st.sampled_from([*values, ABSENT]), JUNK))
        for field, values in FIELD_VALUES.items()
    )
)
SECTION_FAULTS = st.one_of(
    *(st.tuples(st.just(path), st.one_of(st.sampled_from(values), JUNK)) for path, values in SECTION_VALUES.items())
)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    routes: Any = [dict(r) for r in draw(st.lists(st.sampled_from(ROUTES), min_size=1, max_size=3))]
    raw: dict[str, Any] = {"routes": routes}
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 2, 3, 4]))):
        where = draw(CHOICE)
        if where <= 5:
            field, value = draw(ROUTE_FAULTS)
            route = routes[draw(st.integers(0, len(routes) - 1))]
            if value is ABSENT:
                route.pop(field, None)
            else:
                route[field] = value
        elif where <= 8:
            path, value = draw(SECTION_FAULTS)
            if len(path) == 1:
                raw[path[0]] = value
            elif isinstance(raw.setdefault(path[0], {}), dict):
                raw[path[0]][path[1]] = value
        else:
            target = draw(st.sampled_from(["routes", "lease", "server", "store", "records", "auth"]))
            raw[target] = draw(JUNK)
    if isinstance(raw["routes"], list) and draw(CHOICE) == 0:
        raw["routes"].append(draw(JUNK))  # a route that is not a mapping
    return raw


#: `where: what`, where is the location (`route 'x': window`, `routes[2]`, `lease`, `(top level)`, ...).
PROBLEM = re.compile(r"^(?P<where>.+?): (?P<what>.+)$", re.S)


def test_any_route_config_validates_or_names_every_problem() -> None:
    """`parse` either returns a config that compiles, or raises ConfigError whose problems each name where."""

    @settings(max_examples=3000, **SETTINGS)
    @given(raw=configs())
    def case(raw: dict[str, Any]) -> None:
        CASES["configs"] += 1
        try:
            cfg = parse(raw, "generated.yaml")
        except ConfigError as exc:
            assert exc.problems, raw
            for problem in exc.problems:
                m = PROBLEM.match(problem)
                assert m and m["where"].strip() and m["what"].strip(), problem
            assert str(exc).startswith("generated.yaml: ")
            return
        for route in cfg.routes:  # a config that validates compiles, and its schemes take any bytes
            rules = RouteRules(route)
            for data in (b'{"k": 1, "a": {"b": [1]}, "players": [{"id": 1}]}', b"[]", b"\xff"):
                with contextlib.suppress(PayloadError):  # the payload does not fit the route's shape
                    rules.scheme(data)

    case()
    assert CASES["configs"] >= 3000


# --- regressions: minimal examples of the bugs found while writing these generators ---


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def test_regression_a_payload_nested_10000_deep_is_answered_not_crashed(app: Harness) -> None:
    """Was a RecursionError out of the fingerprint's JSON decode: 500 on every route."""
    for route in ROUTE_NAMES:
        for data in (_deep(10_000), b"[" * 10_000, b'{"game_date": "d1", "x": ' + _deep(10_000) + b"}"):
            r = app.answered(route, envelope(data, f"deep-{route}-{len(data)}"))
            # an attribute-keyed route fingerprints what it cannot decode as raw bytes; a payload-keyed
            # one cannot read its key there: forwarded fail-open, or 400 where the route says reject
            assert r.status_code == (400 if route in REJECTS_KEYLESS else 200), (route, r.text)
    app.assert_healthy()


def test_regression_an_envelope_nested_10000_deep_answers_400(app: Harness) -> None:
    """Was a RecursionError out of the envelope decoder (an unknown field is skipped recursively): 500."""
    for body in (
        b'{"message": {"messageId": "1"}, "x": ' + _deep(10_000) + b"}",
        b'{"x": ' + _deep(10_000) + b', "message": {"messageId": "1"}}',
        b'{"message": {"messageId": "1", "x": ' + b'{"a":' * 10_000 + b"1" + b"}" * 10_000 + b"}}",
    ):
        r = app.answered("by-attr", body)
        assert r.status_code == 400 and "nested too deeply" in r.json()["reason"], r.text
    app.assert_healthy()


def test_regression_rows_nested_just_under_the_decoder_limit_are_answered(app: Harness) -> None:
    """Was a RecursionError out of the fingerprint digest, for payloads the decoder had just managed:
    seed 001's `json.dumps` of the events, seed 002's `str()` of a row, sorting rows by deep keys."""
    limit = 0
    for n in range(100, 3000, 10):  # the decoder's depth limit at this stack depth
        try:
            msgspec.json.decode(_deep(n))
        except RecursionError:
            limit = n
            break
    assert limit, "msgspec decoded 3000 levels: the sweep below needs a new range"
    for n in range(max(1, limit - 100), limit + 10):
        deep = _deep(n).decode()
        for route, row in (
            ("seed-001", f'{{"timestamp": {deep}}}'),
            ("seed-002", f'{{"id": {deep}}}'),
            ("players", f'{{"id": {deep}, "status": 1}}'),
            ("players-generic", f'{{"id": {deep}}}'),
        ):
            data = f'{{"game_date": "d1", "players": [{row}, {row}], "events": [{row}, {row}]}}'.encode()
            app.answered(route, envelope(data, f"near-{n}", {"id": "d1"}))
    app.assert_healthy()


def test_regression_a_delivery_attempt_beyond_int64_does_not_poison_the_decision_records(app: Harness) -> None:
    """Was accepted, then failed the whole SQLite batch of decision records it landed in
    (OverflowError binding the INTEGER column): every decision around it was lost."""
    for i in range(3):
        app.answered("by-attr", envelope(b"x", f"good-{i}", {"id": f"k{i}"}))
    body = b'{"message": {"messageId": "poison", "attributes": {"id": "p"}}, "deliveryAttempt": %d}' % 2**70
    r = app.answered("by-attr", body)
    assert r.status_code == 400 and "deliveryAttempt" in r.json()["reason"], r.text
    app.runner.run(app.recorder.flush())
    assert (app.recorder.written, app.recorder.dropped) == (4, 0)
    app.assert_healthy()


def test_regression_a_content_length_of_a_non_ascii_digit_is_not_a_500(app: Harness) -> None:
    """Fixed in filter/pubsub_filter/push/app.py `_body`: `'²'.isdigit()` is True but `int('²')` raises ValueError.

    Starlette decodes headers as latin-1, so `Content-Length: \\xb2` reaches `_body` as '²'.
    uvicorn's parsers reject such a header before the app sees it, so only an ASGI server
    that does not (or a test client) can trigger it.
    """
    r = app.post("by-attr", envelope(b"x", "cl"), headers={"content-length": b"\xb2"})
    assert r.status_code < 500


def test_regression_a_duration_beyond_float_range_is_a_config_error() -> None:
    """Fixed in core/config/schema.py `parse_duration`: `float(10**400)` raises OverflowError, which
    pydantic does not turn into a validation error, so it escapes `parse` as itself."""
    raw = {"routes": [{"name": "r", "destination": "phase3", "key": ["payload.k"], "window": 10**400}]}
    with pytest.raises(ConfigError) as exc:
        parse(raw)
    assert exc.value.problems and exc.value.problems[0].startswith("route 'r': window: ")
