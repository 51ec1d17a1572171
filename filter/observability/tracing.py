"""Trace context in and out: a push request's headers, a message's attributes (the way the
Pub/Sub client library carries it), the publish span that heartbeat events go on, and
which decisions are traced (the standard `OTEL_TRACES_SAMPLER`, and `EarlySampling`: the
same verdict for a decision without a parent, or with an unsampled one, reached without
entering the SDK)."""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from contextvars import ContextVar
from typing import NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagators.cloud_trace_propagator import CloudTraceFormatPropagator
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from filter.core.ports import Failure

SYSTEM = "gcp_pubsub"
#: The google-cloud-pubsub client's prefix for trace context in message attributes.
ATTRIBUTE_PREFIX = "googclient_"

W3C = TraceContextTextMapPropagator()
_CLOUD = CloudTraceFormatPropagator()
_REQUEST_PROPAGATORS = ((b"traceparent", W3C), (b"x-cloud-trace-context", _CLOUD))
#: The headers `request_parent_of` reads (the push app collects them in its one pass).
REQUEST_HEADERS = (b"traceparent", b"tracestate", b"x-cloud-trace-context")


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


class _HeaderGetter(Getter[Mapping[bytes, str]]):
    """The push request's headers as the push app reads them (`headers_of`: lower-case ASGI
    names, the first of each): the propagators ask for lower-case names."""

    def get(self, carrier: Mapping[bytes, str], key: str) -> list[str] | None:
        value = carrier.get(key.encode("latin-1"))
        return None if value is None else [value]

    def keys(self, carrier: Mapping[bytes, str]) -> list[str]:
        return [k.decode("latin-1") for k in carrier]


ATTRIBUTES_GET = _AttributeGetter()
ATTRIBUTES_SET = _AttributeSetter()
_HEADERS_GET = _HeaderGetter()

#: The publish span of the decision under way, shared with the heartbeat task (it copies
#: this context when it starts, before the publish span exists, so it holds a box).
PUBLISH_SPAN: ContextVar[list[Span | None] | None] = ContextVar("pubsub_filter_publish_span", default=None)


#: The propagators' own formats (`TraceContextTextMapPropagator`, `CloudTraceFormatPropagator`),
#: compiled here: `request_parent` must read a header exactly as they do (a test holds it to that).
_TRACEPARENT = re.compile(r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:(-.*)|[ \t]*)$")
_TRACEPARENT_MAX = 512
_TRACESTATE_MAX = 8192
# The Cloud Trace propagator's pattern, but for the options' length: `o=` of thousands of digits
# would reach int() (which raises past 4,300). Such a header names no parent; its trace id is still logged.
_CLOUD_HEADER = re.compile(r"(?P<trace_id>[0-9a-f]{32})\/(?P<span_id>[\d]{1,20})(;o=(?P<trace_flags>\d{1,20}))?")


_SPAN_ID_MAX = (1 << 64) - 1
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
_SAMPLED = TraceFlags.SAMPLED


class RequestParent(NamedTuple):
    """The parent a push request's trace header names, read only as far as a decision's verdict
    needs: whether it is sampled. On Cloud Run nearly every push request names an unsampled
    parent and its decision is dropped (`EarlySampling`); only a forward of such a decision, a
    sampled parent, or a sampler that reads the parent needs its `SpanContext`, built then from
    the header's fields exactly as the propagators build it (converting the ids, the flags, the
    trace state and the SpanContext itself cost more than the rest of a dropped decision).

    A tuple, built by `_parent` with `tuple.__new__` (C, no Python frame as NamedTuple's own
    `__new__` or an `__init__` costs: one a push request), its fields read by C descriptors."""

    sampled: bool
    trace_id: str  # 32 hex digits, not all zero
    span_id: int | str  # an int (Cloud's decimal, checked in range) or 16 hex digits, not all zero
    flags: int
    state: str | None

    def span_context(self) -> SpanContext:
        span_id = self.span_id if isinstance(self.span_id, int) else int(self.span_id, 16)
        state = self.state
        trace_state = None if state is None or len(state) > _TRACESTATE_MAX else TraceState.from_header([state])
        return SpanContext(int(self.trace_id, 16), span_id, True, TraceFlags(self.flags), trace_state)


