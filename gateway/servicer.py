"""The gRPC GatewayService: a thin layer converting protobuf to calls on :class:`SessionPipeline`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from polar.gateway.v1 import gateway_service_pb2 as pb
from polar.gateway.v1 import gateway_service_pb2_grpc as pb_grpc

from gateway.convert import capacity_to_proto, event_to_proto, result_to_proto, spec_from_proto, state_to_proto
from gateway.core import SessionPipeline
from polar_core.errors import InvalidArgument

__all__ = ["GatewayServicer"]

Context = grpc.aio.ServicerContext[Any, Any]


class GatewayServicer(pb_grpc.GatewayServiceServicer):
    """Implements ``polar.gateway.v1.GatewayService`` over a :class:`SessionPipeline`."""

    def __init__(self, pipeline: SessionPipeline) -> None:
        self._pipeline = pipeline

    async def StartSession(self, request: pb.StartSessionRequest, context: Context) -> pb.StartSessionResponse:
        """Accept a session; see the proto for status codes."""
        if not request.HasField("spec"):
            raise InvalidArgument("spec is required")
        state, again = await self._pipeline.start_session(spec_from_proto(request.spec))
        return pb.StartSessionResponse(state=state_to_proto(state), already_started=again)

    async def GetSession(self, request: pb.GetSessionRequest, context: Context) -> pb.GetSessionResponse:
        """Return a session's state and result."""
        if not request.session_id:
            raise InvalidArgument("session_id is required")
        state, result = self._pipeline.get_session(request.session_id)
        reply = pb.GetSessionResponse(state=state_to_proto(state))
        if result is not None:
            reply.result.CopyFrom(result_to_proto(result))
        return reply

    async def CancelSession(self, request: pb.CancelSessionRequest, context: Context) -> pb.CancelSessionResponse:
        """Ask a session to stop."""
        if not request.session_id:
            raise InvalidArgument("session_id is required")
        state = self._pipeline.cancel_session(request.session_id, request.reason)
        return pb.CancelSessionResponse(state=state_to_proto(state))

    async def WatchSessions(
        self, request: pb.WatchSessionsRequest, context: Context
    ) -> AsyncIterator[pb.WatchSessionsResponse]:
        """Stream state changes until the client goes away.

        The response headers are sent as soon as the watcher is subscribed, before any event: a client that
        awaits them (``await call.initial_metadata()``) misses no change made after that.
        """
        if any(not s for s in request.session_ids):
            raise InvalidArgument("session_ids must not contain empty ids")
        sub = self._pipeline.watch(request.task_id, list(request.session_ids), request.include_current)
        try:
            await context.send_initial_metadata(())
            async for event in sub:
                yield event_to_proto(event)
        finally:
            sub.close()

    async def GetCapacity(self, request: pb.GetCapacityRequest, context: Context) -> pb.GetCapacityResponse:
        """Return capacity and per-stage load."""
        return capacity_to_proto(self._pipeline.capacity())
