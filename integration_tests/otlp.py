"""A small in-process OTLP/gRPC trace receiver, standing in for Jaeger's OTLP port in tests."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclasses.dataclass(frozen=True)
class ReceivedSpan:
    """The parts of an exported span the tests look at."""

    name: str
    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Collects spans sent to it by OTLP exporters."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._changed = asyncio.Condition()
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def Export(self, request, context):  # type: ignore[no-untyped-def]
        async with self._changed:
            for resource_spans in request.resource_spans:
                service = ""
                for attr in resource_spans.resource.attributes:
                    if attr.key == "service.name":
                        service = attr.value.string_value
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        attrs = {a.key: _value(a.value) for a in span.attributes}
                        self.spans.append(
                            ReceivedSpan(
                                span.name, service, span.trace_id.hex(), span.span_id.hex(),
                                span.parent_span_id.hex(), span.kind, attrs,
                            )
                        )
            self._changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    async def start(self) -> int:
        self.server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)

    async def wait_for(self, predicate: Any, timeout: float = 10.0) -> list[ReceivedSpan]:
        """Wait until ``predicate(spans)`` is true; return the spans."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: predicate(self.spans)), timeout)
            return list(self.spans)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None
