"""Trace context in and out, through OpenTelemetry's propagators: a push request's headers, a
message's attributes (the way the Pub/Sub client library carries it), and the sampler the
standard `OTEL_TRACES_SAMPLER` names."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableMapping
from contextvars import ContextVar

from opentelemetry import trace
from opentelemetry.propagators.cloud_trace_propagator import CloudTraceFormatPropagator
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from filter.core.ports import Failure

SYSTEM = "gcp_pubsub"
#: The google-cloud-pubsub client's prefix for trace context in message attributes.
ATTRIBUTE_PREFIX = "googclient_"
MESSAGE_TRACEPARENT = ATTRIBUTE_PREFIX + "traceparent"

W3C = TraceContextTextMapPropagator()
#: The headers `request_parent_of` reads (the push app collects them in its one pass).
REQUEST_HEADERS = (b"traceparent", b"tracestate", b"x-cloud-trace-context")
#: `X-Cloud-Trace-Context` as the Cloud Trace propagator reads it, up to 20 digits a number (its
#: int() of the options raises past 4,300): a header it could not read names no parent (its
#: trace id is still logged, `trace_of`).
_CLOUD_READABLE = re.compile(r"([0-9a-f]{32})/(\d{1,20})(?:;o=(\d{1,20}))?")


_CLOUD = CloudTraceFormatPropagator()


class _AttributeGetter(Getter[Mapping[str, str]]):
    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(ATTRIBUTE_PREFIX + key)
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return [k[len(ATTRIBUTE_PREFIX) :] for k in carrier if k.startswith(ATTRIBUTE_PREFIX)]


class _AttributeSetter(Setter[MutableMapping[str, str]]):
    def set(self, carrier: MutableMapping[str, str], key: str, value: str) -> None:
        carrier[ATTRIBUTE_PREFIX + key] = value


ATTRIBUTES_GET = _AttributeGetter()
ATTRIBUTES_SET = _AttributeSetter()

#: The parent the push request names, while its decision runs (set by the push app).
REQUEST_PARENT: ContextVar[SpanContext | None] = ContextVar("pubsub_filter_request_parent", default=None)


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


def cloud_parent(value: str) -> SpanContext | None:
    """`X-Cloud-Trace-Context` read by OpenTelemetry's `CloudTraceFormatPropagator`, once the
    header is one it can read (`_CLOUD_READABLE`). A reader of our own saved ~3 % of a request with
    spans exported (T 1.13x against 1.094x, bench/README.md), under the 10 % a fast path of ours
    must pay: the library reads it."""
    if _CLOUD_READABLE.fullmatch(value) is None:
        return None
    parent = trace.get_current_span(_CLOUD.extract({"x-cloud-trace-context": value})).get_span_context()
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


def message_parent(attributes: Mapping[str, str]) -> SpanContext | None:
    """The parent a traced publisher left in the message's attributes (`googclient_traceparent`)."""
    if MESSAGE_TRACEPARENT not in attributes:
        return None
    parent = trace.get_current_span(W3C.extract(attributes, getter=ATTRIBUTES_GET)).get_span_context()
    return parent if parent.is_valid else None


def short_name(path: str | None) -> str | None:
    return path.rsplit("/", 1)[-1] if path else path


#: Without `OTEL_TRACES_SAMPLER`: a decision is traced when its parent (the push request's
#: trace, the publisher's) is sampled, and 1 % of decisions that start a trace. Recording and
#: exporting every decision doubles the suppress path's CPU (bench/README.md).
DEFAULT_SAMPLER = "parentbased_traceidratio"
DEFAULT_RATIO = 0.01

_SAMPLERS: dict[str, Callable[[float], Sampler]] = {
    "always_on": lambda _: ALWAYS_ON,
    "always_off": lambda _: ALWAYS_OFF,
    "traceidratio": TraceIdRatioBased,
    "parentbased_always_on": lambda _: ParentBased(ALWAYS_ON),
    "parentbased_always_off": lambda _: ParentBased(ALWAYS_OFF),
    "parentbased_traceidratio": lambda ratio: ParentBased(TraceIdRatioBased(ratio)),
}


def _sampler_name(env: Mapping[str, str]) -> str:
    return (env.get("OTEL_TRACES_SAMPLER") or "").strip().lower() or DEFAULT_SAMPLER


def drops_unsampled_parents(env: Mapping[str, str]) -> bool:
    """Whether the sampler `env` names drops every decision whose remote parent is not sampled
    (Cloud Run's front end sends most requests so): the parent-based samplers, whose rule for
    that parent is `ALWAYS_OFF`, and `always_off`. Such a decision needs no span of its own."""
    name = _sampler_name(env)
    return name.startswith("parentbased_") or name == "always_off"


def sampler(env: Mapping[str, str]) -> Sampler:
    """The SDK's sampler for `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, read from `env`
    (the SDK reads only `os.environ`). A value the SDK would warn about and replace is an error
    here: the operator asked for something."""
    chosen = (env.get("OTEL_TRACES_SAMPLER") or "").strip().lower()
    name = _sampler_name(env)
    if name not in _SAMPLERS:
        raise Failure(f"OTEL_TRACES_SAMPLER={name!r} is not one of {', '.join(_SAMPLERS)}")
    arg = (env.get("OTEL_TRACES_SAMPLER_ARG") or "").strip()
    ratio = 1.0 if chosen else DEFAULT_RATIO  # 1.0: the SDK's ratio when a ratio sampler is named without one
    if arg and name.endswith("traceidratio"):
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise Failure(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio between 0 and 1")
    return _SAMPLERS[name](ratio)
