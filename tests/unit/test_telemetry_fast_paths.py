"""What every message passes through, kept short (issue 14), reports what it reported before.

Latency histograms kept in process, a store read outside any recorded span, and the context
of a decision that records nothing; these tests hold each to the general path's output.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.parser import text_string_to_metric_families

from filter.core.model import KeyState, Message
from filter.core.ports import StoreUnavailable
from filter.observability.instrumented import InstrumentedStore
from filter.observability.latency import Histograms
from filter.observability.prometheus_text import PrometheusText
from filter.observability.telemetry import LATENCY_BUCKETS, NO_TELEMETRY, Telemetry
from filter.observability.tracing import UNSAMPLED_PARENT, UNSAMPLED_ROOT, DrawnIds, sampler
from tests.unit.test_telemetry import TRACE_ID, Rig, envelope

LABELS = [{"route": "r", "decision": "suppressed"}, {"route": "r", "decision": "forwarded"}]
VALUES = st.one_of(st.sampled_from(LATENCY_BUCKETS), st.floats(0, 200, allow_nan=False))


def points(histograms: Histograms) -> list[tuple[dict[str, str], list[int], int, float, float, float]]:
    [histogram] = histograms.histograms
    metric = histogram.metric()
    if metric is None:
        return []
    return [
        (dict(p.attributes or {}), list(p.bucket_counts), p.count, p.sum, p.min, p.max)  # type: ignore[attr-defined]
        for p in metric.data.data_points
    ]


def test_series_are_collected_in_the_order_of_their_first_record() -> None:
    histograms = Histograms("t")
    histogram = histograms.create("h", "s", "", LATENCY_BUCKETS)
    assert histograms.merge(None) is None
    histogram.record(0.1, LABELS[1])
    histogram.record(0.2, LABELS[0])
    histogram.record(0.3, dict(LABELS[1]))
    assert [(p[0], p[2]) for p in points(histograms)] == [(LABELS[1], 2), (LABELS[0], 1)]


class _Unreachable:
    async def read(self, route: str, key: str) -> KeyState | None:
        raise StoreUnavailable("down")


def store_counts(prometheus: PrometheusText) -> dict[tuple[str, str], float]:
    [family] = [
        f
        for f in text_string_to_metric_families(prometheus.render().decode())
        if f.name.endswith("store_duration_seconds")
    ]
    return {(s.labels["operation"], s.labels["outcome"]): s.value for s in family.samples if s.name.endswith("_count")}


async def test_a_store_read_that_fails_outside_a_recorded_span_is_measured_as_an_error() -> None:
    prometheus = PrometheusText()
    telemetry = Telemetry(MeterProvider(metric_readers=[prometheus.reader]), None, prometheus)
    store = InstrumentedStore(_Unreachable(), telemetry)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):
        await store.read("reports", "k")
    assert store_counts(prometheus) == {("read", "error"): 1}


async def test_a_store_read_without_metrics_or_spans_returns_the_stores_answer() -> None:
    class Answering:
        async def read(self, route: str, key: str) -> KeyState | None:
            return None if key == "missing" else KeyState(fingerprint=f"{route}/{key}")

    store = InstrumentedStore(Answering(), NO_TELEMETRY)  # type: ignore[arg-type]
    assert (await store.read("r", "missing"), await store.read("r", "k")) == (None, KeyState(fingerprint="r/k"))


def dropping(ratio: float) -> Telemetry:
    env = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(ratio)}
    return Telemetry(None, TracerProvider(sampler=sampler(env), id_generator=DrawnIds()), None, random.Random(7))


MESSAGE = Message(data=b"{}", attributes={}, message_id="1")


def test_a_decision_without_tracing_yields_no_span_and_sets_nothing() -> None:
    with NO_TELEMETRY.decision("r", MESSAGE) as span:
        assert (span, UNSAMPLED_ROOT.get(), UNSAMPLED_PARENT.get()) == (None, 0, None)


def test_a_dropped_decision_names_its_unsampled_trace_while_it_runs_and_not_after_it_fails() -> None:
    with pytest.raises(RuntimeError), dropping(0.0).decision("r", MESSAGE) as span:
        assert span is None and UNSAMPLED_ROOT.get() != 0
        raise RuntimeError("the decision failed")
    assert UNSAMPLED_ROOT.get() == 0


def test_a_decision_dropped_under_a_publishers_unsampled_parent_names_it_while_it_runs_and_not_after() -> None:
    msg = Message(
        data=b"{}", attributes={"googclient_traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-00"}, message_id="1"
    )
    with dropping(1.0).decision("r", msg) as span:
        parent = UNSAMPLED_PARENT.get()
        assert span is None and parent is not None and format(parent.trace_id, "032x") == TRACE_ID
    assert UNSAMPLED_PARENT.get() is None


async def test_the_store_latency_series_are_listed_in_the_order_of_their_first_record(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    rig = Rig(tmp_path / "a", traces=False)
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
