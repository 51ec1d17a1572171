"""The push request's trace headers, read as OpenTelemetry's own propagators read them.

`request_parent` parses `traceparent`/`tracestate` and `X-Cloud-Trace-Context` itself (a
propagator's extract costs more than the rest of a dropped decision's telemetry); these
tests hold it to the propagators' reading (`request_context`), header for header.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace import SpanContext

from filter.observability.tracing import request_context, request_parent, request_parent_of

HEX = "0123456789abcdef"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def propagators(headers: dict[bytes, str]) -> SpanContext | None:
    ctx = request_context(headers)
    return None if ctx is None else trace.get_current_span(ctx).get_span_context()


def hex_or_not(size: int) -> st.SearchStrategy[str]:
    """`size` hex digits (zeros among them), or something near it that is not."""
    return st.one_of(
        st.text(HEX, min_size=size, max_size=size),
        st.just("0" * size),
        st.text("0123456789abcdefABCDEFg -", min_size=max(0, size - 1), max_size=size + 1),
    )


traceparents = st.builds(
    lambda pad, version, trace_id, span_id, flags, tail: f"{pad}{version}-{trace_id}-{span_id}-{flags}{tail}",
    st.sampled_from(["", " ", "\t"]),
    st.one_of(st.sampled_from(["00", "01", "ff", "cc"]), hex_or_not(2)),
    hex_or_not(32),
    hex_or_not(16),
    st.one_of(st.sampled_from(["00", "01", "02", "03", "ff"]), hex_or_not(2)),
    st.sampled_from(["", " ", "\t ", "-extra", "-", "\n", "x"]),
)
cloud_headers = st.builds(
    lambda trace_id, span_id, option: f"{trace_id}/{span_id}{option}",
    hex_or_not(32),
    st.one_of(st.integers(0, 2**64 + 5).map(str), st.text("0123456789x", max_size=21)),
    st.sampled_from(["", ";o=0", ";o=1", ";o=2", ";o=13", ";o=", ";o=x", "; o=1", ";o=1;x"]),
)


def push_headers(traceparent: str | None, tracestate: str | None, cloud: str | None) -> dict[bytes, str]:
    """A push request's trace headers as the push app's `headers_of` gives them (absent when None)."""
    named = ((b"traceparent", traceparent), (b"tracestate", tracestate), (b"x-cloud-trace-context", cloud))
    return {name: value for name, value in named if value is not None}


tracestates = st.one_of(
    st.sampled_from(["vendor=opaque", "a=1,b=2", "", "bad", "x" * 9000, "a=1,,b=2"]),
    st.text(max_size=30),
)


@given(
    traceparent=st.one_of(st.none(), traceparents, st.text(max_size=60)),
    tracestate=st.one_of(st.none(), tracestates),
    cloud=st.one_of(st.none(), cloud_headers, st.text(max_size=60)),
)
@example(traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-00", tracestate=None, cloud=None)
@example(traceparent=None, tracestate=None, cloud=f"{TRACE_ID}/123;o=0")
@example(traceparent="00-garbage", tracestate=None, cloud=f"{TRACE_ID}/123;o=1")
@example(traceparent=f"ff-{TRACE_ID}-00f067aa0ba902b7-01", tracestate=None, cloud=None)  # version ff: invalid
@example(traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-01-x", tracestate=None, cloud=None)  # 00 has 4 fields
@example(traceparent=f"01-{TRACE_ID}-00f067aa0ba902b7-01-x", tracestate="a=1", cloud=None)  # a later one may not
@example(traceparent=f"00-{'0' * 32}-00f067aa0ba902b7-01", tracestate=None, cloud=f"{TRACE_ID}/1;o=1")
@example(traceparent=f"00-{TRACE_ID}-{'0' * 16}-01", tracestate=None, cloud=None)
@example(traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-02", tracestate="v=" + "x" * 9000, cloud=None)
@example(traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-01" + "x" * 600, tracestate=None, cloud=None)
@example(traceparent=None, tracestate=None, cloud=f"{TRACE_ID}/{2**64}")
def test_the_push_requests_parent_is_what_the_propagators_extract(
    traceparent: str | None, tracestate: str | None, cloud: str | None
) -> None:
    headers = push_headers(traceparent, tracestate, cloud)
    assert request_parent(headers) == propagators(headers)


@given(
    traceparent=st.one_of(st.none(), traceparents, st.text(max_size=60)),
    tracestate=st.one_of(st.none(), tracestates),
    cloud=st.one_of(st.none(), cloud_headers, st.text(max_size=60)),
)
@example(traceparent=None, tracestate=None, cloud=f"{TRACE_ID}/123;o=0")
@example(traceparent=None, tracestate=None, cloud=f"{TRACE_ID}/123;o=13")  # odd options: sampled
@example(traceparent=None, tracestate=None, cloud=f"{TRACE_ID}/123")  # no options: not sampled
@example(traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-03", tracestate=None, cloud=None)
@example(traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-02", tracestate=None, cloud=f"{TRACE_ID}/123;o=1")
def test_whether_the_push_requests_parent_is_sampled_is_read_as_the_propagators_read_it(
    traceparent: str | None, tracestate: str | None, cloud: str | None
) -> None:
    """The verdict on most decisions is taken from this flag alone, before the parent's SpanContext is built."""
    headers = push_headers(traceparent, tracestate, cloud)
    parent, extracted = request_parent_of(headers), propagators(headers)
    assert (parent is None, parent and parent.sampled) == (
        extracted is None,
        extracted and extracted.trace_flags.sampled,
    )


def test_without_trace_headers_a_push_request_names_no_parent() -> None:
    assert request_parent({b"content-length": "12"}) is None
