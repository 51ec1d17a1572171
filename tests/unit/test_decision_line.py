"""The decision line, byte for byte as Cloud Logging reads it, through structlog's chain."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
import structlog.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator

from pubsub_filter.core.engine.record import LEVELS, log_decision
from pubsub_filter.core.model import Cause, Decision, DecisionRecord
from pubsub_filter.core.times import format_time
from pubsub_filter.observability import logsetup


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    saved = structlog.get_config()
    stream = logsetup._OUT.stream
    yield
    structlog.configure(**saved)
    logsetup._OUT.stream = stream


def line_of(level: str, fields: dict[str, Any], project: str | None = "p") -> str:
    stream = io.StringIO()
    logsetup.configure(level="info", fmt="json", project=project, stream=stream, cache=False)
    getattr(structlog.get_logger("pubsub_filter.engine"), level)("decision", **fields)
    return stream.getvalue()


SUPPRESSED = {
    "time": 1_767_225_600.25,
    "route": "reports",
    "decision": "suppressed",
    "enforced": True,
    "message_id": "m1",
    "key": "2025-01-10",
    "reason": "unchanged",
    "fingerprint": "sha256:ab",
    "latency_ms": 0.42,
    "rows_changed": 0,
    "payload": "secret",
    "token": "t",
    "trace": "4bf92f3577b34da6a3ce929d0e0e4736",
}


def test_a_decision_line_is_cloud_loggings_json_byte_for_byte() -> None:
    assert line_of("info", SUPPRESSED) == (
        '{"time":"2026-01-01T00:00:00.250000Z","route":"reports","decision":"suppressed","enforced":true,'
        '"message_id":"m1","key":"2025-01-10","reason":"unchanged","fingerprint":"sha256:ab","latency_ms":0.42,'
        '"rows_changed":0,"severity":"INFO","message":"decision",'
        '"logging.googleapis.com/trace":"projects/p/traces/4bf92f3577b34da6a3ce929d0e0e4736",'
        '"logging.googleapis.com/labels":{"component":"pubsub-filter","route":"reports","decision":"suppressed"}}\n'
    )


def test_a_decision_line_without_a_project_names_the_bare_trace_id() -> None:
    fields = {"time": 1.5, "route": "r", "decision": "failed", "message_id": "m2", "trace": "a" * 32}
    assert line_of("error", fields, project=None) == (
        '{"time":"1970-01-01T00:00:01.500000Z","route":"r","decision":"failed","message_id":"m2",'
        '"severity":"ERROR","message":"decision","logging.googleapis.com/trace":"' + "a" * 32 + '",'
        '"logging.googleapis.com/labels":{"component":"pubsub-filter","route":"r","decision":"failed"}}\n'
    )


class FixedIds(IdGenerator):
    def generate_span_id(self) -> int:
        return 0x00F067AA0BA902B7

    def generate_trace_id(self) -> int:
        return 0x4BF92F3577B34DA6A3CE929D0E0E4736


def test_a_decision_line_inside_a_recorded_span_names_the_span_and_its_trace() -> None:
    fields = {"time": 2.0, "route": "r", "decision": "forwarded", "message_id": "m3", "published_id": "7"}
    with TracerProvider(id_generator=FixedIds()).get_tracer("t").start_as_current_span("decide"):
        line = line_of("info", fields)
    assert line == (
        '{"time":"1970-01-01T00:00:02.000000Z","route":"r","decision":"forwarded","message_id":"m3",'
        '"published_id":"7","severity":"INFO","message":"decision",'
        '"logging.googleapis.com/trace":"projects/p/traces/4bf92f3577b34da6a3ce929d0e0e4736",'
        '"logging.googleapis.com/spanId":"00f067aa0ba902b7",'
        '"logging.googleapis.com/labels":{"component":"pubsub-filter","route":"r","decision":"forwarded"}}\n'
    )


@pytest.mark.parametrize(("level", "written"), [("warning", ["stale", "rejected", "failed", "fail_open"])])
def test_a_decision_below_the_level_is_not_written(level: str, written: list[str]) -> None:
    for decision in Decision:
        rec = DecisionRecord(time=1.0, route="r", decision=decision, enforced=True, message_id="m")
        stream = io.StringIO()
        logsetup.configure(level=level, fmt="json", project="p", stream=stream, cache=False)
        log_decision(rec)
        assert bool(stream.getvalue()) is (str(decision) in written)


def test_a_decision_line_on_a_terminal_is_the_readable_line() -> None:
    rec = DecisionRecord(time=1.0, route="r", decision=Decision.SUPPRESSED, enforced=True, message_id="m")
    stream = io.StringIO()
    logsetup.configure(fmt="console", stream=stream, cache=False)
    log_decision(rec)
    assert "decision" in stream.getvalue() and not stream.getvalue().startswith("{")


# --- the line from its record: the JSON chain takes the record whole, any other its fields ---

FULL = DecisionRecord(
    time=1_767_225_600.25,
    route="reports",
    decision=Decision.FORWARDED,
    enforced=False,
    message_id="m4",
    key="2025-01-10",
    reason="changed",
    fingerprint="sha256:ab",
    destination="phase3",
    published_id="7",
    fence=3,
    publish_time=1_767_225_599.5,
    delivery_attempt=2,
    latency_ms=0.42,
    trace="4bf92f3577b34da6a3ce929d0e0e4736",
    details={"rows_changed": 1, "fields_changed": None, "payload": "secret", "data": "secret"},
    heartbeats=2,
    committed=False,
    cause=Cause.PUBLISH,
)
RECORDS = [
    FULL,
    DecisionRecord(time=3.0, route="r", decision=Decision.STALE, enforced=True, message_id="m5", trace=""),
    DecisionRecord(time=4, route="r", decision=Decision.FAILED, enforced=True, message_id="m6", details={"token": "t"}),
]


def line_of_record(rec: DecisionRecord, level: str = "info") -> str:
    stream = io.StringIO()
    logsetup.configure(level=level, fmt="json", project="p", stream=stream, cache=False)
    log_decision(rec)
    return stream.getvalue()


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: str(r.decision))
@pytest.mark.parametrize("in_span", [False, True], ids=["no span", "in a recorded span"])
def test_a_decision_line_from_its_record_is_the_line_of_its_fields(rec: DecisionRecord, in_span: bool) -> None:
    level = LEVELS[rec.decision]
    with contextlib.ExitStack() as stack:
        if in_span:
            stack.enter_context(TracerProvider(id_generator=FixedIds()).get_tracer("t").start_as_current_span("d"))
        whole, fields = line_of_record(rec, level), line_of(level, rec.line_fields())
    assert whole == fields
    assert "secret" not in whole
    assert ("logging.googleapis.com/spanId" in whole) is in_span


def test_a_decision_line_through_another_chain_is_its_fields() -> None:
    logsetup.configure(level="info", fmt="json", project="p", stream=io.StringIO(), cache=False)
    with structlog.testing.capture_logs() as logs:
        log_decision(FULL)
    [line] = logs
    assert line == {**FULL.line_fields(), "event": "decision", "log_level": "info"}
    assert list(line)[:3] == ["time", "route", "decision"] and "decision_record" not in line


# --- the timestamp, its date and time computed once per second --------------------------


def reference_time(ts: float) -> str:
    seconds, micros = divmod(round(ts * 1_000_000), 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.floats(min_value=-1e10, max_value=253402300799.0, allow_nan=False), min_size=1, max_size=6))
def test_a_timestamp_is_the_uncached_rendering_whatever_came_before(stamps: list[float]) -> None:
    for ts in stamps:
        assert format_time(ts) == reference_time(ts)


def test_timestamps_across_a_second_boundary_name_each_second() -> None:
    stamps = [1_767_225_599.9999994, 1_767_225_599.9999996, 1_767_225_600.0, 1_767_225_599.5, 0.0, -0.5]
    assert [format_time(t) for t in stamps] == [reference_time(t) for t in stamps]
    assert format_time(1_767_225_599.9999996) == "2026-01-01T00:00:00.000000Z"
