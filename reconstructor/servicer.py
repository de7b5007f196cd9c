"""The ``ReconstructorService`` servicer: converts with :mod:`reconstructor.convert`, calls the domain."""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable

import grpc
from polar.reconstructor.v1 import reconstructor_service_pb2, reconstructor_service_pb2_grpc

from polar_core.convert import completion_from_proto
from polar_core.errors import InvalidArgument
from polar_core.limits import DEFAULT_MAX_MESSAGE_BYTES, chunk_budget
from polar_core.records import CompletionRecord
from reconstructor.convert import options_from_proto, outcome_from_proto, response_chunks_to_proto, response_to_proto
from reconstructor.core import reconstruct_session
from reconstructor.metrics import ReconstructorMetrics
from reconstructor.models import ReconstructionResult, ServiceDefaults
from reconstructor.ports import CompletionSource

__all__ = ["ReconstructorServicer"]


class ReconstructorServicer(reconstructor_service_pb2_grpc.ReconstructorServiceServicer):
    """Serves ``Reconstruct`` and ``ReconstructStream``.

    Args:
        defaults: What unspecified request fields become (``app.py`` builds them from the settings).
        completion_source: Reads completions named by a ``ProxySource``.
        max_message_bytes: The server's message limit; ``ReconstructStream`` answers in chunks well under it.
        metrics: Where reconstructions are counted (a no-op by default).
    """

    def __init__(
        self,
        defaults: ServiceDefaults,
        completion_source: CompletionSource,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        metrics: ReconstructorMetrics | None = None,
    ) -> None:
        self._metrics = metrics or ReconstructorMetrics()
        self._defaults = defaults
        self._source = completion_source
        self._chunk_bytes = chunk_budget(max_message_bytes)

    async def Reconstruct(
        self,
        request: reconstructor_service_pb2.ReconstructRequest,
        context: grpc.aio.ServicerContext[
            reconstructor_service_pb2.ReconstructRequest, reconstructor_service_pb2.ReconstructResponse
        ],
    ) -> reconstructor_service_pb2.ReconstructResponse:
        """Reconstruct one session's traces; see the RPC's comment for status codes."""
        return response_to_proto(await self._reconstruct(request, lambda: self._records(request)))

    async def ReconstructStream(
        self,
        request_iterator: AsyncIterable[reconstructor_service_pb2.ReconstructStreamRequest],
        context: grpc.aio.ServicerContext[
            reconstructor_service_pb2.ReconstructStreamRequest, reconstructor_service_pb2.ReconstructStreamResponse
        ],
    ) -> AsyncIterator[reconstructor_service_pb2.ReconstructStreamResponse]:
        """Reconstruct one session from streamed completions and stream its traces back in chunks."""
        request: reconstructor_service_pb2.ReconstructRequest | None = None
        records: list[CompletionRecord] = []
        async for message in request_iterator:
            part = message.WhichOneof("part")
            if request is None:
                if part != "request":
                    raise InvalidArgument("the first ReconstructStream message must carry the request")
                request = message.request
                if request.WhichOneof("source") == "proxy":
                    records = await self._records(request)
                else:
                    records = [completion_from_proto(c) for c in request.completions.completions]
                    request.ClearField("completions")
            elif part == "completions" and request.WhichOneof("source") != "proxy":
                records.extend(completion_from_proto(c) for c in message.completions.completions)
            else:
                raise InvalidArgument("after the request, ReconstructStream takes only inline completion chunks")
        if request is None:
            raise InvalidArgument("ReconstructStream received no request")
        result = await self._reconstruct(request, _ready(records))
        for reply in response_chunks_to_proto(result, self._chunk_bytes):
            yield reply

    async def _reconstruct(
        self,
        request: reconstructor_service_pb2.ReconstructRequest,
        read: Callable[[], Awaitable[list[CompletionRecord]]],
    ) -> ReconstructionResult:
        """Read the completions, reconstruct them and count the outcome (timed from the read on)."""
        started = time.perf_counter()
        strategy = "unspecified"
        try:
            records = await read()
            options = options_from_proto(request, self._defaults)
            strategy = options.strategy.value
            result = reconstruct_session(records, options, outcome_from_proto(request))
        except Exception as exc:
            self._metrics.failed(strategy, exc, time.perf_counter() - started)
            raise
        self._metrics.reconstructed(strategy, result.stats, time.perf_counter() - started)
        return result

    async def _records(self, request: reconstructor_service_pb2.ReconstructRequest) -> list[CompletionRecord]:
        source = request.WhichOneof("source")
        if source == "completions":
            return [completion_from_proto(c) for c in request.completions.completions]
        if source == "proxy":
            return await self._source.list_completions(request.proxy.proxy_target, request.proxy.session_id)
        raise InvalidArgument("the request names no completions: set completions or proxy")


def _ready(records: list[CompletionRecord]) -> Callable[[], Awaitable[list[CompletionRecord]]]:
    """``records`` (already read from the stream) as the reader :meth:`ReconstructorServicer._reconstruct` takes."""

    async def read() -> list[CompletionRecord]:
        return records

    return read
