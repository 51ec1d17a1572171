"""OTLP exporters from the standard `OTEL_EXPORTER_OTLP_*` variables (the Cloud Run collector sidecar).

The SDK's exporters read only `os.environ`; these read the mapping they are given, so
`from_config(env=...)` and its tests see exactly what a process with that environment would.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor


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
