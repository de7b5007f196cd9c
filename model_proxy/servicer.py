"""The gRPC ModelProxyService: a thin layer converting protobuf (:mod:`model_proxy.convert`) to app calls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from opentelemetry import trace
from polar.proxy.v1 import model_proxy_service_pb2 as pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as pb_grpc

from model_proxy import convert
from model_proxy.app import ProxyApp
from polar_core.server import ServiceRegistration

__all__ = ["ModelProxyServicer", "registration"]

Context = grpc.aio.ServicerContext[Any, Any]


class ModelProxyServicer(pb_grpc.ModelProxyServiceServicer):
    """Implements ``polar.proxy.v1.ModelProxyService`` over a :class:`ProxyApp`."""

    def __init__(self, app: ProxyApp) -> None:
        self._app = app

    async def OpenSession(self, request: pb.OpenSessionRequest, context: Context) -> pb.OpenSessionResponse:
        """Open (or reopen) a session and hand out its token and base URLs."""
        session, token = await self._app.registry.open(
            request.session_id,
            request.model,
            policy_version=request.policy_version,
            metadata=convert.session_metadata(request),
        )
        current = trace.get_current_span().get_span_context()
        if current.is_valid:
            # Only the span's identity is kept (not the span), so the harness's calls join the caller's trace.
            session.trace_context = trace.set_span_in_context(trace.NonRecordingSpan(current))
        return convert.open_session_response(token, self._app.base_url)

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Context) -> pb.CloseSessionResponse:
        """Close a session; its completions stay readable."""
        session = await self._app.registry.close(request.session_id)
        return pb.CloseSessionResponse(completions=session.record_count)

    async def ListCompletions(self, request: pb.ListCompletionsRequest, context: Context) -> pb.ListCompletionsResponse:
        """Page through a session's completions in seq order."""
        page = convert.page_from_proto(request)
        registry = self._app.registry
        records = await registry.records(registry.get(request.session_id))
        return convert.completions_page_to_proto(records, page)

    async def WatchCompletions(
        self, request: pb.WatchCompletionsRequest, context: Context
    ) -> AsyncIterator[pb.WatchCompletionsResponse]:
        """Stream completions from ``from_seq``; ends when the session is closed and drained."""
        self._app.registry.get(request.session_id)
        async for record in self._app.registry.watch(request.session_id, request.from_seq):
            yield convert.watch_response(record)

    async def SetPolicyVersion(
        self, request: pb.SetPolicyVersionRequest, context: Context
    ) -> pb.SetPolicyVersionResponse:
        """Set the policy version stamped on new calls (through the weight manager, after any load)."""
        previous = await self._app.weights.set_version(convert.policy_version_from_proto(request.policy_version))
        return pb.SetPolicyVersionResponse(previous_policy_version=previous)

    async def PauseGeneration(self, request: pb.PauseGenerationRequest, context: Context) -> pb.PauseGenerationResponse:
        """Hold new calls and drain (or abort) the ones in flight."""
        drain = convert.drain_timeout_from_proto(request)
        in_flight, aborted = await self._app.engine.gate.pause(
            abort_in_flight=request.abort_in_flight, drain_timeout_s=drain or self._app.drain_timeout_s
        )
        return pb.PauseGenerationResponse(in_flight=in_flight, aborted=aborted)

    async def ResumeGeneration(
        self, request: pb.ResumeGenerationRequest, context: Context
    ) -> pb.ResumeGenerationResponse:
        """Release held calls."""
        return pb.ResumeGenerationResponse(released=self._app.engine.gate.resume())

    async def CheckWeights(self, request: pb.CheckWeightsRequest, context: Context) -> pb.CheckWeightsResponse:
        """Check a checkpoint without loading it."""
        return pb.CheckWeightsResponse(architecture=await self._app.weights.check(request.weights_path))

    async def LoadWeights(self, request: pb.LoadWeightsRequest, context: Context) -> pb.LoadWeightsResponse:
        """Load a checkpoint (generation paused), then set the version."""
        version = convert.policy_version_from_proto(request.policy_version)
        previous, load_s = await self._app.weights.load(version, request.weights_path)
        return pb.LoadWeightsResponse(previous_policy_version=previous, load_seconds=load_s)

    async def GetPolicy(self, request: pb.GetPolicyRequest, context: Context) -> pb.GetPolicyResponse:
        """Report the served version and weights and the gate's state."""
        return convert.served_policy_to_proto(self._app.weights.served())


def registration(app: ProxyApp) -> ServiceRegistration:
    """The servicer as a :class:`ServiceRegistration` for ``polar_core.server.start_grpc_server``."""
    servicer = ModelProxyServicer(app)
    return ServiceRegistration(
        name="polar.proxy.v1.ModelProxyService",
        add=lambda server: pb_grpc.add_ModelProxyServiceServicer_to_server(servicer, server),
    )