_parent = tuple.__new__


def request_parent_of(headers: Mapping[bytes, str]) -> RequestParent | None:
    """The parent a push request names: W3C `traceparent` (and `tracestate`), else
    `X-Cloud-Trace-Context`; None when neither names a valid one. `headers`: the push app's
    `headers_of`.

    What the two propagators extract, without their extract: on Cloud Run every push request
    carries a trace header and most decisions are dropped, and a propagator's extract (the
    getter, a context and a span built around the span context, ~40,000 instructions) cost
    more than the rest of a dropped decision's telemetry together. The checks here are the
    ones that decide validity (a SpanContext of 32 and 16 hex digits, not all zero, is always
    valid); `request_context` is the propagators' reading, kept for the test that holds this
    one to it."""
    value = headers.get(b"traceparent")
    if value is not None and len(value) <= _TRACEPARENT_MAX and (m := _TRACEPARENT.search(value)):
        version, trace_id, span_id, flags, rest = m.groups()
        if trace_id != _ZERO_TRACE and span_id != _ZERO_SPAN and version != "ff" and not (version == "00" and rest):
            bits = int(flags, 16)
            return _parent(RequestParent, (bits & _SAMPLED != 0, trace_id, span_id, bits, headers.get(b"tracestate")))
    value = headers.get(b"x-cloud-trace-context")
    if value is not None and (m := _CLOUD_HEADER.fullmatch(value)):
        return _cloud_parent(m)
    return None


def _cloud_parent(m: re.Match[str]) -> RequestParent | None:
    """The parent an `X-Cloud-Trace-Context` header `_CLOUD_HEADER` matched names; None when invalid."""
    trace_id, span_id, flags = m.group(1, 2, 4)  # trace_id, span_id, trace_flags
    if trace_id != _ZERO_TRACE and 0 < (span := int(span_id)) <= _SPAN_ID_MAX:
        bits = 0 if flags == "0" else int(flags or "0")  # "0": Cloud Run's usual, without the int()
        return _parent(RequestParent, (bits & _SAMPLED != 0, trace_id, span, bits, None))
    return None


#: The log line's trace: the id `X-Cloud-Trace-Context` starts with, else `traceparent`'s.
_LOG_TRACE = re.compile(r"^([0-9a-fA-F]{32})")
_LOG_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-")


def trace_of(headers: Mapping[bytes, str]) -> str | None:
    """The trace a push request's log line names (`logging.googleapis.com/trace`). Laxer than
    `request_parent_of`, and the other way round: `X-Cloud-Trace-Context` first, as Cloud
    Logging joins a request's lines by it."""
    header = headers.get(b"x-cloud-trace-context")
    if header and (m := _LOG_TRACE.match(header)):
        return m.group(1)
    header = headers.get(b"traceparent")
    if header and (m := _LOG_TRACEPARENT.match(header)):
        return m.group(1)
    return None


def request_parent(headers: Mapping[bytes, str]) -> SpanContext | None:
    """`request_parent_of`'s parent as a SpanContext."""
    parent = request_parent_of(headers)
    return None if parent is None else parent.span_context()


def request_context(headers: Mapping[bytes, str]) -> otel_context.Context | None:
    """The parent a push request names, as the propagators extract it (`request_parent`'s reference)."""
    for header, propagator in _REQUEST_PROPAGATORS:
        if header not in headers:
            continue
        ctx = propagator.extract(headers, getter=_HEADERS_GET)
        if trace.get_current_span(ctx).get_span_context().is_valid:
            return ctx
    return None


#: The parent the push request names, while its decision runs (set by the push app). A decision
#: dropped under it (unsampled) sets nothing of its own: a forward reads the parent from here.
REQUEST_PARENT: ContextVar[RequestParent | None] = ContextVar("pubsub_filter_request_parent", default=None)

#: Where a traced publisher leaves its trace context in a message's attributes.
MESSAGE_TRACEPARENT = ATTRIBUTE_PREFIX + "traceparent"


