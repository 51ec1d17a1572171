"""The push request's trace headers read once (`request_trace`) read as the two readings did.

The log line's trace (`trace_of`: `X-Cloud-Trace-Context` first, lax) and the decision's parent
(`request_parent_of`: `traceparent` first, strict) prefer different headers; reading Cloud Run's
header once must change neither, for any combination of headers.
"""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from filter.observability.tracing import RequestParent, request_parent_of, request_trace
from tests.unit.test_telemetry_headers import TRACE_ID, cloud_headers, push_headers, traceparents, tracestates

_TRACE = re.compile(r"^([0-9a-fA-F]{32})")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-")


def trace_before(headers: dict[bytes, str]) -> str | None:
    """The push app's `trace_of` as it was before the one reading, verbatim: the log line's trace."""
    header = headers.get(b"x-cloud-trace-context")
    if header and (m := _TRACE.match(header)):
        return m.group(1)
    header = headers.get(b"traceparent")
    if header and (m := _TRACEPARENT.match(header)):
        return m.group(1)
    return None


def fields(parent: RequestParent | None) -> object:
    return None if parent is None else (parent.sampled, parent.span_context())


# Cloud Run's header as its front end writes it, and near misses the lax log reading still takes
cloud_like = st.builds(
    lambda trace_id, rest: trace_id + rest,
    st.sampled_from([TRACE_ID, TRACE_ID.upper(), "0" * 32, TRACE_ID[:31]]),
    st.sampled_from(["/1;o=0", "/123;o=1", "/123", f"/{2**64};o=0", "/0;o=1", "/1;o=1;x", "", "/x"]),
)


@settings(max_examples=500, deadline=None)
@given(
    traceparent=st.one_of(st.none(), traceparents, st.text(max_size=60)),
    tracestate=st.one_of(st.none(), tracestates),
    cloud=st.one_of(st.none(), cloud_headers, cloud_like, st.text(max_size=60)),
)
@example(traceparent=None, tracestate=None, cloud=f"{TRACE_ID}/123;o=0")  # Cloud Run's
@example(traceparent=None, tracestate=None, cloud=f"{TRACE_ID.upper()}/123;o=0")  # logged, no parent
@example(traceparent=None, tracestate=None, cloud=f"{'0' * 32}/123;o=1")  # logged, no parent
@example(traceparent=None, tracestate=None, cloud=f"{TRACE_ID}/0;o=1")  # logged, no parent
@example(traceparent=f"00-{'1' * 32}-00f067aa0ba902b7-01", tracestate=None, cloud=f"{TRACE_ID}/1;o=0")
@example(traceparent="", tracestate=None, cloud=f"{TRACE_ID}/1;o=1")  # an empty traceparent is still one
def test_one_reading_of_the_trace_headers_gives_the_log_trace_and_the_parent_the_two_readings_gave(
    traceparent: str | None, tracestate: str | None, cloud: str | None
) -> None:
    headers = push_headers(traceparent, tracestate, cloud)
    trace, parent = request_trace(headers)
    assert trace == trace_before(headers)
    assert fields(parent) == fields(request_parent_of(headers))
