"""The trace a push request names in its headers: the parent of its decision's span, and the
trace its log line is joined to in Cloud Logging."""

from __future__ import annotations

import re
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.propagators.cloud_trace_propagator import CloudTraceFormatPropagator
from opentelemetry.propagators.textmap import Getter, TextMapPropagator
from opentelemetry.trace import SpanContext

from pubsub_filter.observability.tracing import W3C

#: The headers `request_parent_of` reads (the push app collects them in its one pass).
REQUEST_HEADERS = (b"traceparent", b"tracestate", b"x-cloud-trace-context")


class _HeaderGetter(Getter[Mapping[bytes, str]]):
    """The push app's headers (`headers_of`: lower-case names, as bytes) read as a propagator's carrier."""

    def get(self, carrier: Mapping[bytes, str], key: str) -> list[str] | None:
        value = carrier.get(key.encode("latin-1"))
        return None if value is None else [value]

    def keys(self, carrier: Mapping[bytes, str]) -> list[str]:
        return [name.decode("latin-1") for name in carrier]


_HEADERS = _HeaderGetter()
_CLOUD = CloudTraceFormatPropagator()


def request_parent_of(headers: Mapping[bytes, str]) -> SpanContext | None:
    """The parent a push request names (`headers`: the push app's `headers_of`), as OpenTelemetry's
    propagators read it: W3C `traceparent` (and `tracestate`), else `X-Cloud-Trace-Context`; None
    when neither is valid."""
    if b"traceparent" in headers and (parent := _extracted(W3C, headers)) is not None:
        return parent
    cloud = headers.get(b"x-cloud-trace-context")
    # The Cloud propagator's int() of the options takes any number of digits (quadratic in them,
    # and past 4,300 it raises): options of more than 20, like its span id's bound, name no parent.
    if cloud is None or len(cloud.partition(";o=")[2]) > 20:
        return None
    return _extracted(_CLOUD, headers)


def _extracted(propagator: TextMapPropagator, headers: Mapping[bytes, str]) -> SpanContext | None:
    parent = trace.get_current_span(propagator.extract(headers, getter=_HEADERS)).get_span_context()
    return parent if parent.is_valid else None


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