def message_parent(attributes: Mapping[str, str]) -> SpanContext | None:
    """The parent a traced publisher left in the message's attributes (`googclient_traceparent`)."""
    if MESSAGE_TRACEPARENT not in attributes:
        return None
    parent = trace.get_current_span(W3C.extract(attributes, getter=ATTRIBUTES_GET)).get_span_context()
    return parent if parent.is_valid else None


def short_name(path: str | None) -> str | None:
    return path.rsplit("/", 1)[-1] if path else path


# --- sampling ---------------------------------------------------------------------------

#: Without `OTEL_TRACES_SAMPLER`: a decision is traced when its parent (the push request's
#: trace, the publisher's) is sampled, and 1 % of decisions that start a trace. Recording and
#: exporting every decision doubles the suppress path's CPU (bench/README.md).
DEFAULT_SAMPLER = "parentbased_traceidratio"
DEFAULT_RATIO = 0.01


#: The verdict each ParentBased `parent_based` builds reaches without the SDK (`EarlySampling`): on a span
#: without a parent, sampled iff the trace id's low 64 bits are below this bound (None: not known
#: here); and whether every child of an unsampled parent is dropped. Kept beside the sampler as
#: it is built, because the SDK does not expose what a ParentBased wraps.
class _Rule(NamedTuple):
    bound: int | None
    drops_unsampled_parents: bool


_RULES: weakref.WeakKeyDictionary[Sampler, _Rule] = weakref.WeakKeyDictionary()


def parent_based(root: Sampler, kind: type[ParentBased] = ParentBased) -> ParentBased:
    """`kind(root)` with its default delegates (a parent's flag decides a child), known to
    `EarlySampling`: built here, its root is known without reading the SDK's unexposed fields."""
    s = kind(root)
    _RULES[s] = _Rule(root_bound(root), True)
    return s


