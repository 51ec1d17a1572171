"""OpenTelemetry metrics and traces for every surface (push, pull, replay).

One `Telemetry` per process, handed to the engine. It owns the SDK's meter and tracer
providers and knows the filter's instruments; the engine calls it at a few marked
places (a decision starts, a decision ends, a lease is taken over), and the store and
publisher are wrapped (`filter.observability.instrumented`) so that their latency, their child spans
and the trace context on forwarded messages need no code in the engine.

- Metrics are collected on demand for `GET /metrics` (`filter.observability.prometheus_text`) and pushed
  over OTLP when the standard `OTEL_EXPORTER_OTLP_*` variables name an endpoint
  (`filter.observability.otlp`).
- Spans follow OpenTelemetry's messaging conventions for `gcp_pubsub`; trace context comes
  in and goes out through `filter.observability.tracing`. Spans are only
  recorded when something exports them (an OTLP endpoint, or a provider a test passes
  in): with nothing to export, the decision path does not pay for spans no one reads.
  A decision that the sampler drops (one that starts a trace and falls outside the ratio,
  one whose parent is not sampled) does not enter the SDK either (`tracing.EarlySampling`).
- `OTEL_SDK_DISABLED=true`, or `telemetry.metrics` / `telemetry.traces` set to false in
  the config, turn either off.

`NO_TELEMETRY` does nothing, cheaply: engines built without telemetry (tests, `explain`)
use it.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from contextvars import ContextVar, Token
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode

from filter.core.model import Decision, DecisionRecord, Message
from filter.observability.latency import Histograms
from filter.observability.otlp import otlp_endpoint, otlp_metric_exporter, otlp_span_processor
from filter.observability.prometheus_text import PrometheusText
from filter.observability.tracing import (
    ATTRIBUTES_SET,
    MESSAGE_TRACEPARENT,
    PUBLISH_SPAN,
    REQUEST_PARENT,
    SYSTEM,
    UNSAMPLED_PARENT,
    UNSAMPLED_ROOT,
    W3C,
    DrawnIds,
    EarlySampling,
    message_parent,
    sampler,
    short_name,
)

T = TypeVar("T")

#: The one label every route name that is not configured shares (a request may name any).
UNKNOWN_ROUTE = "(unknown)"

SERVICE = "pubsub-filter"
SCOPE = "pubsub_filter"

#: Seconds. Decisions take from well under a millisecond (SQLite, suppressed) to a lease
#: duration (a publish retried under a heartbeat): the default OTel buckets are in ms.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Telemetry:
    """The filter's instruments on given providers; `Telemetry()` is off. `ids` is the random
    source of the trace ids drawn for decisions without a parent (a test seeds it); `resource`
    the one `meter_provider` was built with (the latency histograms are exported under it)."""

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        tracer_provider: TracerProvider | None = None,
        prometheus: PrometheusText | None = None,
        ids: random.Random | None = None,
        resource: Resource | None = None,
    ) -> None:
        self.meter_provider = meter_provider
        self.tracer_provider = tracer_provider
        self.prometheus = prometheus
        self.metrics = meter_provider is not None
        self.tracing = tracer_provider is not None
        self.tracer = tracer_provider.get_tracer(SCOPE) if tracer_provider is not None else trace.NoOpTracer()
        # the SDK's ids come from the random module too
        self._early = EarlySampling.of(self.tracer, (ids or random).getrandbits) if self.tracing else None
        # per (route, decision, enforced), built once (routes and decisions are few): its count,
        # the count's attribute set and the latency's
        self._decisions: dict[tuple[str, Decision, bool], _Decided] = {}
        #: the configured routes (`watch_engine`); any other name a request makes up is counted,
        #: timed and named on spans as `UNKNOWN_ROUTE`, so it adds no series. None: every name is one.
        self.routes: frozenset[str] | None = None
        self._watched: list[Callable[[], Iterable[tuple[str, Mapping[str, str], float]]]] = []
        if meter_provider is None:
            return
        m = meter_provider.get_meter(SCOPE)
        # Every decision counts, the suppress path's included: an increment here (`_Decided`), read
        # by the SDK at collection time. A synchronous counter's add() costs ~10 µs a call.
        m.create_observable_counter(
            "pubsub_filter_decisions",
            callbacks=[self._observe_decisions],
            unit="1",
            description="Decisions by route, decision and enforced.",
        )
        # Latencies are recorded on every path, the suppress path's included: kept in process
        # (filter.observability.latency) and merged into what each reader collects from the SDK.
        self.histograms = Histograms(SCOPE, resource)
        if prometheus is not None:
            prometheus.merge = self.histograms.merge
        self._latency = self.histograms.create(
            "pubsub_filter_decision_duration",
            "s",
            "Time from a message's arrival to its decision, by route and decision.",
            LATENCY_BUCKETS,
        )
        self.store_latency = self.histograms.create(
            "pubsub_filter_store_duration",
            "s",
            "State store calls (read, claim, extend, commit, release) by operation and outcome.",
            LATENCY_BUCKETS,
        )
        self.publish_latency = self.histograms.create(
            "pubsub_filter_publish_duration",
            "s",
            "Publishes to a destination topic, by destination and outcome.",
            LATENCY_BUCKETS,
        )
        self._takeovers = m.create_counter(
            "pubsub_filter_lease_takeovers", unit="1", description="Expired leases taken over, by route."
        )
        self.heartbeat_failures = m.create_counter(
            "pubsub_filter_heartbeat_failures", unit="1", description="Lease extensions that failed, by route."
        )
        self.commit_refusals = m.create_counter(
            "pubsub_filter_commit_refusals",
            unit="1",
            description="Commits refused because the lease's fence moved (the key was taken over), by route.",
        )
        self._fail_open = m.create_counter(
            "pubsub_filter_fail_open",
            unit="1",
            description="Messages forwarded without a dedup decision (store unreachable), by route.",
        )
        self._ids_reused = m.create_counter(
            "pubsub_filter_ids_reused",
            unit="1",
            description="Messages whose id was forwarded recently with other content (decided as new), by route.",
        )
        m.create_observable_counter(
            "pubsub_filter_records",
            callbacks=[self._observe("records")],
            unit="1",
            description="Decision records by outcome: written, retried (rows in a retried batch) or dropped.",
        )
        m.create_observable_gauge(
            "pubsub_filter_in_flight",
            callbacks=[self._observe("in_flight")],
            unit="1",
            description="Messages being decided now.",
        )

    # --- wiring -----------------------------------------------------------------------

    def watch(self, source: Callable[[], Iterable[tuple[str, Mapping[str, str], float]]]) -> None:
        """Read `(metric, attributes, value)` triples from `source` at each collection (no hot-path cost)."""
        self._watched.append(source)

    def watch_engine(self, engine: Any) -> None:
        self.routes = frozenset(engine.rules)
        self.watch(lambda: [("in_flight", {}, float(engine.in_flight))])
        recorder = engine.recorder
        self.watch(lambda: _record_counts(recorder))
        if self.metrics:
            # Every route's counters exist from the start, at zero: an alert or a rate() on a series
            # that appears only at its first event sees nothing (or a jump) instead of zero.
            counters = (self._takeovers, self.heartbeat_failures, self.commit_refusals, self._fail_open)
            for counter in (*counters, self._ids_reused):
                for route in self.routes:
                    counter.add(0, {"route": route})

    def route_label(self, route: str) -> str:
        """`route` as metrics and spans name it: itself when configured, else `UNKNOWN_ROUTE`."""
        return route if self.routes is None or route in self.routes else UNKNOWN_ROUTE

    def _observe_decisions(self, _options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        for decided in list(self._decisions.values()):  # one C-level copy: safe beside the loop
            if decided.count:
                yield Observation(decided.count, decided.attributes)

    def _observe(self, metric: str) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation

        def callback(_options: Any) -> Iterable[Observation]:
            for source in self._watched:
                for name, attributes, value in source():
                    if name == metric:
                        yield Observation(value, dict(attributes))

        return callback

    def shutdown(self) -> None:
        """Flush what OTLP has not sent yet (the end of a serve, pull or replay)."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()

    # --- the decision -------------------------------------------------------------------

    def decision(self, route: str, msg: Message) -> contextlib.AbstractContextManager[Span | None]:
        """The span of one decision, current while it runs. Its parent: the push request's
        trace (`tracing.REQUEST_PARENT`), else what the surface made current, else the
        context a traced publisher left in the message's attributes. None when the decision
        is not recorded; a decision the sampler drops (`tracing.EarlySampling`) makes nothing
        current either.

        Every message enters this, and nearly every one records nothing: those get a shared
        context that does nothing, or one that sets a single context variable, rather than a
        generator and its context manager (a few Python calls less per message)."""
        if not self.tracing:
            return _NOTHING
        early = self._early
        current = parent = None
        request = REQUEST_PARENT.get()
        if request is not None:
            # Dropped under the request's unsampled parent: nothing set, `inject` reads the request's.
            if early is not None and early.parents and not request.sampled:
                return _NOTHING
            parent = request.span_context()
        else:
            # An empty context (no surface made anything current: the push path) has no span to read.
            if otel_context.get_current():
                current = trace.get_current_span().get_span_context()
            if current is not None and current.is_valid:
                parent = current
            elif MESSAGE_TRACEPARENT in msg.attributes:
                parent = message_parent(msg.attributes)
            if early is not None:
                # Dropped here: no span, nothing made current; only a forward reads the trace (`inject`).
                if parent is None:
                    if dropped := early.dropped():
                        return _Setting(UNSAMPLED_ROOT, dropped)
                elif early.parents and not parent.trace_flags.sampled:
                    return _Setting(UNSAMPLED_PARENT, parent)
        return self._recorded(route, msg, parent, current)

    @contextlib.contextmanager
    def _recorded(
        self, route: str, msg: Message, parent: SpanContext | None, current: SpanContext | None
    ) -> Iterator[Span | None]:
        """A decision the SDK samples (or samples and drops itself): its span, current while it runs."""
        subscription = short_name(msg.subscription)
        route = self.route_label(route)
        # What a surface made current is current already; a request's or a message's parent is
        # handed to the SDK, alone in its context as a propagator extracts it.
        context = None
        if parent is not None and parent is not current:
            context = trace.set_span_in_context(NonRecordingSpan(parent), otel_context.Context())
        # The attributes go on after the sampler's verdict: an unsampled decision builds none.
        # (The SDK's samplers do not read them.)
        span = self.tracer.start_span(f"{subscription or route} process", context=context, kind=SpanKind.CONSUMER)
        if span.is_recording():
            span.set_attributes(_decision_attributes(route, msg, subscription))
        box = PUBLISH_SPAN.set([None])
        try:
            with trace.use_span(span, end_on_exit=True, record_exception=True, set_status_on_exception=True):
                yield span
        finally:
            PUBLISH_SPAN.reset(box)

    def decided(self, rec: DecisionRecord) -> None:
        """Count a finished decision (every one, rejected included) and describe it on its span."""
        if self.metrics:
            which = (rec.route, rec.decision, rec.enforced)
            decided = self._decisions.get(which)
            if decided is None:
                decided = self._first_of(which)
            decided.count += 1
            if rec.latency_ms is not None:
                self._latency.record(rec.latency_ms / 1000, decided.timed)
            if rec.decision is _FAIL_OPEN:
                self._fail_open.add(1, {"route": self.route_label(rec.route)})
            if rec.extra and rec.extra.get("id_reused"):
                self._ids_reused.add(1, {"route": self.route_label(rec.route)})
        if self.tracing and PUBLISH_SPAN.get() is not None:  # in a decision that entered the SDK
            span = trace.get_current_span()
            if span.is_recording():
                described: dict[str, str | bool] = {
                    "pubsub_filter.decision": str(rec.decision),
                    "pubsub_filter.enforced": rec.enforced,
                }
                if rec.key is not None:
                    described["pubsub_filter.key"] = rec.key
                if rec.destination:
                    described["pubsub_filter.destination"] = rec.destination
                if rec.published_id:
                    described["pubsub_filter.published_id"] = rec.published_id
                span.set_attributes(described)  # one call: the SDK takes its lock once per call
                if rec.decision in (Decision.FAILED, Decision.FAIL_OPEN):
                    span.set_status(Status(StatusCode.ERROR, rec.reason))

    def _first_of(self, which: tuple[str, Decision, bool]) -> _Decided:
        """The count of a (route, decision, enforced) not seen yet. Kept under the route's own
        name only when it is configured: made-up names share `UNKNOWN_ROUTE`'s, and add no entry."""
        route, decision, enforced = which
        label = self.route_label(route)
        shared = (label, decision, enforced)
        decided = self._decisions.get(shared)
        if decided is None:
            counted, timed = _labels(label, decision, enforced)
            decided = self._decisions.setdefault(shared, _Decided(counted, timed))
        return decided

    def lease_taken_over(self, route: str) -> None:
        if self.metrics:
            self._takeovers.add(1, {"route": self.route_label(route)})

    # --- children -----------------------------------------------------------------------

    @contextlib.contextmanager
    def child(
        self, name: str, attributes: Mapping[str, Any], kind: SpanKind = SpanKind.INTERNAL
    ) -> Iterator[Span | None]:
        """A child span of the current decision, current while it runs (none outside a
        decision, none when the decision is not recorded)."""
        if not self.recording():
            yield None
            return
        with self.tracer.start_as_current_span(name, kind=kind, attributes=attributes) as span:
            yield span

    def recording(self) -> bool:
        """Whether the current decision's span is recorded (sampled, with something to export it)."""
        return self.tracing and PUBLISH_SPAN.get() is not None and trace.get_current_span().is_recording()

    def store_span(self, operation: str, route: str) -> Span | None:
        """A child span for one store call, started and never made current: nothing inside a
        store call reads the current span, and attaching a context costs as much as the span."""
        if not self.recording():
            return None
        return self.tracer.start_span(f"store {operation}", attributes={"pubsub_filter.route": route})

    def publishing(self, span: Span | None) -> None:
        """Mark `span` as the decision's publish: heartbeat events go on it."""
        box = PUBLISH_SPAN.get()
        if box is not None:
            box[0] = span

    def heartbeat_event(self, name: str, **attributes: Any) -> None:
        box = PUBLISH_SPAN.get()
        span = box[0] if box is not None else None
        if span is not None and span.is_recording():
            span.add_event(name, attributes)

    def inject(self, attributes: MutableMapping[str, str]) -> None:
        """Write the current trace context into outgoing message attributes, as the Pub/Sub
        client library does (`googclient_traceparent`), so a traced consumer continues it."""
        if not self.tracing:
            return
        early = self._early
        if early is not None and (dropped := UNSAMPLED_ROOT.get()):
            W3C.inject(attributes, context=early.context(dropped), setter=ATTRIBUTES_SET)
        elif early is not None and (parent := UNSAMPLED_PARENT.get()) is not None:
            W3C.inject(attributes, context=early.context_under(parent), setter=ATTRIBUTES_SET)
        elif early is not None and early.parents and (request := REQUEST_PARENT.get()) and not request.sampled:
            # the decision was dropped under the push request's parent (`decision`)
            W3C.inject(attributes, context=early.context_under(request.span_context()), setter=ATTRIBUTES_SET)
        elif trace.get_current_span().get_span_context().is_valid:
            W3C.inject(attributes, setter=ATTRIBUTES_SET)


