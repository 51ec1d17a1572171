"""Latency histograms kept in process and handed to the OpenTelemetry SDK's readers at collection.

Every message records two latencies (its decision, its store read), the suppress path's
included. The SDK's synchronous `Histogram.record` costs ~10 µs a call here, nearly all of it
cleaning and hashing the attribute set; a request on the suppress path costs ~450 µs of
CPU in all, so two such calls alone take most of a 5 % budget. Here a record is a dict
lookup, a bisect and three adds under a lock (~1 µs); without the lookup when the caller holds
the attribute set's `Series` (the decision's and the store read's do). At each collection the cumulative
counts become SDK `Histogram` points (explicit buckets, cumulative temporality), which the
SDK's readers then export like any other metric: Prometheus text on `/metrics` and OTLP.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

_bisect_left = bisect.bisect_left  # a global, not a module attribute: twice a message


class Series:
    """One attribute set's counts in a histogram. A caller that records under the same attributes
    every time holds its `Series` (`LatencyHistogram.series`) and skips the lookup by attributes."""

    __slots__ = ("_bounds", "_lock", "_recorded", "attributes", "count", "counts", "high", "low", "total")

    def __init__(
        self, attributes: dict[str, str], bounds: Sequence[float], lock: threading.Lock, recorded: list[Series]
    ) -> None:
        self.attributes = attributes
        self._bounds = bounds
        self._lock = lock  # the histogram's: a collection reads every series under it
        self._recorded = recorded
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0
        self.low = float("inf")
        self.high = float("-inf")

    def record(self, value: float) -> None:
        with self._lock:
            if not self.count:
                # collected in the order of first records, however early a caller took the series
                self._recorded.append(self)
            self.counts[_bisect_left(self._bounds, value)] += 1
            self.total += value
            self.count += 1
            # comparisons, not min()/max(): this runs twice a message, and a call costs more
            if value < self.low:
                self.low = value
            if value > self.high:
                self.high = value


@dataclass
class LatencyHistogram:
    """Same `record(value, attributes)` as an SDK histogram; buckets hold values up to and including their bound."""

    name: str
    unit: str
    description: str
    bounds: Sequence[float]
    _series: dict[tuple[tuple[str, str], ...], Series] = field(default_factory=dict)
    _recorded: list[Series] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _start: int = field(default_factory=time.time_ns)

    def series(self, attributes: Mapping[str, str]) -> Series:
        """The series of `attributes`, for recording into it directly (it is collected once it has a value)."""
        key = tuple(attributes.items())
        found = self._series.get(key)
        if found is None:
            with self._lock:
                found = self._series.setdefault(key, Series(dict(attributes), self.bounds, self._lock, self._recorded))
        return found

    def record(self, value: float, attributes: Mapping[str, str]) -> None:
        self.series(attributes).record(value)

    def metric(self) -> Metric | None:
        """The cumulative state as an SDK metric (None before the first record)."""
        now = time.time_ns()
        with self._lock:
            points = [
                HistogramDataPoint(
                    attributes=dict(p.attributes),
                    start_time_unix_nano=self._start,
                    time_unix_nano=now,
                    count=p.count,
                    sum=p.total,
                    bucket_counts=list(p.counts),
                    explicit_bounds=list(self.bounds),
                    min=p.low,
                    max=p.high,
                )
                for p in self._recorded
            ]
        if not points:
            return None
        data = HistogramData(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
        return Metric(name=self.name, description=self.description, unit=self.unit, data=data)


class Histograms:
    """The process's latency histograms, merged into whatever a reader collected from the SDK."""

    def __init__(self, scope: str, resource: Resource | None = None) -> None:
        self.scope = InstrumentationScope(scope)
        self.resource = resource or Resource.create({})
        self.histograms: list[LatencyHistogram] = []

    def create(self, name: str, unit: str, description: str, bounds: Sequence[float]) -> LatencyHistogram:
        histogram = LatencyHistogram(name, unit, description, tuple(bounds))
        self.histograms.append(histogram)
        return histogram

    def merge(self, data: MetricsData | None) -> MetricsData | None:
        ours = [m for m in (h.metric() for h in self.histograms) if m is not None]
        if not ours:
            return data
        if data is None or not data.resource_metrics:
            return MetricsData([ResourceMetrics(self.resource, [ScopeMetrics(self.scope, ours, "")], "")])
        first, *rest = data.resource_metrics
        scopes = list(first.scope_metrics)
        for i, scope in enumerate(scopes):
            if scope.scope.name == self.scope.name:
                scopes[i] = ScopeMetrics(scope.scope, [*scope.metrics, *ours], scope.schema_url)
                break
        else:
            scopes.append(ScopeMetrics(self.scope, ours, ""))
        return MetricsData([ResourceMetrics(first.resource, scopes, first.schema_url), *rest])


def unchanged(data: MetricsData | None) -> MetricsData | None:
    """A reader's merge before `Telemetry` sets it: what the SDK collected, as is."""
    return data