_SAMPLERS: dict[str, Callable[[float], Sampler]] = {
    "always_on": lambda _: ALWAYS_ON,
    "always_off": lambda _: ALWAYS_OFF,
    "traceidratio": TraceIdRatioBased,
    "parentbased_always_on": lambda _: parent_based(ALWAYS_ON),
    "parentbased_always_off": lambda _: parent_based(ALWAYS_OFF),
    "parentbased_traceidratio": lambda ratio: parent_based(TraceIdRatioBased(ratio)),
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


# --- decisions the sampler drops, decided before the SDK -------------------------------------

_LOW_64 = (1 << 64) - 1

#: The trace id of the decision under way when the sampler dropped it without a span: the
#: forwarded message still carries it, unsampled (`EarlySampling.context`). 0 otherwise.
UNSAMPLED_ROOT: ContextVar[int] = ContextVar("pubsub_filter_unsampled_root", default=0)
#: The unsampled parent of the decision under way when the sampler dropped it without a span:
#: the forwarded message continues its trace, unsampled (`EarlySampling.context_under`).
UNSAMPLED_PARENT: ContextVar[SpanContext | None] = ContextVar("pubsub_filter_unsampled_parent", default=None)


def root_bound(s: Sampler) -> int | None:
    """When `s`'s verdict on a span without a parent depends on nothing but the trace id's low
    64 bits (sampled iff below the bound: TraceIdRatioBased's rule; 0 for always off), that
    bound; None for any other sampler (always on, or one this module did not build)."""
    if isinstance(s, TraceIdRatioBased):
        return s.bound
    if s is ALWAYS_OFF:
        return 0
    rule = _RULES.get(s)
    return None if rule is None else rule.bound


def drops_unsampled_parents(s: Sampler) -> bool:
    """Whether `s` drops every span whose parent is valid and not sampled, whatever else the span
    is: always off, or a ParentBased `sampler` built (its delegates for such parents are the
    default always-off). Any other sampler is left to the SDK."""
    if s is ALWAYS_OFF:
        return True
    rule = _RULES.get(s)
    return rule is not None and rule.drops_unsampled_parents


class DrawnIds(IdGenerator):
    """Random ids, except a root trace id `EarlySampling` drew and found sampled: the SDK's
    sampler then judges the same id, so it reaches the same verdict. A tracer provider built
    with it (`TracerProvider(id_generator=DrawnIds())`, as `from_config` builds its own) lets
    `EarlySampling` decide before the SDK; any other is left to the SDK."""

    def __init__(self, inner: IdGenerator | None = None) -> None:
        self.inner = inner or RandomIdGenerator()
        self._next = threading.local()  # per thread: start_span reads it on the thread that set it

    def use_next(self, trace_id: int) -> None:
        self._next.trace_id = trace_id

    def generate_trace_id(self) -> int:
        trace_id: int = getattr(self._next, "trace_id", 0)
        if trace_id:
            self._next.trace_id = 0
            return trace_id
        return self.inner.generate_trace_id()

    def generate_span_id(self) -> int:
        return self.inner.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return self.inner.is_trace_id_random()


class EarlySampling:
    """The sampler's verdict on the decisions it drops, before the SDK is entered.

    Most decisions are dropped: those that start a trace (the default samples 1 in 100) and
    those whose parent is not sampled (on Cloud Run, most push requests: its front end names
    a trace in `X-Cloud-Trace-Context`, `o=0` unless the caller sampled it). Through the SDK a
    dropped one still costs a span, a sampler call, a context made current and undone: ~10 %
    of a suppressed request. Here it costs a random draw (no parent) or a flag test (a parent).

    Without a parent, the trace id is drawn first and judged by TraceIdRatioBased's rule; a
    sampled one is handed to the SDK, which starts its span on that id (and samples it again,
    the same way), so every recorded span is the SDK's own and a downstream ratio sampler
    agrees with ours. With an unsampled parent, under a sampler that drops every such span
    (`drops_unsampled_parents`), the verdict is the parent's flag; a sampled parent, or another
    sampler, goes to the SDK as before.
    """

    def __init__(self, ids: DrawnIds, bound: int, getrandbits: Callable[[int], int], parents: bool = False) -> None:
        self.bound = bound
        #: whether a decision with an unsampled parent is dropped here (`drops_unsampled_parents`)
        self.parents = parents
        self._bits = getrandbits
        self._ids = ids

    @classmethod
    def of(cls, tracer: object, getrandbits: Callable[[int], int]) -> EarlySampling | None:
        """For an SDK tracer drawing its ids from `DrawnIds`, with a ratio (or always-off) root
        sampler; else None (the SDK decides alone)."""
        if not isinstance(tracer, SdkTracer) or not isinstance(tracer.id_generator, DrawnIds):
            return None
        bound = root_bound(tracer.sampler)
        if bound is None:
            return None
        return cls(tracer.id_generator, bound, getrandbits, drops_unsampled_parents(tracer.sampler))

    def dropped(self) -> int:
        """A new trace's id when the sampler drops it; 0 when it samples it (the SDK's next
        root span then gets that id)."""
        trace_id = self._bits(128)
        while not trace_id:
            trace_id = self._bits(128)
        if trace_id & _LOW_64 >= self.bound:
            return trace_id
        self._ids.use_next(trace_id)
        return 0

    def _span_id(self) -> int:
        span_id = self._bits(64)
        while not span_id:
            span_id = self._bits(64)
        return span_id

    def context(self, trace_id: int) -> otel_context.Context:
        """What the SDK would have made current for the dropped decision: an unsampled span on
        `trace_id` with an id of its own (flags as the SDK sets them for a random trace id)."""
        flags = TraceFlags(TraceFlags.RANDOM_TRACE_ID)
        return trace.set_span_in_context(NonRecordingSpan(SpanContext(trace_id, self._span_id(), False, flags)))

    def context_under(self, parent: SpanContext) -> otel_context.Context:
        """What the SDK would have made current for a decision dropped under `parent`: an
        unsampled span in the parent's trace with an id of its own (a downstream consumer's
        parent is then this decision, as when the SDK drops it), the parent's trace state (the
        always-off delegate keeps it), and the random-trace-id flag when the parent has it."""
        flags = TraceFlags(TraceFlags.RANDOM_TRACE_ID if parent.trace_flags.random_trace_id else TraceFlags.DEFAULT)
        span = SpanContext(parent.trace_id, self._span_id(), False, flags, parent.trace_state)
        return trace.set_span_in_context(NonRecordingSpan(span))
