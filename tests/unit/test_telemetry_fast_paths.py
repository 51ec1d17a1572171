"""What every message passes through, kept short (issue 14), reports what it reported before.

A latency recorded through a series a caller holds, a store read outside any recorded span,
and the context of a decision that records nothing each have a path of their own; these
tests hold each to the general path's output.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
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


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(VALUES, st.sampled_from([0, 1])), max_size=40))
def test_recording_through_a_held_series_collects_what_recording_by_attributes_does(
    observations: list[tuple[float, int]],
) -> None:
    by_attributes, by_series = Histograms("t"), Histograms("t")
    plain = by_attributes.create("h", "s", "", LATENCY_BUCKETS)
    held = by_series.create("h", "s", "", LATENCY_BUCKETS)
    series = [held.series(labels) for labels in LABELS]  # taken before any record, as callers take them
    for value, which in observations:
        plain.record(value, LABELS[which])
        series[which].record(value)
    mine, theirs = points(by_series), points(by_attributes)
    assert [p[:3] + p[4:] for p in mine] == [p[:3] + p[4:] for p in theirs]
    assert all(math.isclose(a[3], b[3], rel_tol=1e-12, abs_tol=1e-12) for a, b in zip(mine, theirs, strict=True))


def test_a_series_taken_and_never_recorded_into_is_not_collected() -> None:
    histograms = Histograms("t")
    histograms.create("h", "s", "", LATENCY_BUCKETS).series(LABELS[0])
    assert histograms.merge(None) is None


def test_series_are_collected_in_the_order_of_their_first_record_not_of_their_taking() -> None:
    histograms = Histograms("t")
    histogram = histograms.create("h", "s", "", LATENCY_BUCKETS)
    first, second = histogram.series(LABELS[0]), histogram.series(LABELS[1])
    second.record(0.1)
    first.record(0.2)
    histogram.record(0.3, LABELS[1])
    assert [(p[0], p[2]) for p in points(histograms)] == [(LABELS[1], 2), (LABELS[0], 1)]


def test_one_attribute_set_has_one_series() -> None:
    histogram = Histograms("t").create("h", "s", "", LATENCY_BUCKETS)
    assert histogram.series(dict(LABELS[0])) is histogram.series(dict(LABELS[0]))


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


async def test_the_metrics_text_is_the_same_whether_a_histograms_series_were_taken_early_or_not(
    tmp_path: Path,
) -> None:
    """The store's read series are taken when the store is built; the text still lists them as first recorded."""
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
