"""Whole numbers written by someone outside are bounded by length before `int()`: CPython's
`int()` raises past 4,300 digits, and such a `Content-Length` or `X-Cloud-Trace-Context` once
answered 500 with a traceback. Each parser is held to it over huge digit strings, and the push
surface answers each such request with a 4xx, or ignores what it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

from pubsub_filter.core.config.schema import load
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.numerals import bounded_int
from pubsub_filter.observability.telemetry import Telemetry
from pubsub_filter.push.app import create_app
from pubsub_filter.push.auth import _max_age
from pubsub_filter.push.trace_headers import request_parent_of, trace_of
from pubsub_filter.replay.deadletter import ATTR_COUNT, DeadLetter
from pubsub_filter.runtime.wiring import make_engine
from tests.support.asgi import call

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PAST_INT_LIMIT = 4_301  # digits: int() of more raises ValueError

#: digit strings of every length, from none to far past int()'s limit, leading zeros among them
digit_strings = st.builds(
    lambda zeros, head, repeat, n: "0" * zeros + head + repeat * n,
    st.integers(0, 3),
    st.text("0123456789", max_size=25),
    st.sampled_from(["9", "1", "0"]),
    st.one_of(st.integers(0, 30), st.integers(PAST_INT_LIMIT - 5, 3 * PAST_INT_LIMIT)),
)


@given(digit_strings, st.integers(1, 30))
@example("9" * PAST_INT_LIMIT, 20)
@example("0" * PAST_INT_LIMIT + "5", 1)
def test_bounded_int_reads_up_to_its_digits_and_refuses_more_without_raising(text: str, max_digits: int) -> None:
    read = bounded_int(text, max_digits)
    significant = text.lstrip("0")
    if not text or len(significant) > max_digits:
        assert read is None
    else:
        assert read == int(significant or "0")


@given(st.text(max_size=30))
@example("²")
@example("٣")
@example(" 7")
@example("-1")
def test_bounded_int_reads_ascii_digits_only(text: str) -> None:
    read = bounded_int(text, 40)
    assert read == (int(text) if text.isascii() and text.isdigit() else None)


@given(digit_strings)
@example("9" * PAST_INT_LIMIT)
def test_a_cloud_trace_header_with_options_of_any_length_is_read_without_raising(options: str) -> None:
    header = {b"x-cloud-trace-context": f"{TRACE_ID}/123;o={options}"}
    parent = request_parent_of(header)
    assert trace_of(header) == TRACE_ID  # the log line keeps its trace whatever the options
    if options and len(options) <= 20:
        assert parent is not None and parent.trace_flags.sampled == (int(options) % 2 == 1)
    else:
        assert parent is None  # options it cannot read: the header names no parent


@given(digit_strings, digit_strings)
@example("9" * PAST_INT_LIMIT, "1" * PAST_INT_LIMIT)
def test_the_certs_max_age_is_read_without_raising_whatever_its_digits(max_age: str, age: str) -> None:
    seconds = _max_age({"Cache-Control": f"public, max-age={max_age}", "Age": age})
    assert seconds is None or 0 <= seconds < 10**12


@given(digit_strings)
def test_a_replayed_messages_count_of_any_length_is_read_without_raising(count: str) -> None:
    letter = DeadLetter("a", "1", b"{}", {ATTR_COUNT: count}, "", 0.0, "1970-01-01T00:00:00Z")
    replayed = int(letter.replay_attributes()[ATTR_COUNT])
    significant = count.lstrip("0")
    assert replayed == (int(significant or "0") + 1 if count and len(significant) <= 18 else 1)


# --- the push surface, as served --------------------------------------------------------


@pytest.fixture
def app(quick_start: Path) -> object:
    """The quick start's push app, with tracing on (spans go nowhere: the trace header is read)."""
    return create_app(make_engine(load(str(quick_start)), Telemetry(tracer_provider=TracerProvider())))


async def test_a_content_length_of_thousands_of_digits_answers_413(app: object) -> None:
    body = (ROOT / "examples" / "push-injury.json").read_bytes()
    for declared in ("9" * PAST_INT_LIMIT, "1" + "0" * 30):
        status, answer = await call(app, "POST", "/push/injury-report", body, [(b"content-length", declared.encode())])
        assert (status, json.loads(answer)["decision"]) == (413, "rejected")


async def test_a_cloud_trace_header_whose_options_have_thousands_of_digits_is_ignored_not_a_500(app: object) -> None:
    body = (ROOT / "examples" / "push-injury.json").read_bytes()
    header = (b"x-cloud-trace-context", f"{TRACE_ID}/123;o={'1' * PAST_INT_LIMIT}".encode())
    status, answer = await call(app, "POST", "/push/injury-report", body, [header])
    assert (status, json.loads(answer)["decision"]) == (200, "forwarded")


async def test_a_delivery_attempt_of_thousands_of_digits_answers_400(app: object) -> None:
    envelope = json.loads(make_envelope(b"{}", "1", subscription="projects/p/subscriptions/s"))
    body = json.dumps(envelope).encode()[:-1] + b', "deliveryAttempt": ' + b"7" * PAST_INT_LIMIT + b"}"
    status, answer = await call(app, "POST", "/push/injury-report", body)
    assert (status, json.loads(answer)["decision"]) == (400, "rejected")
