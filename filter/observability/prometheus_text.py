"""The OpenTelemetry SDK's metrics as Prometheus text exposition, for `GET /metrics`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    MetricsData,
    NumberDataPoint,
    Sum,
)

from filter.observability.latency import unchanged


class PrometheusText:
    """The SDK's metrics, collected on demand, as Prometheus text exposition.

    The text is produced by prometheus_client's own `generate_latest`, from metric families
    built out of the SDK's cumulative data (an `InMemoryMetricReader`, read at each scrape)
    with the in-process latency histograms merged in, which the official OpenTelemetry
    Prometheus exporter has no public way to take.
    """

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.reader = InMemoryMetricReader()
        #: adds what the SDK does not hold (the in-process latency histograms); set by `Telemetry`
        self.merge: Callable[[MetricsData | None], MetricsData | None] = unchanged
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        data = self.merge(self.reader.get_metrics_data())
        if data is None:
            return
        for resource_metrics in data.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    name = metric.name + ("_seconds" if metric.unit == "s" else "")
                    points: list[Any] = list(metric.data.data_points)
                    labels = sorted({k for p in points for k in (p.attributes or {})})
                    description = metric.description or ""

                    family: Any
                    if isinstance(metric.data, HistogramData):
                        family = HistogramMetricFamily(name, description, labels=labels)
                        for p in points:
                            assert isinstance(p, HistogramDataPoint)
                            buckets, running = [], 0
                            for bound, count in zip((*p.explicit_bounds, float("inf")), p.bucket_counts, strict=True):
                                running += count
                                buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
                            family.add_metric(_values(p.attributes, labels), buckets, p.sum)
                    elif isinstance(metric.data, Sum) and metric.data.is_monotonic:
                        family = CounterMetricFamily(name, description, labels=labels)
                        for p in points:
                            assert isinstance(p, NumberDataPoint)
                            family.add_metric(_values(p.attributes, labels), p.value)
                    else:
                        family = GaugeMetricFamily(name, description, labels=labels)
                        for p in points:
                            assert isinstance(p, NumberDataPoint)
                            family.add_metric(_values(p.attributes, labels), p.value)
                    yield family


def _values(attributes: Mapping[str, Any] | None, labels: list[str]) -> list[str]:
    attributes = attributes or {}
    return [str(attributes.get(k, "")) for k in labels]
