"""Push requests in every form Pub/Sub sends, generated from valid ones and mutated, on the app as
`serve` runs it (its lifespan, the SQLite store, the inline SQLite decision records).

Each case is a valid push (a wrapped envelope, an unwrapped push with its metadata headers, or
bare data) that hypothesis then breaks where it chooses: fields dropped or of the wrong type,
bad base64, duplicate JSON keys, odd spellings and times, huge, unicode and forged attributes,
metadata headers missing, repeated or not UTF-8, odd content types and lengths, bodies in
chunks. The contract, per request: never a 5xx or an exception, a 2xx is an acked decision, a
4xx a recorded rejection. After the run: no log line with a traceback, every answered decision
recorded, every forward published once, and the app healthy (a valid push of each form is
still forwarded).

`make fuzz` runs it with `PUSH_FUZZ_EXAMPLES=12000`; the suite runs `DEFAULT_EXAMPLES`.
Derandomized: every run sends the same cases for the same count.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.model import ACKED
from tests.support.asgi import call
from tests.support.clock import ManualClock
from tests.support.jsonlogs import JsonLines, production_logs
from tests.support.serve import records
from tests.support.served import Downstream, ServedPush, StallingPublisher

pytestmark = pytest.mark.faults

DEFAULT_EXAMPLES = 3000
EXAMPLES = int(os.environ.get("PUSH_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
MAX_BODY = 64 * 1024
SUB = "projects/p/subscriptions/raw-reports"
ROUTES: list[dict[str, Any]] = [
    {"name": "reports", "destination": "phase3", "key": ["payload.game_date"], "subscription": "raw-reports"},
    {"name": "by-attr", "destination": "phase3", "key": ["attributes.id"], "window": "1h"},
    {
        "name": "unwrapped",
        "destination": "phase3",
        "key": ["attributes.id", "payload.game_date"],
        "push_format": "unwrapped",
        "bypass": [{"field": "attributes.kind", "equals": "live"}],
    },
    {
        "name": "bare",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "row_key": ["id"],
        "push_format": "unwrapped_no_metadata",
    },
]
ROUTE_NAMES = [r["name"] for r in ROUTES]

# --- the valid messages ---------------------------------------------------------------------------

KEYS = ["d1", "d2", "d3"]  # few keys: suppress, change and redelivery paths all get hit
PAYLOADS = [
    json.dumps({"game_date": k, "players": [{"id": i, "status": s} for i in range(n)], "v": v}).encode()
    for k in KEYS
    for n, s, v in ((1, "out", 0), (2, "in", 1), (0, "out", 2))
]
ODD_PAYLOADS = [
    b"",
    b"not json",
    b"\xff\xfe\x00",
    b"[1, 2]",
    b'{"game_date": null}',
    b'{"game_date": "d1", "game_date": {"x": 1}}',
    b'{"game_date": "d1", "players": "nope"}',
    b"[" * 5000,
    b'{"message": {"messageId": "m1", "publishTime": "2999-01-01T00:00:00Z"}, "subscription": "s"}',
    "😀\u202e".encode(),
    b"9" * 5000,
    b"x" * (MAX_BODY + 1),  # over the limit as it stands: 413
]
ATTRIBUTE_SETS: list[dict[str, str]] = [
    {"id": "k1"},
    {"id": "k2", "kind": "live"},
    {"id": "k1", "Source": "Scraper", "run": "r 1"},
    {},
    {"id": "é😀", "ünï": "\u202e"},
    {"id": "k3", "filter_fingerprint": "sha256:" + "0" * 64, "filter_replay_original_publish_time": "2999-01-01T00Z"},
    {"id": "k1", "big": "v" * 1024, "bigger": "w" * 5000},
    {f"a{i}": str(i) for i in range(150)} | {"id": "k2"},
    {"id": "k1", "": "empty name", " ": "space"},
]
IDS = [f"m{i}" for i in range(24)]  # redeliveries now and then
TIMES = ["2026-01-01T00:00:00Z", "2026-01-01T00:00:01.123456789Z", "2025-12-31T23:59:59+01:00"]
ODD_VALUES: list[Any] = [None, 0, -1, 2**64, 1.5, True, [], {}, "", "x" * 3000, "\ud800", "😀", "yesterday"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- mutations ----------------------------------------------------------------------------------------


FIELDS = ["data", "messageId", "publishTime", "attributes", "message", "subscription"]


def mutate_envelope(env: dict[str, Any], op: int, which: int, value: Any) -> None:
    m = env["message"] if isinstance(env.get("message"), dict) else None
    name = FIELDS[which % len(FIELDS)]
    if op == 0 and m is not None:  # a field dropped
        (m if which < 4 else env).pop(name, None)
    elif op == 1:  # a field of the wrong type
        (m if m is not None and which < 4 else env)[name] = value
    elif op == 2 and m is not None:  # bad base64
        data = str(m.get("data", ""))
        m["data"] = [data.rstrip("="), data + "*", data.replace("A", "-"), " " + data, "====", data[:-1]][which]
    elif op == 3 and m is not None:  # the other spelling
        for camel, snake in (("messageId", "message_id"), ("publishTime", "publish_time")):
            if camel in m:
                m[snake] = m.pop(camel)
    elif op == 4 and m is not None:
        m["publishTime"] = ["2999-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "2026-13-40T99:99:99Z", value][which % 4]
    elif op == 5:
        env["deliveryAttempt"] = value
    elif op == 6:
        env["subscription"] = "projects/p/subscriptions/other"


def raw_mutation(body: bytes, op: int) -> bytes:
    """Mutations below JSON: duplicate keys, garbage around it, a cut, a byte that is not UTF-8."""
    if op == 0:
        return body.replace(b'{"message": {', b'{"message": {"messageId": "m0", ', 1)
    if op == 1:
        return body[:-1] + b', "message": {"messageId": "m1", "data": ""}}'
    if op == 2:
        return b"\xef\xbb\xbf" + body
    if op == 3:
        return body + b" garbage"
    if op == 4:
        return body[: len(body) // 2]
    if op == 5:
        return body.replace(b'"m', b'"\xffm', 1)
    return body


def wrapped(payload: bytes, attributes: dict[str, str], mid: str, ops: list[tuple[int, int, Any]], raw: int) -> bytes:
    message = {"data": b64(payload), "attributes": attributes, "messageId": mid, "publishTime": TIMES[len(mid) % 3]}
    env: dict[str, Any] = {"message": message, "subscription": SUB}
    for op, which, value in ops:
        mutate_envelope(env, op, which, value)
    try:
        body = json.dumps(env, ensure_ascii=raw % 2 == 0).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        body = b"{}"
    return raw_mutation(body, raw)


Header = tuple[bytes, bytes]


def metadata(attributes: dict[str, str], mid: str, ops: list[int]) -> list[Header]:
    headers: list[Header] = [
        (b"x-goog-pubsub-subscription-name", SUB.encode()),
        (b"x-goog-pubsub-message-id", mid.encode()),
        (b"x-goog-pubsub-publish-time", TIMES[len(mid) % 3].encode()),
    ]
    headers += [
        (k.lower().encode("utf-8", "surrogatepass"), v.encode("utf-8", "surrogatepass")) for k, v in attributes.items()
    ]
    for op in ops:
        if op == 0:
            headers = [h for h in headers if h[0] != b"x-goog-pubsub-message-id"] + [
                (b"x-goog-pubsub-publish-time", b"x")
            ]
        elif op == 1:
            headers.append((b"x-goog-pubsub-message-id", b"m99"))
        elif op == 2:
            headers.append((b"x-goog-pubsub-message-id", b""))
        elif op == 3:
            headers.append((b"id", b"\xff\xfe"))
        elif op == 4:
            headers += [(b"id", b"k1"), (b"id", b"K1")]  # `Id` and `id`
        elif op == 5:
            headers.append((b"x-goog-pubsub-ordering-key", "ké".encode()))
        elif op == 6:
            headers += [(b"content-type", b"text/plain"), (b"authorization", b"Bearer x"), (b"x-goog-other", b"1")]
        elif op == 7:
            headers.append((b"x-goog-pubsub-publish-time", b"2999-01-01T00:00:00Z"))
        elif op == 8:
            headers = [(b"x-goog-pubsub-message-id", ("é" * 300).encode()), *headers[2:]]
    return headers


EXTRA_HEADERS: list[list[Header]] = [
    [],
    [(b"content-type", b"application/json")],
    [(b"content-type", b"application/octet-stream")],
    [(b"content-type", b"text/plain; charset=utf-16")],
    [(b"content-type", b"multipart/form-data; boundary=")],
    [(b"x-cloud-trace-context", b"not/a;trace")],
    [(b"traceparent", b"00-zz-zz-01")],
    [(b"content-encoding", b"gzip")],
    [(b"content-length", b"abc")],
    [(b"content-length", b"99999999999999999999")],
    [(b"content-length", "٣".encode())],
    [(b"transfer-encoding", b"chunked"), (b"content-length", b"")],
]


@dataclass
class Push:
    route: str
    form: str
    chunks: list[bytes]
    headers: list[Header] = field(default_factory=list)


@st.composite
def pushes(draw: st.DrawFn) -> Push:
    form = draw(st.sampled_from(["wrapped", "metadata", "bare"]))
    route = draw(st.sampled_from([*ROUTE_NAMES, *ROUTE_NAMES, "nope"]))
    payload = draw(st.sampled_from(PAYLOADS) if draw(st.integers(0, 9)) < 8 else st.sampled_from(ODD_PAYLOADS))
    attributes = draw(st.sampled_from(ATTRIBUTE_SETS))
    mid = draw(st.sampled_from(IDS))
    headers: list[Header] = []
    if form == "wrapped":
        ops = draw(st.lists(st.tuples(st.integers(0, 10), st.integers(0, 5), st.sampled_from(ODD_VALUES)), max_size=3))
        body = wrapped(payload, attributes, mid, ops, draw(st.integers(0, 14)))
    else:
        body = payload
        if form == "metadata":
            headers = metadata(attributes, mid, draw(st.lists(st.integers(0, 14), max_size=2)))
    headers += draw(st.sampled_from(EXTRA_HEADERS))
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=3)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    return Push(route, form, chunks, headers)


# --- the app ------------------------------------------------------------------------------------------


class Fuzzed:
    """The served app on one event loop, and what it answered."""

    def __init__(self, runner: asyncio.Runner, tmp_path: Path) -> None:
        self.runner = runner
        self.downstream = Downstream()
        config = parse({"server": {"max_body": MAX_BODY}, "routes": ROUTES})
        self.served = ServedPush(config, tmp_path, StallingPublisher(self.downstream), ManualClock())
        runner.run(self.served.start())
        self.answered: Counter[tuple[str, str, str]] = Counter()  # (route, message id, decision) of each 2xx
        self.rejected: Counter[str] = Counter()  # route → 4xx answers
        self.statuses: Counter[int] = Counter()

    def send(self, push: Push) -> tuple[int, dict[str, Any]]:
        lengths = {name for name, _ in push.headers} & {b"content-length", b"transfer-encoding"}
        headers = (
            push.headers if lengths else [(b"content-length", str(sum(map(len, push.chunks))).encode()), *push.headers]
        )
        status, body = self.runner.run(
            call(self.served.app, "POST", f"/push/{push.route}", headers=headers, chunks=push.chunks)
        )
        self.statuses[status] += 1
        assert status < 500, (status, body[:500], push)
        answer = msgspec.json.decode(body)
        if status < 300:
            assert answer["decision"] in {str(d) for d in ACKED}, answer
            self.answered[(push.route, answer["message_id"], answer["decision"])] += 1
        else:
            assert status in (400, 404, 413) and answer["decision"] == "rejected" and answer["reason"], answer
            self.rejected[push.route] += 1
        return status, answer

    def assert_healthy_and_recorded(self, logs: JsonLines) -> None:
        status, body = self.runner.run(call(self.served.app, "GET", "/healthz"))
        assert (status, msgspec.json.decode(body)["status"]) == (200, "ok")
        assert self.served.engine.in_flight == 0
        fresh = json.dumps({"game_date": "fresh", "players": [{"id": 1}], "id": "fresh"}).encode()
        for form, route, push in (
            ("wrapped", "reports", Push("reports", "wrapped", [wrapped(fresh, {}, "fresh-1", [], 99)])),
            ("metadata", "unwrapped", Push("unwrapped", "metadata", [fresh], metadata({"id": "fresh"}, "fresh-2", []))),
            ("bare", "bare", Push("bare", "bare", [fresh])),
        ):
            assert self.send(push)[1]["decision"] == "forwarded", (form, route)
        forwards = sum(n for (_, _, d), n in self.answered.items() if d in ("forwarded", "fail_open"))
        assert len(self.downstream.landed) == forwards  # every forward published, none twice
        self.runner.run(self.served.shutdown(grace=5.0))  # the engine's close: every record written
        rows = records(self.served.records_path)
        recorded = Counter((r["route"], r["message_id"], r["decision"]) for r in rows)
        missing = self.answered - recorded
        assert not missing, f"answered but not recorded: {list(missing.items())[:5]}"
        for route, n in self.rejected.items():
            assert sum(1 for r in rows if r["route"] == route and r["decision"] == "rejected") >= n, route
        assert not logs.bad, logs.bad[:3]
        assert not logs.tracebacks, logs.tracebacks[:3]


@pytest.fixture
def fuzzed(tmp_path: Path) -> Iterator[tuple[Fuzzed, JsonLines]]:
    with production_logs() as logs, asyncio.Runner() as runner:
        yield Fuzzed(runner, tmp_path), logs


def test_any_push_in_any_form_is_answered_recorded_and_leaves_the_app_healthy(
    fuzzed: tuple[Fuzzed, JsonLines],
) -> None:
    app, logs = fuzzed

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(pushes())
    def run(push: Push) -> None:
        app.send(push)

    run()
    app.assert_healthy_and_recorded(logs)
    answered = {str(d) for (_, _, d) in app.answered}
    assert {"forwarded", "suppressed", "duplicate"} <= answered, answered  # the decisions were reached, not only 4xx
    assert {200, 400, 413} <= set(app.statuses), app.statuses
    print(f"\npush fuzz: {app.statuses.total()} requests, statuses {dict(app.statuses)}")
