"""The process's telemetry, built from the config's `telemetry` section and the standard
`OTEL_*` environment: the providers, the exporters `OTEL_EXPORTER_OTLP_*` names (the Cloud Run
collector sidecar) and the sampler `OTEL_TRACES_SAMPLER` names, handed to
`pubsub_filter.observability.telemetry.Telemetry`.

The SDK reads only `os.environ`, and only warns about a sampler it cannot build; these read the
mapping they are given, so `from_config(env=...)` and its tests see exactly what a process with
that environment would, and a sampler the SDK would replace is an error here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased

from pubsub_filter.core.ports import Failure
from pubsub_filter.observability.latency import Latencies, WithLatencies
from pubsub_filter.observability.telemetry import NO_TELEMETRY, SCOPE, PrometheusText, Telemetry

SERVICE = "pubsub-filter"


def from_config(metrics: bool, traces: bool, env: Mapping[str, str] | None = None) -> Telemetry:
    """The process's telemetry: metrics for /metrics (and OTLP when an endpoint is set),
    spans when an OTLP endpoint is set. `OTEL_SDK_DISABLED=true` turns everything off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return NO_TELEMETRY
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or SERVICE})
    meter_provider = prometheus = latencies = None
    if metrics:
        prometheus, latencies = PrometheusText(), Latencies(SCOPE, resource)
        readers: list[MetricReader] = [prometheus.reader]
        if otlp_endpoint("metrics", env):
            readers.append(PeriodicExportingMetricReader(WithLatencies(otlp_metric_exporter(env), latencies)))
        meter_provider = MeterProvider(metric_readers=readers, resource=resource)
    tracer_provider = None
    if traces and otlp_endpoint("traces", env):
        tracer_provider = TracerProvider(resource=resource, sampler=sampler(env))
        tracer_provider.add_span_processor(otlp_span_processor(env))
    drops = drops_unsampled_parents(env)
    return Telemetry(meter_provider, tracer_provider, prometheus, latencies, drops_unsampled_parents=drops)


def otlp_endpoint(signal: str, env: Mapping[str, str]) -> bool:
    """Whether `signal` ("metrics", "traces") is to be exported: an endpoint is set and the exporter is not "none"."""
    if env.get(f"OTEL_{signal.upper()}_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"))


def _exporter_args(signal: str, env: Mapping[str, str]) -> tuple[bool, str]:
    """Whether `signal` goes over gRPC (else HTTP/protobuf, the default), and its endpoint."""
    up = signal.upper()
    protocol = env.get(f"OTEL_EXPORTER_OTLP_{up}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    grpc = (protocol or "http/protobuf").strip().lower() == "grpc"
    specific = env.get(f"OTEL_EXPORTER_OTLP_{up}_ENDPOINT")
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    return grpc, specific or (base if grpc else f"{base.rstrip('/')}/v1/{signal}")


def otlp_metric_exporter(env: Mapping[str, str]) -> MetricExporter:
    grpc, endpoint = _exporter_args("metrics", env)
    if grpc:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

        return GrpcMetrics(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(endpoint=endpoint)


def otlp_span_processor(env: Mapping[str, str]) -> BatchSpanProcessor:
    grpc, endpoint = _exporter_args("traces", env)
    if grpc:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

        return BatchSpanProcessor(GrpcSpans(endpoint=endpoint))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))


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


def _sampler_name(env: Mapping[str, str]) -> str:
    return (env.get("OTEL_TRACES_SAMPLER") or "").strip().lower() or DEFAULT_SAMPLER


def drops_unsampled_parents(env: Mapping[str, str]) -> bool:
    """Whether the sampler `env` names drops every decision whose remote parent is not sampled
    (Cloud Run's front end sends most requests so): the parent-based samplers, whose rule for
    that parent is `ALWAYS_OFF`, and `always_off`. Such a decision needs no span of its own."""
    name = _sampler_name(env)
    return name.startswith("parentbased_") or name == "always_off"


def sampler(env: Mapping[str, str]) -> Sampler:
    """The SDK's sampler for `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, read from `env`
    (the SDK reads only `os.environ`). A value the SDK would warn about and replace is an error
    here: the operator asked for something."""
    chosen = (env.get("OTEL_TRACES_SAMPLER") or "").strip().lower()
    name = _sampler_name(env)
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