def _decision_attributes(route: str, msg: Message, subscription: str | None) -> dict[str, Any]:
    """OpenTelemetry's messaging attributes for a `gcp_pubsub` consumer, and the route."""
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.message.id": msg.message_id,
        "messaging.message.body.size": len(msg.data),
        "pubsub_filter.route": route,
    }
    if subscription:
        attributes["messaging.destination.name"] = subscription
        attributes["messaging.destination.subscription.name"] = subscription
    if msg.ordering_key:
        attributes["messaging.gcp_pubsub.message.ordering_key"] = msg.ordering_key
    if msg.delivery_attempt is not None:
        attributes["messaging.gcp_pubsub.message.delivery_attempt"] = msg.delivery_attempt
    return attributes


def _labels(route: str, decision: Decision, enforced: bool) -> tuple[dict[str, str], dict[str, str]]:
    return (
        {"route": route, "decision": str(decision), "enforced": "true" if enforced else "false"},
        {"route": route, "decision": str(decision)},
    )


def _record_counts(recorder: Any) -> list[tuple[str, Mapping[str, str], float]]:
    """written / retried / dropped, from the recorder and the batching recorder behind it."""
    totals = {"written": 0, "retried": 0, "dropped": 0}
    seen: set[int] = set()
    node = recorder
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        for outcome in totals:
            totals[outcome] += int(getattr(node, outcome, 0) or 0)
        node = getattr(node, "fallback", None)
    return [("records", {"outcome": k}, float(v)) for k, v in totals.items()]


