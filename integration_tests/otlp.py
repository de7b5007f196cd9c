"""A small OTLP/gRPC trace receiver, standing in for Jaeger's OTLP port in tests.

It runs a synchronous gRPC server on its own threads: OpenTelemetry's exporters block the thread that ends a
span (SimpleSpanProcessor) or flushes, so a receiver on the test's event loop would deadlock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from concurrent import futures
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
        self._spans: list[ReceivedSpan] = []
        self._changed = threading.Condition()
        self._server: grpc.Server | None = None
        self.port = 0

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._changed:
            return list(self._spans)

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        received = []
        for resource_spans in request.resource_spans:
            service = ""
            for attr in resource_spans.resource.attributes:
                if attr.key == "service.name":
                    service = attr.value.string_value
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            service=service,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._changed:
            self._spans.extend(received)
            self._changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def start(self) -> int:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(None)

    def _wait(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float) -> list[ReceivedSpan]:
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self._spans), timeout):
                raise TimeoutError(f"spans did not arrive in {timeout} s; have {[s.name for s in self._spans]}")
            return list(self._spans)

    async def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], within_s: float = 10.0
    ) -> list[ReceivedSpan]:
        """Wait until ``predicate(spans)`` is true; return the spans."""
        return await asyncio.to_thread(self._wait, predicate, within_s)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None
