"""Trace context in and out: a push request's headers, a message's attributes (the way the
Pub/Sub client library carries it), the publish span that heartbeat events go on, and
which decisions are traced (the standard `OTEL_TRACES_SAMPLER`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from contextvars import ContextVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagators.cloud_trace_propagator import CloudTraceFormatPropagator
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from filter.core.ports import Failure

SYSTEM = "gcp_pubsub"
#: The google-cloud-pubsub client's prefix for trace context in message attributes.
ATTRIBUTE_PREFIX = "googclient_"

W3C = TraceContextTextMapPropagator()
_CLOUD = CloudTraceFormatPropagator()
_REQUEST_PROPAGATORS = (("traceparent", W3C), ("x-cloud-trace-context", _CLOUD))


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
    for header, propagator in _REQUEST_PROPAGATORS:
        if header not in headers:  # most requests name none: a lookup, not a propagator's extract
            continue
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


# --- sampling ---------------------------------------------------------------------------

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


def sampler(env: Mapping[str, str]) -> Sampler:
    """The standard `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, read from `env`. A value
    the SDK would warn about and replace is an error here: the operator asked for something."""
    chosen = (env.get("OTEL_TRACES_SAMPLER") or "").strip().lower()
    name = chosen or DEFAULT_SAMPLER
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
