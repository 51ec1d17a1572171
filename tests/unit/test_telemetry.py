"""OpenTelemetry: `/metrics` read back with a real Prometheus parser, spans with the SDK's in-memory exporter.

The engine runs on real parts (SQLite store behind the guard, the push app over ASGI);
only the publisher and recorder are our in-memory ones. Metrics and spans come from the
SDK providers the product builds (`pubsub_filter.observability.telemetry`).
"""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import random
import re
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagators.cloud_trace_propagator import CloudTraceFormatPropagator
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, SamplingResult
from opentelemetry.trace import INVALID_SPAN, SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope, parse_envelope
from pubsub_filter.core.model import Decision, DecisionRecord, KeyState, Message
from pubsub_filter.core.ports import UNTRACED, Failure, StoreUnavailable
from pubsub_filter.google.shared import PROJECT_ENVS
from pubsub_filter.observability import logsetup
from pubsub_filter.observability.instrumented import InstrumentedPublisher, InstrumentedStore
from pubsub_filter.observability.telemetry import NO_TELEMETRY, PrometheusText, Telemetry
from pubsub_filter.push.app import create_app
from pubsub_filter.push.trace_headers import request_parent_of
from pubsub_filter.runtime.otel import drops_unsampled_parents, from_config, sampler
from tests.support.clock import ManualClock, ManualSleep
from tests.support.fakes import MemoryPublisher, MemoryRecorder

CONFIG: dict[str, Any] = {
    "routes": [
        {"name": "reports", "destination": "phase3", "key": ["payload.game_date"], "subscription": "raw-reports"},
    ],
}
SUB = "projects/p/subscriptions/raw-reports"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


class SeededIds(IdGenerator):
    """The SDK's random ids from a seeded source: a statistical test that repeats."""

    def __init__(self, source: random.Random) -> None:
        self.source = source

    def generate_span_id(self) -> int:
        return self.source.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self.source.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:
        return True


class Rig:
    def __init__(
        self,
        tmp_path: Path,
        metrics: bool = True,
        traces: bool = True,
        sampler: Sampler | None = None,
        ids: random.Random | None = None,
        drops_unsampled_parents: bool = False,
    ) -> None:
        self.spans = InMemorySpanExporter()
        self.prometheus = PrometheusText() if metrics else None
        meters = MeterProvider(metric_readers=[self.prometheus.reader]) if self.prometheus else None
        tracer = None
        if traces:
            tracer = TracerProvider(sampler=sampler or ALWAYS_ON, id_generator=SeededIds(ids) if ids else None)
            tracer.add_span_processor(SimpleSpanProcessor(self.spans))
        self.telemetry = Telemetry(meters, tracer, self.prometheus, drops_unsampled_parents=drops_unsampled_parents)
        cfg = parse(CONFIG)
        store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors, inline=True)
        self.publisher = MemoryPublisher()
        self.recorder = MemoryRecorder()
        self.engine = Engine(
            cfg,
            InstrumentedStore(store, self.telemetry),
            InstrumentedPublisher(self.publisher, self.telemetry),
            self.recorder,
            telemetry=self.telemetry,
        )
        self.telemetry.watch(self.engine.rules, lambda: self.engine.in_flight, self.engine.recorder.outcomes)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(self.engine)), base_url="http://f")

    async def push(self, body: bytes, route: str = "reports", **headers: str) -> httpx.Response:
        return await self.client.post(f"/push/{route}", content=body, headers=headers)

    async def metrics(self) -> dict[str, Any]:
        resp = await self.client.get("/metrics")
        assert resp.status_code == 200
        return {f.name: f for f in text_string_to_metric_families(resp.text)}

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def decision_span(self) -> ReadableSpan:
        [span] = [s for s in self.finished() if s.kind is SpanKind.CONSUMER]
        return span


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path)
    yield r
    await r.client.aclose()
    await r.engine.store.close()


def envelope(
    game_date: str = "2025-01-10", message_id: str = "1", delivery_attempt: int | None = None, **kw: Any
) -> bytes:
    kw.setdefault("subscription", SUB)
    body = make_envelope(json.dumps({"game_date": game_date}).encode(), message_id, **kw)
    if delivery_attempt is None:
        return body
    return json.dumps({**json.loads(body), "deliveryAttempt": delivery_attempt}).encode()


def children_of(rig: Rig, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in rig.finished() if s.parent is not None and s.parent.span_id == parent.context.span_id]


# --- metrics ------------------------------------------------------------------------------


async def test_decision_counts_on_metrics_match_the_decision_records(rig: Rig) -> None:
    await rig.push(envelope(message_id="1"))  # forwarded
    await rig.push(envelope(message_id="2"))  # suppressed
    await rig.push(envelope(message_id="1"))  # duplicate
    await rig.push(envelope("2025-01-11", message_id="3"))  # forwarded
    await rig.push(b"not an envelope")  # rejected
    await rig.push(envelope(message_id="4"), route="nope")  # rejected, unknown route
    families = await rig.metrics()
    counted = Counter(
        {
            (s.labels["route"], s.labels["decision"], s.labels["enforced"]): int(s.value)
            for s in families["pubsub_filter_decisions"].samples
            if s.name == "pubsub_filter_decisions_total"
        }
    )
    label = rig.telemetry.route_label  # a made-up route is counted under the one shared label
    recorded = Counter(
        (label(r.route), str(r.decision), "true" if r.enforced else "false") for r in rig.recorder.records
    )
    assert counted == recorded
    assert counted[("(unknown)", "rejected", "true")] == 1
    assert sum(recorded.values()) == 6