class _Decided:
    """One (route, decision, enforced): how many so far, and their latencies' attribute set."""

    __slots__ = ("attributes", "count", "timed")

    def __init__(self, attributes: dict[str, str], timed: dict[str, str]) -> None:
        self.attributes = attributes
        self.timed = timed
        self.count = 0


#: read on every decision: a module constant, not the enum class's attribute lookup (~5x dearer)
_FAIL_OPEN = Decision.FAIL_OPEN


#: A decision's context when it records nothing and sets nothing (shared: it has no state).
_NOTHING: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


class _Setting(contextlib.AbstractContextManager[None]):
    """A dropped decision's context: `var` holds `value` while it runs (what a forward reads)."""

    __slots__ = ("_token", "_value", "_var")
    _token: Token[Any]

    def __init__(self, var: ContextVar[T], value: T) -> None:
        self._var: ContextVar[Any] = var
        self._value: Any = value

    def __enter__(self) -> None:
        self._token = self._var.set(self._value)

    def __exit__(self, *_: object) -> None:
        self._var.reset(self._token)


NO_TELEMETRY = Telemetry()


# --- from the config and the environment ------------------------------------------------------


def from_config(metrics: bool, traces: bool, env: Mapping[str, str] | None = None) -> Telemetry:
    """The process's telemetry: metrics for /metrics (and OTLP when an endpoint is set),
    spans when an OTLP endpoint is set. `OTEL_SDK_DISABLED=true` turns everything off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return NO_TELEMETRY
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or SERVICE})
    meter_provider = prometheus = exporting = None
    if metrics:
        prometheus = PrometheusText()
        readers: list[MetricReader] = [prometheus.reader]
        if otlp_endpoint("metrics", env):
            exporting = otlp_metric_exporter(env)
            readers.append(PeriodicExportingMetricReader(exporting))
        meter_provider = MeterProvider(metric_readers=readers, resource=resource)
    tracer_provider = None
    if traces and otlp_endpoint("traces", env):
        tracer_provider = TracerProvider(resource=resource, sampler=sampler(env), id_generator=DrawnIds())
        tracer_provider.add_span_processor(otlp_span_processor(env))
    telemetry = Telemetry(meter_provider, tracer_provider, prometheus, resource=resource)
    if exporting is not None:
        exporting.merge = telemetry.histograms.merge
    return telemetry
