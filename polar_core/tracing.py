"""OpenTelemetry set-up: one tracer provider per process, created in ``main()`` and passed down."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from polar_core.settings import TelemetrySettings

__all__ = ["create_tracer_provider"]


def create_tracer_provider(service_name: str, telemetry: TelemetrySettings | None = None) -> TracerProvider | None:
    """Return a provider exporting over OTLP/gRPC when the standard ``OTEL_*`` variables ask for it.

    The exporter reads endpoint, headers and TLS options from the same standard variables, so pointing
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` at Jaeger's OTLP port (4317) is all production needs. Returns ``None``
    (tracing off, no overhead beyond no-op spans) when nothing is configured.
    """
    telemetry = telemetry or TelemetrySettings()
    if not telemetry.export_enabled:
        return None
    # Imported here so a process with tracing off never loads the exporter's gRPC stack.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    name = telemetry.otel_service_name or f"polar-{service_name}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
