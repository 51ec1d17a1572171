"""The trace a push request names in its headers: the parent of its decision's span, and the
trace its log line is joined to in Cloud Logging."""

from __future__ import annotations

import re
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import SpanContext

from filter.observability.tracing import W3C, cloud_parent

#: The headers `request_parent_of` reads (the push app collects them in its one pass).
REQUEST_HEADERS = (b"traceparent", b"tracestate", b"x-cloud-trace-context")


def request_parent_of(headers: Mapping[bytes, str]) -> SpanContext | None:
    """The parent a push request names (`headers`: the push app's `headers_of`): W3C
    `traceparent` (and `tracestate`), else `X-Cloud-Trace-Context`; None when neither is valid."""
    value = headers.get(b"traceparent")
    if value is not None:
        carrier = {name.decode("latin-1"): v for name, v in headers.items()}
        parent = trace.get_current_span(W3C.extract(carrier)).get_span_context()
        if parent.is_valid:
            return parent
    value = headers.get(b"x-cloud-trace-context")
    return None if value is None else cloud_parent(value)


#: The log line's trace: the id `X-Cloud-Trace-Context` starts with, else `traceparent`'s.
_LOG_TRACE = re.compile(r"^([0-9a-fA-F]{32})")
_LOG_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-")


def trace_of(headers: Mapping[bytes, str]) -> str | None:
    """The trace a push request's log line names (`logging.googleapis.com/trace`). Laxer than
    `request_parent_of`, and `X-Cloud-Trace-Context` first: Cloud Logging joins a request's
    lines by it."""
    header = headers.get(b"x-cloud-trace-context")
    if header and (m := _LOG_TRACE.match(header)):
        return m.group(1)
    header = headers.get(b"traceparent")
    if header and (m := _LOG_TRACEPARENT.match(header)):
        return m.group(1)
    return None
