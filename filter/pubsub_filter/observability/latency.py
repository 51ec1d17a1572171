"""Latency histograms kept in process, the one fast path left in telemetry: the SDK's
`Histogram.record` cleans and hashes the attribute set on every call, 14.5 % of a suppressed
request's instructions for its two records (bench/README.md, T); here a record is a dict lookup,
a bisect and a few adds under a lock. They reach `/metrics` as prometheus_client families and
OTLP as the SDK's cumulative `Histogram` points."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from itertools import accumulate
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope


class LatencyHistogram:
    """Same `record(value, attributes)` as an SDK histogram; a bucket holds values up to and including its bound."""

    def __init__(self, name: str, description: str, bounds: Sequence[float]) -> None:
        self.name, self.description, self.bounds = name, description, tuple(bounds)
        #: by attribute set, in the order of their first records: [bucket counts, count, sum, min, max]
        self.series: dict[tuple[tuple[str, str], ...], list[Any]] = {}
        self.lock = threading.Lock()
        self.start = time.time_ns()

    def record(self, value: float, attributes: Mapping[str, str]) -> None:
        key = tuple(attributes.items())
        with self.lock:
            if (s := self.series.get(key)) is None:
                s = self.series[key] = [[0] * (len(self.bounds) + 1), 0, 0.0, value, value]
            s[0][bisect.bisect_left(self.bounds, value)] += 1
            s[1] += 1
            s[2] += value
            if value < s[3]:
                s[3] = value
            if value > s[4]:
                s[4] = value

    def points(self) -> list[tuple[dict[str, str], list[int], int, float, float, float]]:
        with self.lock:
            return [(dict(key), list(s[0]), s[1], s[2], s[3], s[4]) for key, s in self.series.items()]

    def metric(self) -> Metric | None:
        """The cumulative state as an SDK metric (None before the first record)."""
        now, bounds = time.time_ns(), list(self.bounds)
        points = [
            HistogramDataPoint(labels, self.start, now, count, total, buckets, bounds, low, high)
            for labels, buckets, count, total, low, high in self.points()
        ]
        data = HistogramData(points, AggregationTemporality.CUMULATIVE)
        return Metric(self.name, self.description, "s", data) if points else None


class Latencies:
    """The process's latency histograms: a prometheus_client collector, and what an OTLP export adds."""

    def __init__(self, scope: str, resource: Resource) -> None:
        self.scope, self.resource = InstrumentationScope(scope), resource
        self.histograms: list[LatencyHistogram] = []

    def create(self, name: str, description: str, bounds: Sequence[float]) -> LatencyHistogram:
        self.histograms.append(LatencyHistogram(name, description, bounds))
        return self.histograms[-1]

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import HistogramMetricFamily

        for h in self.histograms:
            points = h.points()
            labels = sorted({k for p in points for k in p[0]})
            family = HistogramMetricFamily(f"{h.name}_seconds", h.description, labels=labels)
            les = [repr(float(b)) for b in h.bounds] + ["+Inf"]
            for attributes, buckets, _, total, _, _ in points:
                values = [attributes.get(k, "") for k in labels]
                family.add_metric(values, list(zip(les, accumulate(buckets), strict=True)), total)
            if points:
                yield family

    def with_latencies(self, data: MetricsData) -> MetricsData:
        """`data` with the histograms in its first resource's scope of ours (OTLP's encoder keeps
        one entry per resource and per scope: a second one would replace the first)."""
        ours = [m for m in (h.metric() for h in self.histograms) if m is not None]
        if not ours:
            return data
        first, *rest = data.resource_metrics or [ResourceMetrics(self.resource, [], "")]
        name = self.scope.name
        mine = next((s for s in first.scope_metrics if s.scope.name == name), ScopeMetrics(self.scope, [], ""))
        scopes = [s for s in first.scope_metrics if s is not mine]
        scopes.append(ScopeMetrics(mine.scope, [*mine.metrics, *ours], mine.schema_url))
        return MetricsData([ResourceMetrics(first.resource, scopes, first.schema_url), *rest])


class WithLatencies(MetricExporter):
    """An OTLP metric exporter (its public `export`) that sends the latency histograms beside the SDK's metrics."""

    def __init__(self, inner: MetricExporter, latencies: Latencies) -> None:
        super().__init__()
        self.inner, self.latencies = inner, latencies

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        return self.inner.export(self.latencies.with_latencies(metrics_data), timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)
