"""OpenTelemetry metrics and traces for every surface: one `Telemetry` per process
(`pubsub_filter.runtime.otel.from_config`), which the engine calls where a decision starts and ends and
where a lease is taken over; the store and publisher are wrapped (`instrumented`)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import cast

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags

from pubsub_filter.core.model import Decision, DecisionRecord, Message
from pubsub_filter.core.ports import UNTRACED, Traced, Untraced
from pubsub_filter.observability.latency import Latencies, LatencyHistogram
from pubsub_filter.observability.tracing import ATTRIBUTES, W3C, message_parent, messaging_attributes

#: The one label every route name that is not configured shares (a request may name any).
UNKNOWN_ROUTE = "(unknown)"
SCOPE = "pubsub_filter"
#: Seconds. Decisions take from well under a millisecond (SQLite, suppressed) to a lease
#: duration (a publish retried under a heartbeat): the default OTel buckets are in ms.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


_RANDOM_IDS = RandomIdGenerator()
_HISTOGRAMS = {
    "decision": "Time from a message's arrival to its decision, by route and decision.",
    "store": "State store calls (read, claim, extend, commit, release) by operation and outcome.",
    "publish": "Publishes to a destination topic, by destination and outcome.",
}
_COUNTERS = {
    "lease_takeovers": "Expired leases taken over, by route.",
    "heartbeat_failures": "Lease extensions that failed, by route.",
    "commit_refusals": "Commits refused because the lease's fence moved (the key was taken over), by route.",
    "fail_open": "Messages forwarded without a dedup decision (store unreachable, or no key to read), by route.",
    "ids_reused": "Messages whose id was forwarded recently with other content (decided as new), by route.",
    "selection_changed": "Messages judged against a forward the route made under another selection, by route.",
}


class PrometheusText:
    """`GET /metrics`: the official OpenTelemetry Prometheus reader, on a registry of its own
    (not prometheus_client's global one: a test builds several), as Prometheus text."""

    def __init__(self) -> None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=False)
        # no `target_info` series and no `otel_scope_*` labels: the series /metrics has always had
        self.reader = PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=self.registry)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class Telemetry:
    """The filter's instruments on given providers; `Telemetry()` is off."""

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        tracer_provider: TracerProvider | None = None,
        prometheus: PrometheusText | None = None,
        latencies: Latencies | None = None,
        *,
        drops_unsampled_parents: bool = False,
    ) -> None:
        self.meter_provider, self.tracer_provider, self.prometheus = meter_provider, tracer_provider, prometheus
        self.metrics, self.tracing = meter_provider is not None, tracer_provider is not None
        #: the sampler drops a decision whose remote parent is not sampled
        #: (`pubsub_filter.runtime.otel.drops_unsampled_parents`): the SDK is not asked for its span
        self.drops_unsampled_parents = drops_unsampled_parents
        self._ids = tracer_provider.id_generator if tracer_provider is not None else _RANDOM_IDS
        self.tracer = tracer_provider.get_tracer(SCOPE) if tracer_provider is not None else trace.NoOpTracer()
        #: the configured routes (`watch`): any other name is labelled `UNKNOWN_ROUTE`,
        #: so a request adds no series. None: every name is its own label.
        self.routes: frozenset[str] | None = None
        self._in_flight: Callable[[], int] | None = None  # `watch`: the engine's, handed over
        self._outcomes: Callable[[], Mapping[str, int]] | None = None
        self.latency: dict[str, LatencyHistogram] = {}
        self.counters: dict[str, metrics.Counter] = {}
        #: decisions by (route, decision, enforced), read at collection: an increment, not a
        #: synchronous counter's add() (~8 µs) on every decision
        self._decisions: Counter[tuple[str, str, str]] = Counter()
        if meter_provider is None:
            return
        m = meter_provider.get_meter(SCOPE)
        m.create_observable_counter(
            "pubsub_filter_decisions", [self._observe_decisions], "1", "Decisions by route, decision and enforced."
        )
        self.latencies = latencies or Latencies(SCOPE, Resource.create({}))
        self.latency = {
            name: self.latencies.create(f"pubsub_filter_{name}_duration", about, LATENCY_BUCKETS)
            for name, about in _HISTOGRAMS.items()
        }
        if prometheus is not None:
            prometheus.registry.register(self.latencies)
        self.counters = {
            name: m.create_counter(f"pubsub_filter_{name}", "1", about) for name, about in _COUNTERS.items()
        }
        m.create_observable_counter(
            "pubsub_filter_records",
            [self._observe_records],
            "1",
            "Decision records by outcome: written, retried (rows in a retried batch) or dropped.",
        )
        m.create_observable_gauge(
            "pubsub_filter_in_flight", [self._observe_in_flight], "1", "Messages being decided now."
        )

    def watch(
        self, routes: Iterable[str], in_flight: Callable[[], int], outcomes: Callable[[], Mapping[str, int]]
    ) -> None:
        """Observe an engine through what it hands over: its route names (any other is labelled
        `UNKNOWN_ROUTE`), how many messages it is deciding, its recorder's outcomes. No reference
        to the engine itself is kept."""
        self.routes = frozenset(routes)
        self._in_flight, self._outcomes = in_flight, outcomes
        # every route's counters exist from the start, at zero: an alert or a rate() on a
        # series that appears only at its first event sees nothing (or a jump) instead
        for counter in self.counters.values():
            for route in self.routes:
                counter.add(0, {"route": route})

    def route_label(self, route: str) -> str:
        return route if self.routes is None or route in self.routes else UNKNOWN_ROUTE

    def _observe_decisions(self, _: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        for labels, count in list(self._decisions.items()):  # a C-level copy: safe beside the loop
            yield metrics.Observation(count, dict(zip(("route", "decision", "enforced"), labels, strict=True)))

    def _observe_records(self, _: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        if self._outcomes is not None:
            for outcome, value in self._outcomes().items():
                yield metrics.Observation(value, {"outcome": outcome})

    def _observe_in_flight(self, _: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        if self._in_flight is not None:
            yield metrics.Observation(self._in_flight())

    def shutdown(self) -> None:
        """Flush what OTLP has not sent yet (the end of a serve, pull or replay)."""
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                provider.shutdown()

    def decision(
        self, route: str, msg: Message, parent: object | None = None
    ) -> contextlib.AbstractContextManager[Traced]:
        """The decision's span, current while it runs when recorded. Its parent: `parent`, the
        push request's trace as the surface read it (`tracing.request_parent_of`), else what the
        surface made current, else the context a traced publisher left in the message's attributes."""
        if not self.tracing:
            return _UNTRACED_DECISION
        parent = cast("SpanContext | None", parent)  # what `request_parent_of` read, or None
        if parent is None and not trace.get_current_span().get_span_context().is_valid:
            parent = message_parent(msg.attributes)
        if parent is not None and not parent.trace_flags.sampled and self.drops_unsampled_parents:
            # Cloud Run's front end leaves most requests unsampled: the SDK is not asked for a
            # span the sampler drops; one is made only for a forward to pass on
            return _Unrecorded(None, parent, self._ids)
        # a request's or a message's parent goes to the SDK alone in its context, as a propagator extracts it
        context = None if parent is None else trace.set_span_in_context(NonRecordingSpan(parent), Context())
        subscription = _short_name(msg.subscription)
        route = self.route_label(route)
        span = self.tracer.start_span(f"{subscription or route} process", context, SpanKind.CONSUMER)
        if not span.is_recording():  # dropped: no attributes, nothing to end
            return _Unrecorded(span)
        # OpenTelemetry's messaging attributes for a `gcp_pubsub` consumer, and the route
        attributes = messaging_attributes("process", subscription, len(msg.data), msg.ordering_key)
        attributes["messaging.message.id"] = msg.message_id
        attributes["pubsub_filter.route"] = route
        if subscription:
            attributes["messaging.destination.subscription.name"] = subscription
        if msg.delivery_attempt is not None:
            attributes["messaging.gcp_pubsub.message.delivery_attempt"] = msg.delivery_attempt
        span.set_attributes(attributes)
        return _Traced(self.tracer).running(span)

    def decided(self, rec: DecisionRecord) -> None:
        """Count a finished decision (every one, rejected included) and describe it on its span."""
        if self.metrics:
            route, decision = self.route_label(rec.route), str(rec.decision)
            self._decisions[(route, decision, "true" if rec.enforced else "false")] += 1
            if rec.latency_ms is not None:
                self.latency["decision"].record(rec.latency_ms / 1000, {"route": route, "decision": decision})
            if rec.decision is Decision.FAIL_OPEN:
                self.counters["fail_open"].add(1, {"route": route})
            if rec.extra:
                if rec.extra.get("id_reused"):
                    self.counters["ids_reused"].add(1, {"route": route})
                if rec.extra.get("selection_change") not in (None, "key changed"):  # a key changed: a new keyspace
                    self.counters["selection_changed"].add(1, {"route": route})
        if self.recording():
            described: dict[str, str | bool | None] = {
                "pubsub_filter.decision": str(rec.decision),
                "pubsub_filter.enforced": rec.enforced,
                "pubsub_filter.key": rec.key,
                "pubsub_filter.destination": rec.destination or None,
                "pubsub_filter.published_id": rec.published_id or None,
            }
            span = trace.get_current_span()
            span.set_attributes({k: v for k, v in described.items() if v is not None})
            if rec.decision in (Decision.FAILED, Decision.FAIL_OPEN):
                span.set_status(trace.StatusCode.ERROR, rec.reason)

    def lease_taken_over(self, route: str) -> None:
        if self.metrics:
            self.counters["lease_takeovers"].add(1, {"route": self.route_label(route)})

    def recording(self) -> bool:
        """Whether a span of ours (a decision's, or its publish's) is current and recorded: its
        store calls and publish have spans then. Read from the current span itself, so nothing
        beside OpenTelemetry's own context says a decision is under way."""
        if not self.tracing:
            return False
        span = trace.get_current_span()
        scope = getattr(span, "instrumentation_scope", None)  # an SDK span's (ReadableSpan's)
        return span.is_recording() and scope is not None and scope.name == SCOPE

    def sent(self, published_id: str) -> None:
        """Name the published message on the current publish's span (`_Traced.sending`)."""
        if self.recording():
            trace.get_current_span().set_attribute("messaging.message.id", published_id)

    def inject(self, attributes: MutableMapping[str, str]) -> None:
        """Write the current trace context into outgoing message attributes as the Pub/Sub client
        library does (`googclient_traceparent`), so that a traced consumer continues it."""
        if self.tracing and trace.get_current_span().get_span_context().is_valid:
            W3C.inject(attributes, setter=ATTRIBUTES)


class _Unrecorded(Untraced, contextlib.AbstractContextManager["_Unrecorded"]):
    """A decision the sampler dropped: nothing is current while it runs but its forward's send,
    whose trace context it passes on. Dropped without asking the SDK (`span` None), it makes the
    span the SDK makes for a dropped child when a forward first asks: the parent's trace and trace
    state, a span id of its own, not sampled, the random-trace-id flag kept."""

    def __init__(self, span: Span | None, parent: SpanContext = INVALID_SPAN_CONTEXT, ids: IdGenerator = _RANDOM_IDS):
        self.span, self.parent, self.ids = span, parent, ids

    def __exit__(self, *_: object) -> None:
        return None

    def sending(
        self, destination: str, data: bytes, ordering_key: str | None
    ) -> contextlib.AbstractContextManager[Span]:
        if self.span is None:
            p, span_id = self.parent, self.ids.generate_span_id()
            flags = TraceFlags(p.trace_flags & TraceFlags.RANDOM_TRACE_ID)
            self.span = NonRecordingSpan(SpanContext(p.trace_id, span_id, False, flags, p.trace_state))
        return trace.use_span(self.span)


_UNTRACED_DECISION = contextlib.nullcontext(UNTRACED)


class _Traced:
    """A recorded decision's `Traced`: its publish's span, where the heartbeat's events go. The
    heartbeat runs in a task of its own, so it is handed this (`Heartbeat.traced`), not a context."""

    __slots__ = ("publish", "tracer")

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer
        self.publish: Span = trace.INVALID_SPAN

    @contextlib.contextmanager
    def running(self, span: Span) -> Iterator[Traced]:
        """The decision's span current while it runs, and ended after."""
        with trace.use_span(span, end_on_exit=True):
            yield self

    @contextlib.contextmanager
    def sending(self, destination: str, data: bytes, ordering_key: str | None) -> Iterator[Span]:
        topic = _short_name(destination) or destination
        described = messaging_attributes("send", topic, len(data), ordering_key)
        with self.tracer.start_as_current_span(f"{topic} send", kind=SpanKind.PRODUCER, attributes=described) as span:
            self.publish = span
            yield span

    def heartbeat(self, event: str, **attributes: str) -> None:
        if self.publish.is_recording():  # not once the publish has ended
            self.publish.add_event(event, attributes)


def _short_name(path: str | None) -> str | None:
    return path.rsplit("/", 1)[-1] if path else path


NO_TELEMETRY = Telemetry()
