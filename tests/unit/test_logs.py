"""The log line schema: one Cloud Logging JSON line per decision, lifecycle events alike, no payload or token ever.

Decisions run through a real `Engine` (SQLite store, in-memory publisher and recorder)
and `pubsub_filter.observability.logsetup` writes to a StringIO; every line is parsed back.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.heartbeat import Heartbeat
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.model import Decision, DecisionRecord, KeyState, Lease, Message
from pubsub_filter.core.ports import StoreUnavailable
from pubsub_filter.google.shared import PROJECT_ENVS, detect_project
from pubsub_filter.observability import logsetup
from pubsub_filter.push.app import create_app
from pubsub_filter.push.auth import PushAuthenticator
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder, SwitchStore
from tests.support.oidc import LocalGoogleCerts, google_claims

PROJECT = "my-project"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SECRET = "S3CRET-PAYLOAD-7f3a"  # in every payload sent; must never be logged
TOKEN_MARK = "S3CRET-TOKEN"
TRACE_FIELD = "logging.googleapis.com/trace"
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
FP = re.compile(r"^sha256:[0-9a-f]{64}$")
LEVELS = {
    "forwarded": "INFO",
    "suppressed": "INFO",
    "duplicate": "INFO",
    "contended": "INFO",
    "superseded": "INFO",
    "stale": "WARNING",
    "noise_only": "INFO",
    "fail_open": "ERROR",
    "rejected": "WARNING",
    "failed": "ERROR",
}
ROUTES: list[dict[str, Any]] = [
    {"name": "reports", "destination": "phase3", "key": ["payload.game_date"], "exclude": ["scraped"]},
    {"name": "shadowed", "destination": "phase3", "key": ["payload.game_date"], "mode": "shadow"},
    {"name": "strict", "destination": "phase3", "key": ["payload.game_date"], "on_store_error": "retry"},
    {"name": "raw", "destination": "phase3", "key": ["attributes.id"]},
    {
        "name": "audited",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "exclude": ["scraped"],
        "audit_sample": 1,
    },
    {
        "name": "coalesced",
        "destination": "phase3",
        "key": ["payload.game_date"],
        "coalesce": {"quiet": "1s", "max_wait": "2s"},
    },
]


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_structlog(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("LOG_FORMAT", "LOG_LEVEL", "K_SERVICE", *PROJECT_ENVS):
        monkeypatch.delenv(name, raising=False)
    saved = structlog.get_config()
    stream = logsetup._OUT.stream
    yield
    structlog.configure(**saved)
    logsetup._OUT.stream = stream


def lines_of(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def decisions_of(out: io.StringIO) -> list[dict[str, Any]]:
    return [line for line in lines_of(out) if line["message"] == "decision"]


def events_of(out: io.StringIO, name: str) -> list[dict[str, Any]]:
    return [line for line in lines_of(out) if line["message"] == name]


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.config = parse({"routes": ROUTES})
        self.clock = ManualClock()
        self.store = SwitchStore(SqliteStore(tmp_path / "state.db"))
        self.publisher = MemoryPublisher()
        self.recorder = MemoryRecorder()
        self.engine = Engine(self.config, self.store, self.publisher, self.recorder, self.clock, "test")
        self.ids = 0

    def message(self, payload: Any, *, message_id: str | None = None, **kw: Any) -> Message:
        if message_id is None:
            self.ids += 1
            message_id = f"m{self.ids}"
        data = payload if isinstance(payload, bytes) else json.dumps({**payload, "secret": SECRET}).encode()
        return Message(data=data, attributes=kw.pop("attributes", {}), message_id=message_id, **kw)

    async def send(self, route: str, payload: Any, trace: str | None = None, **kw: Any) -> DecisionRecord:
        return (await self.engine.handle(route, self.message(payload, **kw), trace)).record


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def every_decision(w: World) -> list[DecisionRecord]:
    """One message per Decision value (plus a takeover, a release and a commit refusal on the way)."""
    recs = [
        await w.send("reports", {"game_date": "d1", "v": 1}, message_id="a1", publish_time=100.0, delivery_attempt=1),
        await w.send("reports", {"game_date": "d1", "v": 1, "scraped": "13:00"}, publish_time=110.0),
        await w.send("reports", {"game_date": "d1", "v": 1}, message_id="a1", publish_time=100.0, delivery_attempt=2),
        await w.send("reports", {"game_date": "d1", "v": 2}, publish_time=50.0),
    ]
    # another instance holds d2, live: different content is contended
    now = w.clock.now()
    lease = Lease(holder="other/1", fence=1, expires_at=now + 120, fingerprint="sha256:" + "0" * 64, message_id="x")
    assert await w.store.claim("reports", "d2", None, KeyState(fence=1, lease=lease)) is not None
    recs.append(await w.send("reports", {"game_date": "d2", "v": 1}))
    # ... until its lease expires: taken over and forwarded
    w.clock.advance(121)
    recs.append(await w.send("reports", {"game_date": "d2", "v": 1}))
    # the store goes down: fail open by default, failed where the route says retry
    w.store.down = True
    recs.append(await w.send("reports", {"game_date": "d3"}))
    recs.append(await w.send("strict", {"game_date": "d3"}))
    w.store.down = False
    # a publish fails: the lease is released, the message nacked
    w.publisher.fail_next = 1
    recs.append(await w.send("reports", {"game_date": "d4"}))
    # not understood: no key, and a route nobody configured
    recs.append(await w.send("raw", b"\x00\xff" + SECRET.encode()))
    recs.append(await w.send("nowhere", {"game_date": "d1"}))
    # a non-JSON payload is still decided (and never logged)
    recs.append(await w.send("raw", b"\x00\xff not json " + SECRET.encode(), attributes={"id": "r1"}))
    # shadow mode: forwards, records what it would have done
    recs.append(await w.send("shadowed", {"game_date": "d1"}))
    recs.append(await w.send("shadowed", {"game_date": "d1"}))
    # the noise audit (every suppression sampled here) finds an excluded field changed
    recs.append(await w.send("audited", {"game_date": "d1", "scraped": "09:00"}))
    recs.append(await w.send("audited", {"game_date": "d1", "scraped": "13:00"}))
    # the commit after a publish is refused, or fails
    w.store.commit_refused = True
    recs.append(await w.send("reports", {"game_date": "d5"}))
    w.store.commit_refused, w.store.commit_fails = False, True
    recs.append(await w.send("reports", {"game_date": "d6"}))
    w.store.commit_fails = False
    # a burst on a coalesce route: the older message superseded while the newer is held; a stop
    # decides what is held at once
    older = asyncio.ensure_future(w.send("coalesced", {"game_date": "d7", "v": 1}, publish_time=200.0))
    await asyncio.sleep(0)
    newer = asyncio.ensure_future(w.send("coalesced", {"game_date": "d7", "v": 2}, publish_time=201.0))
    recs.append(await older)
    w.engine.decide_held()
    recs.append(await newer)
    return recs


# --- the decision line --------------------------------------------------------------


async def test_every_decision_is_one_json_line_with_the_schema(world: World) -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", project=PROJECT, stream=out, cache=False)
    recs = await every_decision(world)
    assert {r.decision for r in recs} == set(Decision), "the scenario must produce every Decision value"

    lines = decisions_of(out)
    assert len(lines) == len(recs) == len(world.recorder.records)
    for rec, line in zip(recs, lines, strict=True):
        d = str(rec.decision)
        assert line["decision"] == d
        assert line["severity"] == LEVELS[d]
        assert line["message"] == "decision"
        assert TIME.match(line["time"]), line["time"]
        assert line["route"] == rec.route
        assert line["enforced"] is rec.enforced
        assert line["message_id"] == rec.message_id
        assert isinstance(line["latency_ms"], float) and line["latency_ms"] >= 0
        assert line["logging.googleapis.com/labels"] == {
            "component": "pubsub-filter",
            "route": rec.route,
            "decision": d,
        }
        assert "trace" not in line and "logging.googleapis.com/trace" not in line  # no trace header given
        if rec.key is not None:  # everything but the rejected ones
            assert line["key"] == rec.key
            assert FP.match(line["fingerprint"]) and line["fingerprint"] == rec.fingerprint
            assert FP.match(line["message_fingerprint"])
        if rec.fence is not None:
            assert line["fence"] == rec.fence
        else:
            assert "fence" not in line
        if rec.reason:
            assert line["reason"] == rec.reason
    by_id = {
        (line["route"], line["message_id"], line["delivery_attempt"]) for line in lines if "delivery_attempt" in line
    }
    assert by_id == {("reports", "a1", 1), ("reports", "a1", 2)}
    forwarded = [line for line in lines if line["decision"] == "forwarded"]
    assert all(line["fence"] >= 1 and line["published_id"] for line in forwarded)
    changed = [line for line in lines if line.get("previous_fingerprint")]
    assert changed and all(FP.match(line["previous_fingerprint"]) for line in changed)
    shadow = [line for line in lines if line["route"] == "shadowed"]
    assert [(s["decision"], s["enforced"]) for s in shadow] == [("forwarded", False), ("suppressed", False)]


async def test_lifecycle_events_are_lines_of_the_same_shape(world: World) -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", project=PROJECT, stream=out, cache=False)
    await every_decision(world)
    expected = {
        "lease_taken_over": "WARNING",
        "store_unavailable": "ERROR",
        "lease_released": "INFO",
        "commit_refused": "WARNING",
        "commit_failed": "ERROR",
    }
    for name, severity in expected.items():
        events = events_of(out, name)
        assert events, f"no {name} line"
        for e in events:
            assert e["severity"] == severity
            assert TIME.match(e["time"])
            assert e["route"] and e["logging.googleapis.com/labels"]["route"] == e["route"]
            assert "decision" not in e["logging.googleapis.com/labels"]
    taken = events_of(out, "lease_taken_over")[0]
    assert (taken["key"], taken["previous_holder"], taken["previous_fence"], taken["fence"]) == ("d2", "other/1", 1, 2)
    assert taken["expired_for_s"] == 1.0
    assert events_of(out, "store_unavailable")[0]["policy"] in ("forward", "retry")


class BeatStore:
    """A store whose extensions fail twice, then find a newer fence."""

    def __init__(self) -> None:
        self.calls = 0

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        self.calls += 1
        if self.calls <= 2:
            raise StoreUnavailable("unavailable")
        return None


async def test_heartbeat_failures_and_lost_leases_are_logged() -> None:
    import asyncio

    out = io.StringIO()
    logsetup.configure(fmt="json", project=PROJECT, stream=out, cache=False)
    cfg = parse({"routes": ROUTES})
    lease = Lease(holder="me", fence=7, expires_at=1e12, fingerprint="sha256:" + "1" * 64, message_id="m")
    beats = 0

    async def fast_sleep(_: float) -> None:
        nonlocal beats
        beats += 1
        await asyncio.sleep(0)

    hb = Heartbeat(BeatStore(), "reports", "d1", KeyState(fence=7, lease=lease), cfg.lease, ManualClock(), fast_sleep)
    async with hb:
        for _ in range(50):
            if hb.lost:
                break
            await asyncio.sleep(0)
    assert hb.lost and hb.failures == 2
    failed = events_of(out, "heartbeat_failed")
    assert [(e["severity"], e["route"], e["key"], e["fence"]) for e in failed] == [("WARNING", "reports", "d1", 7)] * 2
    assert [(e["severity"], e["fence"]) for e in events_of(out, "lease_lost")] == [("WARNING", 7)]


# --- trace --------------------------------------------------------------------------


async def test_trace_is_the_full_resource_name_when_the_project_is_known(world: World) -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", project=PROJECT, stream=out, cache=False)
    await world.send("reports", {"game_date": "d1"}, trace=TRACE)
    (line,) = decisions_of(out)
    assert line["logging.googleapis.com/trace"] == f"projects/{PROJECT}/traces/{TRACE}"
    assert "trace" not in line


async def test_trace_project_comes_from_the_environment(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "env-project")
    out = io.StringIO()
    logsetup.configure(fmt="json", stream=out, cache=False, find_project=detect_project)  # as the commands do
    await world.send("reports", {"game_date": "d1"}, trace=TRACE)
    assert decisions_of(out)[0]["logging.googleapis.com/trace"] == f"projects/env-project/traces/{TRACE}"


async def test_trace_without_a_project_is_the_bare_id(world: World) -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", stream=out, cache=False)
    await world.send("reports", {"game_date": "d1"}, trace=TRACE)
    assert decisions_of(out)[0]["logging.googleapis.com/trace"] == TRACE


def test_span_id_is_lifted_when_given() -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", project=PROJECT, stream=out, cache=False)
    structlog.get_logger("t").info("event", trace=TRACE, span_id="000000000000004a")
    (line,) = lines_of(out)
    assert line["logging.googleapis.com/spanId"] == "000000000000004a"
    assert "span_id" not in line


# --- through the push endpoint: trace headers, no payload, no token -------------------

AUDIENCE = "https://filter.example.run.app"
PUSHER = "pusher@p.iam.gserviceaccount.com"


@pytest.mark.loop_may_block("its body starts LocalGoogleCerts, which generates an RSA key (~0.1 s)")
async def test_push_requests_log_the_trace_and_never_the_payload_or_the_token(world: World) -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", project=PROJECT, stream=out, cache=False)
    sent: list[str] = []
    with LocalGoogleCerts() as google:
        auth = PushAuthenticator(audience=AUDIENCE, service_account=PUSHER, certs_url=google.url)
        token = google.sign(google_claims(audience=AUDIENCE, email=PUSHER, note=TOKEN_MARK))
        bad_token = google.sign(google_claims(audience="https://someone.else", email=PUSHER, note=TOKEN_MARK))
        app = create_app(world.engine, auth)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://filter") as client:

            async def post(body: bytes, route: str = "reports", **headers: str) -> httpx.Response:
                sent.append(body.decode(errors="replace"))
                return await client.post(
                    f"/push/{route}", content=body, headers={"Authorization": f"Bearer {token}", **headers}
                )

            json_payload = json.dumps({"game_date": "d9", "secret": SECRET}).encode()
            raw_payload = b"\x89PNG\r\n\x1a\n" + SECRET.encode() + b"\xff\xfe"
            r = await post(
                make_envelope(json_payload, "p1"),
                **{"X-Cloud-Trace-Context": f"{TRACE}/1;o=1"},
            )
            assert r.json()["decision"] == "forwarded"
            r = await post(
                make_envelope(raw_payload, "p2", attributes={"id": "raw-1"}),
                "raw",
                traceparent=f"00-{'a' * 32}-00f067aa0ba902b7-01",
            )
            assert r.json()["decision"] == "forwarded"
            # fail-open: a raw payload on a route keyed by a payload field (on_missing_key: forward)
            assert (await post(make_envelope(raw_payload, "p3"))).json()["decision"] == "fail_open"
            # rejected: bad base64, not JSON at all
            bad_b64 = json.dumps({"message": {"data": SECRET + "!!", "messageId": "p4"}}).encode()
            assert (await post(bad_b64)).status_code == 400
            assert (await post(b"{" + SECRET.encode())).status_code == 400
            # and a token for another audience: 403, logged without the token
            r = await client.post(
                "/push/reports",
                content=make_envelope(json_payload, "p5"),
                headers={"Authorization": f"Bearer {bad_token}"},
            )
            assert r.status_code in (401, 403)

    text = out.getvalue()
    lines = lines_of(out)
    decisions = [line for line in lines if line["message"] == "decision"]
    assert [d["decision"] for d in decisions] == ["forwarded", "forwarded", "fail_open", "rejected", "rejected"]
    assert decisions[0]["logging.googleapis.com/trace"] == f"projects/{PROJECT}/traces/{TRACE}"
    assert decisions[1]["logging.googleapis.com/trace"] == f"projects/{PROJECT}/traces/{'a' * 32}"
    assert events_of(out, "push_unauthorized")
    forbidden = [
        SECRET,
        TOKEN_MARK,
        token,
        bad_token,
        token.split(".")[1],  # the claims part alone
        base64.b64encode(json_payload).decode(),
        base64.b64encode(raw_payload).decode(),
        base64.b64encode(raw_payload).decode()[:16],
        "Bearer",
    ]
    for needle in forbidden:
        assert needle not in text, f"{needle[:20]!r}... reached the log"
    for line in lines:
        assert not {"payload", "data", "token", "authorization", "body"} & line.keys()


async def test_a_push_requests_lifecycle_lines_carry_its_trace_and_no_other(world: World) -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", project=PROJECT, stream=out, cache=False)
    transport = httpx.ASGITransport(app=create_app(world.engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://filter") as client:
        for message_id, headers in (("t1", {"X-Cloud-Trace-Context": f"{TRACE}/1;o=1"}), ("t2", {})):
            world.publisher.fail_next = 1  # the publish fails: its lease is released, a lifecycle line
            body = make_envelope(json.dumps({"game_date": message_id}).encode(), message_id)
            r = await client.post("/push/reports", content=body, headers=headers)
            assert r.json()["decision"] == "failed"
    traced, untraced = events_of(out, "lease_released")
    assert traced[TRACE_FIELD] == f"projects/{PROJECT}/traces/{TRACE}"
    assert TRACE_FIELD not in untraced  # the request before it left nothing behind
    assert [d.get(TRACE_FIELD) for d in decisions_of(out)] == [traced[TRACE_FIELD], None]


def test_scrub_drops_payload_and_credential_keys_whoever_logs_them() -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", stream=out, cache=False)
    structlog.get_logger("t").warning(
        "oops", data=SECRET, payload=SECRET, token=SECRET, authorization=SECRET, body=SECRET, route="r"
    )
    (line,) = lines_of(out)
    assert SECRET not in out.getvalue()
    assert (line["message"], line["severity"], line["route"]) == ("oops", "WARNING", "r")


# --- format details -----------------------------------------------------------------


def test_exceptions_are_rendered_as_text_in_the_line() -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", stream=out, cache=False)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        structlog.get_logger("t").exception("handler_crashed", route="r")
    (line,) = lines_of(out)
    assert line["severity"] == "ERROR" and line["message"] == "handler_crashed"
    assert "RuntimeError: boom" in line["exception"] and "Traceback" in line["exception"]


def test_a_numeric_time_field_is_the_line_time() -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", stream=out, cache=False, clock=lambda: 0.0)
    log = structlog.get_logger("t")
    log.info("with_time", time=1_767_225_600.25)
    log.info("without")
    a, b = lines_of(out)
    assert a["time"] == "2026-01-01T00:00:00.250000Z"
    assert b["time"] == "1970-01-01T00:00:00.000000Z"  # from the clock


def test_level_filters_debug_lines() -> None:
    out = io.StringIO()
    logsetup.configure(level="info", fmt="json", stream=out, cache=False)
    log = structlog.get_logger("t")
    log.debug("quiet")
    log.info("loud")
    assert [line["message"] for line in lines_of(out)] == ["loud"]


def test_stdlib_records_become_json_lines_too() -> None:
    record = logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, "port %s busy", (8080,), None)
    line = json.loads(logsetup._StdlibJson().format(record))
    assert (line["severity"], line["message"], line["logger"]) == ("WARNING", "port 8080 busy", "uvicorn.error")
    assert TIME.match(line["time"])


async def test_console_renderer_on_a_terminal(world: World) -> None:
    tty = TTY()
    logsetup.configure(stream=tty, cache=False)  # auto: a terminal gets readable lines
    await world.send("reports", {"game_date": "d1"}, trace=TRACE)
    text = tty.getvalue()
    assert text.strip() and not text.lstrip().startswith("{")
    assert "decision" in text and "reports" in text and "forwarded" in text
    assert SECRET not in text
    pipe = io.StringIO()
    logsetup.configure(stream=pipe, cache=False)  # auto: a pipe gets JSON
    await world.send("reports", {"game_date": "d2"})
    assert decisions_of(pipe)[0]["decision"] == "forwarded"


def test_configure_rejects_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="json, console or auto"):
        logsetup.configure(fmt="xml", stream=io.StringIO(), cache=False)


def test_cached_loggers_follow_a_later_configure() -> None:
    """Production caches loggers; configuring again must still move their output."""
    first, second = io.StringIO(), io.StringIO()
    logsetup.configure(fmt="json", stream=first)
    log = structlog.get_logger("cached")
    log.info("one")
    logsetup.configure(fmt="json", stream=second)
    log.info("two")
    assert [line["message"] for line in lines_of(first)] == ["one"]
    assert [line["message"] for line in lines_of(second)] == ["two"]


def test_the_line_time_is_rounded_to_the_microsecond_not_truncated() -> None:
    out = io.StringIO()
    # .123 is stored as .12299999...: truncating would write .122999
    logsetup.configure(fmt="json", stream=out, cache=False, clock=lambda: 1_767_225_600.123)
    log = structlog.get_logger("t")
    log.info("from_clock")
    log.info("given", time=1_767_225_600.123)
    a, b = lines_of(out)
    assert a["time"] == b["time"] == "2026-01-01T00:00:00.123000Z"


def test_a_time_that_rounds_up_carries_into_the_next_second() -> None:
    out = io.StringIO()
    logsetup.configure(fmt="json", stream=out, cache=False, clock=lambda: 1_767_225_599.9999997)
    structlog.get_logger("t").info("edge")
    (line,) = lines_of(out)
    assert line["time"] == "2026-01-01T00:00:00.000000Z"


def test_stdlib_record_times_are_rounded_too() -> None:
    record = logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, "x", (), None)
    record.created = 1_767_225_600.123
    assert json.loads(logsetup._StdlibJson().format(record))["time"] == "2026-01-01T00:00:00.123000Z"


def test_console_lines_show_a_numeric_time_as_the_readable_timestamp_not_as_an_epoch() -> None:
    tty = TTY()
    logsetup.configure(fmt="console", stream=tty, cache=False)
    structlog.get_logger("t").info("decision", route="r", time=1_767_225_600.25)
    text = tty.getvalue()
    assert "1767225600" not in text and "time=" not in text
    stamp = time.strftime("%H:%M:%S", time.localtime(1_767_225_600.25))
    assert stamp in text.split("decision")[0], text
