"""The ``ReconstructorService`` servicer: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.reconstructor.v1 import reconstructor_service_pb2, reconstructor_service_pb2_grpc

from polar_core.convert import completion_from_proto, status_from_proto, trace_to_proto
from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord
from reconstructor.convert import stats_to_proto, strategy_from_proto
from reconstructor.core import ReconstructionOptions, SessionOutcome, reconstruct_session
from reconstructor.eot import end_of_turn_ids_from_tokenizer
from reconstructor.proxy_source import CompletionSource, ProxyCompletionSource
from reconstructor.settings import ReconstructorSettings
from reconstructor.weights import WeightingMode

__all__ = ["ReconstructorServicer"]

_WEIGHTING = {
    reconstructor_service_pb2.WEIGHTING_MODE_SESSION: WeightingMode.SESSION,
    reconstructor_service_pb2.WEIGHTING_MODE_TRACE: WeightingMode.TRACE,
}


class ReconstructorServicer(reconstructor_service_pb2_grpc.ReconstructorServiceServicer):
    """Serves ``Reconstruct``.

    Args:
        settings: The service settings (defaults for unspecified request fields).
        completion_source: Reads completions named by a ``ProxySource``.
    """

    def __init__(self, settings: ReconstructorSettings, completion_source: CompletionSource) -> None:
        self._settings = settings
        self._source = completion_source
        # Read once: the tokenizer directory does not change while the service runs.
        self._default_eot = settings.end_of_turn_ids or (
            end_of_turn_ids_from_tokenizer(settings.tokenizer_dir) if settings.tokenizer_dir else ()
        )

    @classmethod
    def from_settings(
        cls, settings: ReconstructorSettings, *, tracer_provider: TracerProvider | None = None
    ) -> ReconstructorServicer:
        """Build the servicer with a real :class:`ProxyCompletionSource` configured from ``settings``."""
        source = ProxyCompletionSource(
            page_size=settings.proxy_page_size,
            timeout_s=settings.proxy_timeout_s,
            auth_token=settings.auth_token,
            tracer_provider=tracer_provider,
            tls=settings.tls(),
        )
        return cls(settings, source)

    async def Reconstruct(
        self,
        request: reconstructor_service_pb2.ReconstructRequest,
        context: grpc.aio.ServicerContext[
            reconstructor_service_pb2.ReconstructRequest, reconstructor_service_pb2.ReconstructResponse
        ],
    ) -> reconstructor_service_pb2.ReconstructResponse:
        """Reconstruct one session's traces; see the RPC's comment for status codes."""
        records = await self._records(request)
        options = ReconstructionOptions(
            strategy=strategy_from_proto(request.strategy, self._settings.default_strategy),
            end_of_turn_ids=tuple(request.end_of_turn_token_ids) or self._default_eot,
            weighting=_WEIGHTING.get(request.weighting, self._settings.default_weighting),
            split_on_policy_version=self._settings.split_on_policy_version,
            prefer_exact_context=self._settings.prefer_exact_context,
        )
        outcome = SessionOutcome(
            task_id=request.task_id, reward=request.reward, status=status_from_proto(request.terminal_status)
        )
        result = reconstruct_session(records, options, outcome)
        return reconstructor_service_pb2.ReconstructResponse(
            traces=[trace_to_proto(t) for t in result.traces], stats=stats_to_proto(result.stats)
        )

    async def _records(self, request: reconstructor_service_pb2.ReconstructRequest) -> list[CompletionRecord]:
        source = request.WhichOneof("source")
        if source == "completions":
            return [completion_from_proto(c) for c in request.completions.completions]
        if source == "proxy":
            return await self._source.list_completions(request.proxy.proxy_target, request.proxy.session_id)
        raise InvalidArgument("the request names no completions: set completions or proxy")
