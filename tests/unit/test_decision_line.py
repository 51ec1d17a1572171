"""The decision line rendered in one pass is byte for byte the line structlog's chain renders.

The reference is the call the engine made before (`getattr(log, level)("decision", **fields)`),
through the same configured chain, into the same kind of stream.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

from filter.core import engine
from filter.core.model import Decision, DecisionRecord
from filter.core.times import format_time
from filter.observability import logsetup


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    saved = structlog.get_config()
    stream = logsetup._OUT.stream
    yield
    structlog.configure(**saved)
    logsetup._OUT.stream = stream


def reference_line(rec: DecisionRecord) -> None:
    """What `_log_decision` did before it rendered the line itself."""
    fields = {k: v for k, v in rec.as_dict().items() if v is not None}
    if rec.trace:
        fields["trace"] = rec.trace
    getattr(engine.log, engine._LEVELS[rec.decision])("decision", **fields)


def both(rec: DecisionRecord, level: str = "info", project: str | None = "p") -> tuple[str, str]:
    out = []
    for write in (engine._log_decision, reference_line):
        stream = io.StringIO()
        logsetup.configure(level=level, fmt="json", project=project, stream=stream, cache=False)
        write(rec)
        out.append(stream.getvalue())
    return out[0], out[1]


_TEXT = st.one_of(st.none(), st.text(max_size=12))
_NUMBER = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=64))
_EXTRA = st.dictionaries(
    st.sampled_from(["cause", "rows_changed", "audit", "payload", "data", "token", "event_id", "x"]),
    st.one_of(st.none(), st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=2)),
    max_size=3,
)
RECORDS = st.builds(
    DecisionRecord,
    time=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    route=st.text(min_size=1, max_size=10),
    decision=st.sampled_from(list(Decision)),
    enforced=st.booleans(),
    message_id=st.text(max_size=10),
    key=_TEXT,
    reason=_TEXT,
    fingerprint=_TEXT,
    message_fingerprint=_TEXT,
    previous_fingerprint=_TEXT,
    destination=_TEXT,
    published_id=_TEXT,
    fence=st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),
    publish_time=_NUMBER,
    delivery_attempt=st.one_of(st.none(), st.integers(min_value=0, max_value=100)),
    latency_ms=_NUMBER,
    trace=st.one_of(st.none(), st.just(""), st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)),
    details=_EXTRA,
)


@settings(max_examples=400, deadline=None)
@given(RECORDS)
def test_a_decision_line_is_the_line_the_chain_renders(rec: DecisionRecord) -> None:
    ours, reference = both(rec)
    assert ours == reference and ours.endswith("\n")


@settings(max_examples=100, deadline=None)
@given(
    RECORDS, st.dictionaries(st.sampled_from(["trace", "span_id", "route", "other", "token"]), st.text(), max_size=3)
)
def test_a_decision_line_under_bound_context_is_the_line_the_chain_renders(
    rec: DecisionRecord, context: dict[str, Any]
) -> None:
    with structlog.contextvars.bound_contextvars(**context):
        ours, reference = both(rec)
    assert ours == reference


def test_a_decision_line_inside_a_recorded_span_names_it_as_the_chain_does() -> None:
    tracer = TracerProvider().get_tracer("test")
    rec = DecisionRecord(time=1.5, route="r", decision=Decision.SUPPRESSED, enforced=True, message_id="m")
    with tracer.start_as_current_span("decide"):
        ours, reference = both(rec)
    assert ours == reference and '"logging.googleapis.com/spanId"' in ours


def test_a_decision_line_without_a_project_is_the_line_the_chain_renders() -> None:
    rec = DecisionRecord(
        time=1.5, route="r", decision=Decision.FORWARDED, enforced=False, message_id="m", trace="a" * 32
    )
    ours, reference = both(rec, project=None)
    assert ours == reference and '"logging.googleapis.com/trace":"' + "a" * 32 in ours


@pytest.mark.parametrize(("level", "written"), [("warning", ["stale", "rejected", "failed", "fail_open"])])
def test_a_decision_below_the_level_is_not_written(level: str, written: list[str]) -> None:
    for decision in Decision:
        rec = DecisionRecord(time=1.0, route="r", decision=decision, enforced=True, message_id="m")
        ours, reference = both(rec, level=level)
        assert ours == reference
        assert bool(ours) is (str(decision) in written)


def test_a_decision_line_on_a_terminal_is_the_readable_line() -> None:
    rec = DecisionRecord(time=1.0, route="r", decision=Decision.SUPPRESSED, enforced=True, message_id="m")
    stream = io.StringIO()
    logsetup.configure(fmt="console", stream=stream, cache=False)
    engine._log_decision(rec)
    assert "decision" in stream.getvalue() and not stream.getvalue().startswith("{")


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