async def test_decision_latency_histogram_has_one_observation_per_decision(rig: Rig) -> None:
    await rig.push(envelope(message_id="1"))
    await rig.push(envelope(message_id="2"))
    families = await rig.metrics()
    counts = {
        s.labels["decision"]: s.value
        for s in families["pubsub_filter_decision_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert counts == {"forwarded": 1, "suppressed": 1}


async def test_store_and_publish_latency_are_measured_per_operation(rig: Rig) -> None:
    await rig.push(envelope(message_id="1"))  # read, claim, publish, commit
    await rig.push(envelope(message_id="2"))  # read
    families = await rig.metrics()
    store = {
        s.labels["operation"]: s.value
        for s in families["pubsub_filter_store_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert store == {"read": 2, "claim": 1, "commit": 1}
    [publish] = [s for s in families["pubsub_filter_publish_duration_seconds"].samples if s.name.endswith("_count")]
    assert (publish.labels, publish.value) == ({"destination": "phase3", "outcome": "ok"}, 1)


async def test_in_flight_is_zero_between_messages(rig: Rig) -> None:
    await rig.push(envelope())
    [sample] = (await rig.metrics())["pubsub_filter_in_flight"].samples
    assert sample.value == 0


async def test_without_metrics_there_is_no_metrics_endpoint(tmp_path: Path) -> None:
    rig = Rig(tmp_path, metrics=False)
    try:
        assert (await rig.client.get("/metrics")).status_code == 404
    finally:
        await rig.client.aclose()
        await rig.engine.store.close()


class _Unreachable:
    async def read(self, route: str, key: str) -> KeyState | None:
        raise StoreUnavailable("down")


async def test_a_store_read_that_fails_outside_a_recorded_span_is_measured_as_an_error() -> None:
    prometheus = PrometheusText()
    telemetry = Telemetry(MeterProvider(metric_readers=[prometheus.reader]), None, prometheus)
    store = InstrumentedStore(_Unreachable(), telemetry)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):
        await store.read("reports", "k")
    [family] = [
        f
        for f in text_string_to_metric_families(prometheus.render().decode())
        if f.name.endswith("store_duration_seconds")
    ]
    counts = {
        (s.labels["operation"], s.labels["outcome"]): s.value for s in family.samples if s.name.endswith("_count")
    }
    assert counts == {("read", "error"): 1}


async def test_a_store_call_that_fails_in_a_recorded_decision_ends_its_span_as_an_error(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        store = InstrumentedStore(_Unreachable(), rig.telemetry)  # type: ignore[arg-type]
        with rig.telemetry.decision("reports", parse_envelope(envelope())), pytest.raises(StoreUnavailable):
            await store.read("reports", "k")
        [read] = [s for s in rig.finished() if s.name == "store read"]
        assert read.end_time is not None and read.status.status_code is StatusCode.ERROR
        assert read.status.description == "StoreUnavailable: down"
        assert [e.name for e in read.events] == ["exception"]
    finally:
        await rig.client.aclose()
        await rig.engine.store.close()


async def test_a_span_of_the_applications_own_does_not_make_the_filters_store_calls_traced(tmp_path: Path) -> None:
    """Only a span of the filter's own (a decision's) makes its store calls children: an
    application's span current around an in-process call is not taken for one."""
    rig = Rig(tmp_path)
    try:
        store = InstrumentedStore(_Unreachable(), rig.telemetry)  # type: ignore[arg-type]
        theirs = rig.telemetry.tracer_provider.get_tracer("the-application")  # type: ignore[union-attr]
        with theirs.start_as_current_span("their work"), pytest.raises(StoreUnavailable):
            await store.read("reports", "k")
        assert [s.name for s in rig.finished()] == ["their work"]
        with rig.telemetry.decision("reports", parse_envelope(envelope())), pytest.raises(StoreUnavailable):
            await store.read("reports", "k")
        assert "store read" in [s.name for s in rig.finished()]
    finally:
        await rig.client.aclose()
        await rig.engine.store.close()


async def test_a_store_read_without_metrics_or_spans_returns_the_stores_answer() -> None:
    class Answering:
        async def read(self, route: str, key: str) -> KeyState | None:
            return None if key == "missing" else KeyState(fingerprint=f"{route}/{key}")

    store = InstrumentedStore(Answering(), NO_TELEMETRY)  # type: ignore[arg-type]
    assert (await store.read("r", "missing"), await store.read("r", "k")) == (None, KeyState(fingerprint="r/k"))


async def test_the_store_latency_series_are_listed_in_the_order_of_their_first_record(tmp_path: Path) -> None:
    rig = Rig(tmp_path, traces=False)
    try:
        await rig.push(envelope(message_id="1"))  # forwarded: read, claim, commit
        await rig.push(envelope(message_id="2"))  # suppressed: read
        families = await rig.metrics()
    finally:
        await rig.client.aclose()
        await rig.engine.store.close()
    samples = [
        (s.labels["operation"], s.labels["outcome"])
        for s in families["pubsub_filter_store_duration_seconds"].samples
        if s.name.endswith("_count")
    ]
    assert samples == [("read", "ok"), ("claim", "ok"), ("commit", "ok")]


def test_a_decision_without_tracing_yields_no_span() -> None:
    with NO_TELEMETRY.decision("r", Message(data=b"{}", attributes={}, message_id="1")) as traced:
        assert traced is UNTRACED and trace.get_current_span() is INVALID_SPAN


# --- spans --------------------------------------------------------------------------------


async def test_decision_span_follows_the_gcp_pubsub_messaging_conventions(rig: Rig) -> None:
    await rig.push(envelope(message_id="m-1", ordering_key="k1", delivery_attempt=3))
    span = rig.decision_span()
    assert span.name == "raw-reports process"
    assert span.attributes is not None
    assert {k: span.attributes.get(k) for k in span.attributes if k.startswith("messaging.")} == {
        "messaging.system": "gcp_pubsub",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.message.id": "m-1",
        "messaging.message.body.size": len(b'{"game_date": "2025-01-10"}'),
        "messaging.destination.name": "raw-reports",
        "messaging.destination.subscription.name": "raw-reports",
        "messaging.gcp_pubsub.message.ordering_key": "k1",
        "messaging.gcp_pubsub.message.delivery_attempt": 3,
    }
    assert span.attributes["pubsub_filter.decision"] == "forwarded"
    assert span.attributes["pubsub_filter.destination"] == "phase3"


async def test_a_forward_has_children_for_store_read_claim_publish_and_commit(rig: Rig) -> None:
    await rig.push(envelope())
    decision = rig.decision_span()
    names = [s.name for s in sorted(children_of(rig, decision), key=lambda s: s.start_time or 0)]
    assert names == ["store read", "store claim", "phase3 send", "store commit"]
    [send] = [s for s in children_of(rig, decision) if s.name == "phase3 send"]
    assert send.kind is SpanKind.PRODUCER
    assert send.attributes is not None and send.attributes["messaging.destination.name"] == "phase3"
    assert send.attributes["messaging.message.id"] == rig.publisher.ids[0]


async def test_a_suppression_reads_the_store_and_publishes_nothing(rig: Rig) -> None:
    await rig.push(envelope(message_id="1"))
    rig.spans.clear()
    await rig.push(envelope(message_id="2"))
    decision = rig.decision_span()
    assert [s.name for s in children_of(rig, decision)] == ["store read"]


async def test_the_parent_is_the_push_requests_traceparent(rig: Rig) -> None:
    await rig.push(envelope(), traceparent=f"00-{TRACE_ID}-{PARENT_SPAN}-01")
    span = rig.decision_span()
    assert span.parent is not None and span.parent.is_remote
    assert (format(span.context.trace_id, "032x"), format(span.parent.span_id, "016x")) == (TRACE_ID, PARENT_SPAN)


async def test_the_parent_is_the_x_cloud_trace_context_when_there_is_no_traceparent(rig: Rig) -> None:
    await rig.push(envelope(), **{"X-Cloud-Trace-Context": f"{TRACE_ID}/{int(PARENT_SPAN, 16)};o=1"})
    span = rig.decision_span()
    assert span.parent is not None
    assert (format(span.context.trace_id, "032x"), format(span.parent.span_id, "016x")) == (TRACE_ID, PARENT_SPAN)


async def test_the_parent_is_the_publishers_googclient_traceparent_when_the_request_names_none(rig: Rig) -> None:
    await rig.push(envelope(attributes={"googclient_traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"}))
    span = rig.decision_span()
    assert span.parent is not None
    assert (format(span.context.trace_id, "032x"), format(span.parent.span_id, "016x")) == (TRACE_ID, PARENT_SPAN)


async def test_the_forwarded_message_carries_the_publish_span_as_googclient_traceparent(rig: Rig) -> None:
    await rig.push(envelope(), traceparent=f"00-{TRACE_ID}-{PARENT_SPAN}-01")
    [send] = [s for s in rig.finished() if s.name == "phase3 send"]
    [published] = rig.publisher.published
    expected = f"00-{TRACE_ID}-{send.context.span_id:016x}-01"
    assert published.attributes["googclient_traceparent"] == expected


async def test_a_producers_malformed_traceparent_starts_a_new_trace_and_is_replaced(rig: Rig) -> None:
    await rig.push(envelope(attributes={"googclient_traceparent": "00-garbage"}))
    span = rig.decision_span()
    assert span.parent is None
    [published] = rig.publisher.published
    assert published.attributes["googclient_traceparent"].split("-")[1] == format(span.context.trace_id, "032x")


async def test_a_producers_trace_context_changes_no_decision(rig: Rig) -> None:
    await rig.push(envelope(message_id="1", attributes={"googclient_traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"}))
    other = f"00-{'1' * 32}-{'2' * 16}-01"
    r = await rig.push(envelope(message_id="2", attributes={"googclient_traceparent": other}))
    assert r.json()["decision"] == "suppressed"


async def test_heartbeats_are_events_on_the_publish_span(tmp_path: Path) -> None:
    CONFIG_HB = {
        **CONFIG,
        "lease": {"duration": "3s", "ack_deadline": "2s", "heartbeat": "1s"},
        "store_errors": {"timeout": "0.5s", "budget": "1s"},
    }
    rig = Rig(tmp_path)
    cfg = parse(CONFIG_HB)
    rig.engine.config = cfg
    extended = asyncio.Event()
    inner = rig.engine.store

    class Watch:
        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        async def extend(self, *a: Any) -> Any:
            try:
                return await inner.extend(*a)
            finally:
                extended.set()

    rig.engine.store = Watch()  # type: ignore[assignment]
    rig.engine.sleep = sleep = ManualSleep(ManualClock())
    rig.publisher.gate = asyncio.Event()
    try:
        pushed = asyncio.create_task(rig.push(envelope()))
        await sleep.wake()  # one beat, while the publish is held
        await extended.wait()
        rig.publisher.gate.set()
        assert (await pushed).json()["decision"] == "forwarded"
        [send] = [s for s in rig.finished() if s.name == "phase3 send"]
        assert send.events and {e.name for e in send.events} == {"lease extended"}
    finally:
        await rig.client.aclose()
        await rig.engine.store.close()


# --- sampling -----------------------------------------------------------------------------

UNSAMPLED_PARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-00"
SAMPLED_PARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01"
CLOUD_UNSAMPLED = {"X-Cloud-Trace-Context": f"{TRACE_ID}/{int(PARENT_SPAN, 16)};o=0"}


@pytest.fixture(params=[True, False], ids=["as-served", "every-decision-through-the-sdk"])
async def default_sampling(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    """The default sampler as `from_config` sets it up (a decision under an unsampled parent asks
    the SDK for nothing, `drops_unsampled_parents`), and the same with the SDK asked every time:
    what a test shows holds for both."""
    r = Rig(tmp_path, sampler=sampler({}), drops_unsampled_parents=request.param)
    yield r
    await r.client.aclose()
    await r.engine.store.close()


def test_without_a_sampler_setting_one_new_trace_in_a_hundred_is_sampled_and_parents_are_followed() -> None:
    assert sampler({}).get_description() == (
        "ParentBased{root:TraceIdRatioBased{0.01},remoteParentSampled:AlwaysOnSampler,"
        "remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,"
        "localParentNotSampled:AlwaysOffSampler}"
    )


async def test_by_default_a_decision_whose_push_request_is_sampled_is_recorded_with_its_children(
    default_sampling: Rig,
) -> None:
    await default_sampling.push(envelope(), traceparent=SAMPLED_PARENT)
    decision = default_sampling.decision_span()
    assert len(children_of(default_sampling, decision)) == 4


async def test_by_default_a_decision_whose_publisher_sampled_its_trace_is_recorded(default_sampling: Rig) -> None:
    await default_sampling.push(envelope(attributes={"googclient_traceparent": SAMPLED_PARENT}))
    assert default_sampling.decision_span().parent is not None


async def test_by_default_a_decision_whose_push_request_is_not_sampled_records_no_span(default_sampling: Rig) -> None:
    r = await default_sampling.push(envelope(), traceparent=UNSAMPLED_PARENT)
    assert r.json()["decision"] == "forwarded"
    assert default_sampling.finished() == []


class CountingSampler(Sampler):
    """A sampler that counts what it is asked, and answers as the one it wraps."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner
        self.asked = 0

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        self.asked += 1
        return self.inner.should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return self.inner.get_description()


@pytest.mark.parametrize(
    ("env", "drops"),
    [
        ({}, True),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_on"}, True),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, True),
        ({"OTEL_TRACES_SAMPLER": "PARENTBASED_TRACEIDRATIO", "OTEL_TRACES_SAMPLER_ARG": "1"}, True),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, True),
        ({"OTEL_TRACES_SAMPLER": "always_on"}, False),
        ({"OTEL_TRACES_SAMPLER": "traceidratio"}, False),
    ],
)
def test_the_samplers_that_drop_every_child_of_an_unsampled_parent_are_known_as_such(
    env: dict[str, str], drops: bool
) -> None:
    assert drops_unsampled_parents(env) is drops
    served = from_config(False, True, {**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"})
    try:
        assert served.drops_unsampled_parents is drops
    finally:
        served.shutdown()


@pytest.mark.parametrize("headers", [CLOUD_UNSAMPLED, {"traceparent": UNSAMPLED_PARENT}], ids=["cloud", "w3c"])
async def test_as_served_a_decision_under_an_unsampled_parent_does_not_ask_the_sampler(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    """Cloud Run's front end sends most requests with an unsampled parent: the default sampler
    drops each, so the decision's span is made without the SDK's tracer (as it would make it)."""
    counting = CountingSampler(sampler({}))
    rig = Rig(tmp_path, sampler=counting, drops_unsampled_parents=True)
    try:
        assert (await rig.push(envelope(), **headers)).json()["decision"] == "forwarded"
        assert counting.asked == 0 and rig.finished() == []
        await rig.push(envelope("2025-01-11", message_id="2"), traceparent=SAMPLED_PARENT)
        assert counting.asked > 0 and len(children_of(rig, rig.decision_span())) == 4
    finally:
        await rig.client.aclose()
        await rig.engine.store.close()


async def test_a_dropped_decision_leaves_no_trace_context_behind_it(default_sampling: Rig) -> None:
    """Decided in this task: what the next publish outside a decision carries is as before it."""
    unsampled = envelope(attributes={"googclient_traceparent": UNSAMPLED_PARENT})
    await default_sampling.engine.handle("reports", parse_envelope(unsampled))
    outgoing: dict[str, str] = {}
    default_sampling.telemetry.inject(outgoing)
    assert outgoing == {}
    assert "googclient_traceparent" in default_sampling.publisher.published[0].attributes


async def test_under_always_on_a_decision_under_an_unsampled_parent_is_recorded(tmp_path: Path) -> None:
    env = {"OTEL_TRACES_SAMPLER": "always_on"}
    rig = Rig(tmp_path, sampler=sampler(env), drops_unsampled_parents=drops_unsampled_parents(env))
    try:
        await rig.push(envelope(), **CLOUD_UNSAMPLED)
        decision = rig.decision_span()
        assert decision.parent is not None and format(decision.parent.span_id, "016x") == PARENT_SPAN
    finally:
        await rig.client.aclose()
        await rig.engine.store.close()


async def test_an_unsampled_forward_passes_its_trace_on_unsampled(default_sampling: Rig) -> None:
    await default_sampling.push(envelope(), traceparent=UNSAMPLED_PARENT)
    [published] = default_sampling.publisher.published
    version, trace_id, _span, flags = published.attributes["googclient_traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "00")


@pytest.mark.loop_may_block("its one push holds the loop 0.1-0.15 s under debug mode, every run; cause not found yet")
async def test_an_unsampled_decision_line_has_no_span_id(default_sampling: Rig, log_lines: io.StringIO) -> None:
    await default_sampling.push(envelope(), traceparent=UNSAMPLED_PARENT)
    [line] = [json.loads(x) for x in log_lines.getvalue().splitlines() if '"decision"' in x]
    assert logsetup.SPAN_FIELD not in line


@pytest.mark.parametrize(("ratio", "recorded"), [("0", 0), ("1", 1), ("1.0", 1)])
async def test_otel_traces_sampler_arg_is_the_ratio_of_new_traces_sampled(
    tmp_path: Path, ratio: str, recorded: int
) -> None:
    env = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": ratio}
    rig = Rig(tmp_path, sampler=sampler(env))
    try:
        await rig.push(envelope())
        assert len([s for s in rig.finished() if s.kind is SpanKind.CONSUMER]) == recorded
    finally:
        await rig.client.aclose()
        await rig.engine.store.close()


def test_otel_traces_sampler_arg_alone_sets_the_default_samplers_ratio() -> None:
    assert "TraceIdRatioBased{0.25}" in sampler({"OTEL_TRACES_SAMPLER_ARG": "0.25"}).get_description()


async def test_otel_traces_sampler_always_on_records_every_new_trace(tmp_path: Path) -> None:
    rig = Rig(tmp_path, sampler=sampler({"OTEL_TRACES_SAMPLER": "always_on"}))
    try:
        for i in range(5):
            await rig.push(envelope(message_id=str(i)))
        assert len([s for s in rig.finished() if s.kind is SpanKind.CONSUMER]) == 5
    finally:
        await rig.client.aclose()
        await rig.engine.store.close()


def test_from_config_takes_the_sampler_from_its_environment(otlp_receiver: http.server.ThreadingHTTPServer) -> None:
    endpoint = f"http://127.0.0.1:{otlp_receiver.server_address[1]}"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_off"}
    telemetry = from_config(metrics=False, traces=True, env=env)
    try:
        assert telemetry.tracer_provider is not None
        assert telemetry.tracer_provider.sampler.get_description() == "AlwaysOffSampler"
    finally:
        telemetry.shutdown()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER='sometimes' is not one of always_on"),
        ({"OTEL_TRACES_SAMPLER_ARG": "half"}, "OTEL_TRACES_SAMPLER_ARG='half' is not a ratio between 0 and 1"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
            "OTEL_TRACES_SAMPLER_ARG='1.5' is not a ratio between 0 and 1",
        ),
    ],
)
def test_a_sampler_setting_the_sdk_would_replace_is_a_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(Failure) as err:
        sampler(env)
    assert str(err.value).startswith(message)


# --- the sampler's verdicts, as the SDK reaches them ------------------------------------------

LOW_64 = (1 << 64) - 1
UNSAMPLED_NEW_TRACE = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-02")  # flags: not sampled, random trace id


def ratio_sampling(ratio: str) -> Sampler:
    return sampler({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": ratio})


@pytest.fixture
async def rigs(tmp_path: Path) -> AsyncIterator[list[Rig]]:
    """Rigs a test builds (each in its own directory), closed after it."""
    made: list[Rig] = []
    yield made
    for r in made:
        await r.client.aclose()
        await r.engine.store.close()


def build(rigs: list[Rig], tmp_path: Path, sampling: Sampler, ids: random.Random | None = None) -> Rig:
    """A rig as `from_config` sets one up for `sampling`: a parent-based sampler's decisions under
    an unsampled parent are dropped without asking the SDK (`drops_unsampled_parents`)."""
    where = tmp_path / str(len(rigs))
    where.mkdir()
    rigs.append(Rig(where, sampler=sampling, ids=ids, drops_unsampled_parents=isinstance(sampling, ParentBased)))
    return rigs[-1]


async def test_a_dropped_decision_without_a_parent_records_no_span_and_passes_an_unsampled_trace_on(
    rigs: list[Rig], tmp_path: Path
) -> None:
    rig = build(rigs, tmp_path, ratio_sampling("0"))
    assert (await rig.push(envelope())).json()["decision"] == "forwarded"
    assert rig.finished() == []
    [published] = rig.publisher.published
    assert UNSAMPLED_NEW_TRACE.fullmatch(published.attributes["googclient_traceparent"])


async def test_two_dropped_forwards_without_a_parent_start_two_traces(rigs: list[Rig], tmp_path: Path) -> None:
    rig = build(rigs, tmp_path, ratio_sampling("0"))
    await rig.push(envelope("2025-01-10", message_id="1"))
    await rig.push(envelope("2025-01-11", message_id="2"))
    first, second = (p.attributes["googclient_traceparent"].split("-") for p in rig.publisher.published)
    assert first[1] != second[1] and first[2] != second[2]


async def test_a_sampled_decision_without_a_parent_is_recorded_as_the_sdk_records_it(
    rigs: list[Rig], tmp_path: Path
) -> None:
    rig = build(rigs, tmp_path, ratio_sampling("1"))
    await rig.push(envelope(message_id="m-1"))
    decision = rig.decision_span()
    assert decision.parent is None and decision.name == "raw-reports process"
    assert decision.attributes is not None and decision.attributes["messaging.message.id"] == "m-1"
    assert decision.attributes["pubsub_filter.decision"] == "forwarded"
    names = [s.name for s in sorted(children_of(rig, decision), key=lambda s: s.start_time or 0)]
    assert names == ["store read", "store claim", "phase3 send", "store commit"]
    [send] = [s for s in rig.finished() if s.name == "phase3 send"]
    [published] = rig.publisher.published
    expected = f"00-{decision.context.trace_id:032x}-{send.context.span_id:016x}-03"  # sampled, random trace id
    assert published.attributes["googclient_traceparent"] == expected


@pytest.mark.loop_may_block("2,000 decisions in one step of its body, no server: CPU it means to spend")
async def test_new_traces_are_sampled_at_the_configured_ratio_by_the_trace_id_rule(
    rigs: list[Rig], tmp_path: Path
) -> None:
    """Sampled iff the trace id's low 64 bits are below ratio * 2^64 (TraceIdRatioBased), for the
    traces recorded here and the ones passed on unsampled: a downstream ratio sampler agrees."""
    rig = build(rigs, tmp_path, ratio_sampling("0.25"), ids=random.Random(14))
    bound, telemetry, decisions = 2**62, rig.telemetry, 2000
    passed_on: list[int] = []
    for i in range(decisions):
        with telemetry.decision("reports", parse_envelope(envelope(message_id=str(i)))) as traced:
            outgoing: dict[str, str] = {}
            with traced.sending("phase3", b"", None):
                telemetry.inject(outgoing)
            passed_on.append(int(outgoing["googclient_traceparent"].split("-")[1], 16))
    recorded = {span.context.trace_id for span in rig.finished()}
    assert 0.22 < len(recorded) / decisions < 0.28
    assert all(trace_id & LOW_64 < bound for trace_id in recorded)
    assert all(trace_id & LOW_64 >= bound for trace_id in passed_on if trace_id not in recorded)


@pytest.mark.parametrize(
    ("ratio", "headers", "attributes", "recorded"),
    [
        ("1", {"traceparent": UNSAMPLED_PARENT}, {}, False),
        ("1", {}, {"googclient_traceparent": UNSAMPLED_PARENT}, False),
        ("0", {"traceparent": SAMPLED_PARENT}, {}, True),
        ("0", {"X-Cloud-Trace-Context": f"{TRACE_ID}/{int(PARENT_SPAN, 16)};o=1"}, {}, True),
        ("0", {}, {"googclient_traceparent": SAMPLED_PARENT}, True),
    ],
    ids=["unsampled-header", "unsampled-attribute", "sampled-header", "sampled-cloud-header", "sampled-attribute"],
)
async def test_a_decision_with_a_parent_follows_the_parent_whatever_the_ratio_for_new_traces(
    rigs: list[Rig], tmp_path: Path, ratio: str, headers: dict[str, str], attributes: dict[str, str], recorded: bool
) -> None:
    rig = build(rigs, tmp_path, ratio_sampling(ratio))
    await rig.push(envelope(attributes=attributes), **headers)
    [published] = rig.publisher.published
    assert published.attributes["googclient_traceparent"].split("-")[1] == TRACE_ID
    if not recorded:
        assert rig.finished() == []
        return
    decision = rig.decision_span()
    assert decision.parent is not None and format(decision.parent.span_id, "016x") == PARENT_SPAN


CLOUD_SAMPLED = {"X-Cloud-Trace-Context": f"{TRACE_ID}/{int(PARENT_SPAN, 16)};o=1"}


#: Every way a decision's parent can be unsampled: the push request's two headers, the message's attribute.
UNSAMPLED_PARENTS = pytest.mark.parametrize(
    ("headers", "attributes"),
    [
        ({"traceparent": UNSAMPLED_PARENT}, {}),
        (CLOUD_UNSAMPLED, {}),
        ({}, {"googclient_traceparent": UNSAMPLED_PARENT}),
    ],
    ids=["traceparent-00", "cloud-run-o=0", "message-attribute-00"],
)


@UNSAMPLED_PARENTS
async def test_a_forward_dropped_under_an_unsampled_parent_continues_its_trace_unsampled_under_a_span_id_of_its_own(
    default_sampling: Rig, headers: dict[str, str], attributes: dict[str, str]
) -> None:
    """As the SDK's NonRecordingSpan for a dropped child: the parent's trace, a new span id, flags 00."""
    await default_sampling.push(envelope(attributes=attributes), **headers)
    [published] = default_sampling.publisher.published
    version, trace_id, span_id, flags = published.attributes["googclient_traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "00")
    assert span_id not in (PARENT_SPAN, "0" * 16)
    assert default_sampling.finished() == []


async def test_a_forward_dropped_under_an_unsampled_parent_keeps_its_random_trace_id_flag_and_trace_state(
    default_sampling: Rig,
) -> None:
    random_flag = f"00-{TRACE_ID}-{PARENT_SPAN}-02"  # not sampled, random trace id (W3C level 2)
    await default_sampling.push(envelope(), traceparent=random_flag, tracestate="vendor=opaque")
    [published] = default_sampling.publisher.published
    assert published.attributes["googclient_traceparent"].split("-")[3] == "02"
    assert published.attributes["googclient_tracestate"] == "vendor=opaque"


async def test_a_span_the_surface_made_current_is_the_parent_when_the_push_request_names_none(rig: Rig) -> None:
    """The pull worker's and replay's way in: no request headers, the surface's span current."""
    with rig.telemetry.tracer.start_as_current_span("surface") as surface:
        await rig.engine.handle("reports", parse_envelope(envelope()))
    decision = rig.decision_span()
    assert decision.parent is not None and decision.parent.span_id == surface.get_span_context().span_id


async def test_a_current_context_without_a_span_leaves_the_parent_to_the_message(rig: Rig) -> None:
    """A surface may make baggage current and no span: the publisher's trace context is the parent then."""
    token = otel_context.attach(otel_context.set_value("some-key", "v"))
    try:
        await rig.engine.handle(
            "reports", parse_envelope(envelope(attributes={"googclient_traceparent": SAMPLED_PARENT}))
        )
    finally:
        otel_context.detach(token)
    decision = rig.decision_span()
    assert decision.parent is not None and format(decision.parent.span_id, "016x") == PARENT_SPAN


async def test_two_forwards_dropped_under_one_unsampled_parent_pass_on_two_span_ids(default_sampling: Rig) -> None:
    await default_sampling.push(envelope("2025-01-10", message_id="1"), traceparent=UNSAMPLED_PARENT)
    await default_sampling.push(envelope("2025-01-11", message_id="2"), traceparent=UNSAMPLED_PARENT)
    first, second = (p.attributes["googclient_traceparent"].split("-") for p in default_sampling.publisher.published)
    assert first[1] == second[1] == TRACE_ID and first[2] != second[2]


async def test_by_default_a_decision_under_cloud_runs_sampled_header_is_a_child_of_it_with_its_children(
    default_sampling: Rig,
) -> None:
    await default_sampling.push(envelope(), **CLOUD_SAMPLED)
    decision = default_sampling.decision_span()
    assert decision.parent is not None and decision.parent.is_remote
    assert (format(decision.context.trace_id, "032x"), format(decision.parent.span_id, "016x")) == (
        TRACE_ID,
        PARENT_SPAN,
    )
    names = [s.name for s in sorted(children_of(default_sampling, decision), key=lambda s: s.start_time or 0)]
    assert names == ["store read", "store claim", "phase3 send", "store commit"]
    [send] = [s for s in default_sampling.finished() if s.name == "phase3 send"]
    [published] = default_sampling.publisher.published
    assert published.attributes["googclient_traceparent"] == f"00-{TRACE_ID}-{send.context.span_id:016x}-01"


async def test_by_default_a_decision_under_a_publishers_sampled_parent_is_its_child(default_sampling: Rig) -> None:
    await default_sampling.push(envelope(attributes={"googclient_traceparent": SAMPLED_PARENT}))
    decision = default_sampling.decision_span()
    assert decision.parent is not None and decision.parent.is_remote
    assert (format(decision.context.trace_id, "032x"), format(decision.parent.span_id, "016x")) == (
        TRACE_ID,
        PARENT_SPAN,
    )
    assert decision.attributes is not None and decision.attributes["pubsub_filter.decision"] == "forwarded"


async def test_under_traceidratio_an_unsampled_parents_child_is_judged_by_its_trace_id_as_the_sdk_does(
    rigs: list[Rig], tmp_path: Path
) -> None:
    rig = build(rigs, tmp_path, sampler({"OTEL_TRACES_SAMPLER": "traceidratio"}))  # ratio 1: every trace id
    await rig.push(envelope(), traceparent=UNSAMPLED_PARENT)
    decision = rig.decision_span()
    assert decision.parent is not None and format(decision.parent.span_id, "016x") == PARENT_SPAN


async def test_an_unsampled_parent_on_one_message_changes_nothing_for_the_next(rigs: list[Rig], tmp_path: Path) -> None:
    rig = build(rigs, tmp_path, ratio_sampling("1"))
    await rig.push(envelope("2025-01-10", message_id="1", attributes={"googclient_traceparent": UNSAMPLED_PARENT}))
    await rig.push(envelope("2025-01-11", message_id="2"))
    decision = rig.decision_span()
    assert decision.parent is None and format(decision.context.trace_id, "032x") != TRACE_ID
    _, after = (p.attributes["googclient_traceparent"].split("-") for p in rig.publisher.published)
    assert (after[1], after[3]) == (format(decision.context.trace_id, "032x"), "03")


# --- logs ---------------------------------------------------------------------------------


@pytest.fixture
def log_lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    for name in ("LOG_FORMAT", "LOG_LEVEL", "K_SERVICE", *PROJECT_ENVS):
        monkeypatch.delenv(name, raising=False)
    saved, stream = structlog.get_config(), logsetup._OUT.stream
    out = io.StringIO()
    logsetup.configure(fmt="json", project="p", stream=out, cache=False)
    yield out
    structlog.configure(**saved)
    logsetup._OUT.stream = stream


async def test_the_decision_line_names_the_decision_span(rig: Rig, log_lines: io.StringIO) -> None:
    await rig.push(envelope(), traceparent=f"00-{TRACE_ID}-{PARENT_SPAN}-01")
    [line] = [json.loads(x) for x in log_lines.getvalue().splitlines() if '"decision"' in x]
    span = rig.decision_span()
    assert line[logsetup.SPAN_FIELD] == format(span.context.span_id, "016x")
    assert line[logsetup.TRACE_FIELD] == f"projects/p/traces/{TRACE_ID}"


async def test_a_decision_dropped_under_cloud_runs_unsampled_header_logs_its_trace_and_no_span_id(
    default_sampling: Rig, log_lines: io.StringIO
) -> None:
    await default_sampling.push(envelope(), **CLOUD_UNSAMPLED)
    [line] = [json.loads(x) for x in log_lines.getvalue().splitlines() if '"decision"' in x]
    assert line[logsetup.TRACE_FIELD] == f"projects/p/traces/{TRACE_ID}"
    assert logsetup.SPAN_FIELD not in line


async def test_without_a_span_the_decision_line_has_no_span_id(tmp_path: Path, log_lines: io.StringIO) -> None:
    rig = Rig(tmp_path, traces=False)
    try:
        await rig.push(envelope())
    finally:
        await rig.client.aclose()
        await rig.engine.store.close()
    [line] = [json.loads(x) for x in log_lines.getvalue().splitlines() if '"decision"' in x]
    assert logsetup.SPAN_FIELD not in line and logsetup.TRACE_FIELD not in line


# --- OTLP -----------------------------------------------------------------------------------


class _Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each request's path and protobuf body."""

    got: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.got.append((self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.got = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


async def test_otlp_endpoint_in_the_environment_exports_spans_and_metrics(
    tmp_path: Path, otlp_receiver: http.server.ThreadingHTTPServer
) -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    endpoint = f"http://127.0.0.1:{otlp_receiver.server_address[1]}"
    telemetry = from_config(metrics=True, traces=True, env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    cfg = parse(CONFIG)
    store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors, inline=True)
    engine = Engine(
        cfg,
        InstrumentedStore(store, telemetry),
        InstrumentedPublisher(MemoryPublisher(), telemetry),
        MemoryRecorder(),
        telemetry=telemetry,
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://f")
    sampled = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"}  # recorded whatever the ratio for new traces
    async with client:
        assert (await client.post("/push/reports", content=envelope(), headers=sampled)).status_code == 200
    await engine.store.close()
    await asyncio.to_thread(telemetry.shutdown)  # flushes both exporters

    got: list[tuple[str, bytes]] = otlp_receiver.got  # type: ignore[attr-defined]
    spans = [
        span.name
        for path, body in got
        if path == "/v1/traces"
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    assert sorted(spans) == sorted(["raw-reports process", "store read", "store claim", "phase3 send", "store commit"])
    metrics = {
        m.name
        for path, body in got
        if path == "/v1/metrics"
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {"pubsub_filter_decisions", "pubsub_filter_decision_duration"} <= metrics


def test_without_an_otlp_endpoint_no_spans_are_recorded() -> None:
    telemetry = from_config(metrics=True, traces=True, env={})
    assert (telemetry.metrics, telemetry.tracing) == (True, False)


def test_otel_sdk_disabled_turns_everything_off() -> None:
    telemetry = from_config(metrics=True, traces=True, env={"OTEL_SDK_DISABLED": "true"})
    assert (telemetry.metrics, telemetry.tracing, telemetry.prometheus) == (False, False, None)


@given(
    st.one_of(
        st.from_regex(r"[0-9a-f]{32}/[0-9]{1,22}(;o=[0-9]{1,22})?", fullmatch=True),
        st.sampled_from(["0" * 32 + "/5;o=1", TRACE_ID + "/0;o=1", TRACE_ID + f"/{2**64};o=1", TRACE_ID + "/5;o=3"]),
        st.text(max_size=60),
    )
)
def test_cloud_runs_trace_header_is_read_as_the_cloud_trace_propagator_reads_it(header: str) -> None:
    """The parent the propagator gives, or none; a header whose options number has more than 20
    digits names none (the propagator's int() of it is quadratic, and raises past 4,300)."""
    read = request_parent_of({b"x-cloud-trace-context": header})
    if len(header.partition(";o=")[2]) > 20:
        assert read is None
        return
    extracted = trace.get_current_span(CloudTraceFormatPropagator().extract({"x-cloud-trace-context": header}))
    expected = extracted.get_span_context()
    assert read == (expected if expected.is_valid else None)


def test_a_cloud_trace_header_with_options_past_20_digits_names_no_parent_and_leaves_traceparent_be() -> None:
    header = f"{TRACE_ID}/{int(PARENT_SPAN, 16)};o={'1' * 5000}"
    assert request_parent_of({b"x-cloud-trace-context": header}) is None
    assert request_parent_of({b"x-cloud-trace-context": header, b"traceparent": SAMPLED_PARENT}) is not None


async def test_the_records_metric_counts_the_rows_of_a_batch_written_again() -> None:
    """`pubsub_filter_records{outcome="retried"}`: read from the recorder's declared `outcomes()`."""

    class FailsOnce:
        name = "once"

        def __init__(self) -> None:
            self.calls = 0

        async def write(self, rows: list[Any]) -> None:
            self.calls += 1
            if self.calls == 1:
                raise OSError("sink down")

        async def close(self) -> None:
            pass

    prometheus = PrometheusText()
    telemetry = Telemetry(MeterProvider(metric_readers=[prometheus.reader]), None, prometheus)
    recorder = BatchingRecorder(FailsOnce(), batch_size=100, retry_attempts=3, retry_backoff=0)
    cfg = parse(CONFIG)
    engine = Engine(cfg, SqliteStore(":memory:"), MemoryPublisher(), recorder, telemetry=telemetry)
    telemetry.watch(engine.rules, lambda: engine.in_flight, engine.recorder.outcomes)
    for i in range(3):
        recorder.record(
            DecisionRecord(time=0.0, route="reports", decision=Decision.FORWARDED, enforced=True, message_id=str(i))
        )
    await recorder.flush()
    families = {f.name: f for f in text_string_to_metric_families(prometheus.render().decode())}
    counted = {s.labels["outcome"]: s.value for s in families["pubsub_filter_records"].samples}
    await engine.close()
    assert counted == {"written": 3, "retried": 3, "dropped": 0}
