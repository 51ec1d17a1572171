"""Trace context in a message's attributes, the way the Pub/Sub client library carries it,
through OpenTelemetry's W3C propagator; and the push request's parent while its decision runs."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import trace
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

#: The google-cloud-pubsub client's prefix for trace context in message attributes.
ATTRIBUTE_PREFIX = "googclient_"
MESSAGE_TRACEPARENT = ATTRIBUTE_PREFIX + "traceparent"

W3C = TraceContextTextMapPropagator()


class _Prefixed(Getter[Mapping[str, str]], Setter[MutableMapping[str, str]]):
    """Message attributes as a propagator's carrier: its keys under the client library's prefix."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(ATTRIBUTE_PREFIX + key)
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return [k[len(ATTRIBUTE_PREFIX) :] for k in carrier if k.startswith(ATTRIBUTE_PREFIX)]

    def set(self, carrier: MutableMapping[str, str], key: str, value: str) -> None:
        carrier[ATTRIBUTE_PREFIX + key] = value


ATTRIBUTES = _Prefixed()


def message_parent(attributes: Mapping[str, str]) -> SpanContext | None:
    """The parent a traced publisher left in the message's attributes (`googclient_traceparent`)."""
    if MESSAGE_TRACEPARENT not in attributes:
        return None
    parent = trace.get_current_span(W3C.extract(attributes, getter=ATTRIBUTES)).get_span_context()
    return parent if parent.is_valid else None


def messaging_attributes(
    operation: str, destination: str | None, size: int, ordering_key: str | None
) -> dict[str, Any]:
    """OpenTelemetry's messaging attributes for one `gcp_pubsub` operation (`process`, `send`)."""
    attributes: dict[str, Any] = {
        "messaging.system": "gcp_pubsub",
        "messaging.operation.name": operation,
        "messaging.operation.type": operation,
        "messaging.message.body.size": size,
    }
    if destination:
        attributes["messaging.destination.name"] = destination
    if ordering_key:
        attributes["messaging.gcp_pubsub.message.ordering_key"] = ordering_key
    return attributes
