"""The ``ReconstructorService`` servicer: converts with :mod:`reconstructor.convert`, calls the domain."""

from __future__ import annotations

import grpc
from polar.reconstructor.v1 import reconstructor_service_pb2, reconstructor_service_pb2_grpc

from polar_core.convert import completion_from_proto
from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord
from reconstructor.convert import options_from_proto, outcome_from_proto, response_to_proto
from reconstructor.core import reconstruct_session
from reconstructor.models import ServiceDefaults
from reconstructor.ports import CompletionSource

__all__ = ["ReconstructorServicer"]


class ReconstructorServicer(reconstructor_service_pb2_grpc.ReconstructorServiceServicer):
    """Serves ``Reconstruct``.

    Args:
        defaults: What unspecified request fields become (``app.py`` builds them from the settings).
        completion_source: Reads completions named by a ``ProxySource``.
    """

    def __init__(self, defaults: ServiceDefaults, completion_source: CompletionSource) -> None:
        self._defaults = defaults
        self._source = completion_source

    async def Reconstruct(
        self,
        request: reconstructor_service_pb2.ReconstructRequest,
        context: grpc.aio.ServicerContext[
            reconstructor_service_pb2.ReconstructRequest, reconstructor_service_pb2.ReconstructResponse
        ],
    ) -> reconstructor_service_pb2.ReconstructResponse:
        """Reconstruct one session's traces; see the RPC's comment for status codes."""
        records = await self._records(request)
        options = options_from_proto(request, self._defaults)
        return response_to_proto(reconstruct_session(records, options, outcome_from_proto(request)))

    async def _records(self, request: reconstructor_service_pb2.ReconstructRequest) -> list[CompletionRecord]:
        source = request.WhichOneof("source")
        if source == "completions":
            return [completion_from_proto(c) for c in request.completions.completions]
        if source == "proxy":
            return await self._source.list_completions(request.proxy.proxy_target, request.proxy.session_id)
        raise InvalidArgument("the request names no completions: set completions or proxy")
