"""Trace context in and out: a push request's headers, a message's attributes (the way the
Pub/Sub client library carries it), and the publish span that heartbeat events go on."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from contextvars import ContextVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagators.cloud_trace_propagator import CloudTraceFormatPropagator
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SYSTEM = "gcp_pubsub"
#: The google-cloud-pubsub client's prefix for trace context in message attributes.
ATTRIBUTE_PREFIX = "googclient_"

W3C = TraceContextTextMapPropagator()
_CLOUD = CloudTraceFormatPropagator()


class _AttributeGetter(Getter[Mapping[str, str]]):
    """Trace context in message attributes, the way the Pub/Sub client library writes it."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(ATTRIBUTE_PREFIX + key)
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return [k[len(ATTRIBUTE_PREFIX) :] for k in carrier if k.startswith(ATTRIBUTE_PREFIX)]


class _AttributeSetter(Setter[MutableMapping[str, str]]):
    def set(self, carrier: MutableMapping[str, str], key: str, value: str) -> None:
        carrier[ATTRIBUTE_PREFIX + key] = value


class _HeaderGetter(Getter[Mapping[str, str]]):
    """Starlette's headers (case-insensitive) or any mapping of lower-case names."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier.keys())


ATTRIBUTES_GET = _AttributeGetter()
ATTRIBUTES_SET = _AttributeSetter()
_HEADERS_GET = _HeaderGetter()

#: The publish span of the decision under way, shared with the heartbeat task (it copies
#: this context when it starts, before the publish span exists, so it holds a box).
PUBLISH_SPAN: ContextVar[list[Span | None] | None] = ContextVar("pubsub_filter_publish_span", default=None)


def request_context(headers: Mapping[str, str]) -> otel_context.Context | None:
    """The parent a push request names: W3C `traceparent`, else `X-Cloud-Trace-Context`."""
    for propagator in (W3C, _CLOUD):
        ctx = propagator.extract(headers, getter=_HEADERS_GET)
        if trace.get_current_span(ctx).get_span_context().is_valid:
            return ctx
    return None


def message_context(attributes: Mapping[str, str]) -> otel_context.Context | None:
    """The parent a traced publisher left in the message's attributes (`googclient_traceparent`)."""
    if ATTRIBUTE_PREFIX + "traceparent" not in attributes:
        return None
    ctx = W3C.extract(attributes, getter=ATTRIBUTES_GET)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def short_name(path: str | None) -> str | None:
    return path.rsplit("/", 1)[-1] if path else path
