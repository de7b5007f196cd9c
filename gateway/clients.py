"""gRPC implementations of the pipeline's ports: model proxy, reconstructor, evaluator and result sink clients.

Each client owns one channel (opened with tracing and the control-plane token), builds its messages with
:mod:`gateway.convert` and turns failed calls into :mod:`polar_core.errors` exceptions through
:func:`polar_core.rpc_client.rpc`, so the pipeline can retry ``Unavailable`` and score ``DeadlineExceeded``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.evaluator.v1 import evaluator_service_pb2, evaluator_service_pb2_grpc
from polar.proxy.v1 import model_proxy_service_pb2, model_proxy_service_pb2_grpc
from polar.reconstructor.v1 import reconstructor_service_pb2, reconstructor_service_pb2_grpc
from polar.rollout.v1 import rollout_service_pb2, rollout_service_pb2_grpc

from gateway import convert
from gateway.models import (
    AgentRun,
    Artifacts,
    BuilderConfig,
    Capacity,
    Evaluation,
    ProxyEndpoints,
    Reconstruction,
    SessionResult,
    SessionSpec,
)
from gateway.registration import HeartbeatReply, Lease
from polar_core.channels import open_channel
from polar_core.convert import completion_to_proto, trace_from_proto, trace_to_proto
from polar_core.errors import Internal, Unimplemented
from polar_core.limits import DEFAULT_MAX_MESSAGE_BYTES, chunk_budget, chunked
from polar_core.records import CompletionRecord, ReconstructionStats, TerminalStatus, Trace
from polar_core.rpc_client import error_from_rpc, rpc
from polar_core.tls import TlsFiles

__all__ = [
    "GrpcEvaluatorClient",
    "GrpcProxyClient",
    "GrpcReconstructorClient",
    "GrpcResultSink",
    "GrpcRolloutRegistrar",
]

# Extra seconds a call's gRPC deadline gets over the work's own time limit, so the server answers first.
_RPC_MARGIN_S = 5.0


# A peer that restarts (a rollout server after a crash) should be found again within seconds, not after
# gRPC's default reconnect backoff of up to two minutes.
_RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 5000))


class _Client:
    # The full name of the service the client calls, as its server registers it with the health service.
    service = ""

    def __init__(
        self,
        target: str,
        *,
        auth_token: str = "",
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.target = target
        self._chunk_bytes = chunk_budget(max_message_bytes)
        self._channel = open_channel(
            target,
            tracer_provider=tracer_provider,
            auth_token=auth_token,
            options=_RECONNECT_OPTIONS,
            tls=tls,
            max_message_bytes=max_message_bytes,
        )

    async def healthy(self, *, timeout_s: float) -> bool:
        """Whether the peer's health service reports the service SERVING (a :class:`gateway.ports.HealthProbe`)."""
        request = health_pb2.HealthCheckRequest(service=self.service)
        try:
            reply = await health_pb2_grpc.HealthStub(self._channel).Check(request, timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)


class GrpcProxyClient(_Client):
    """A :class:`gateway.ports.ProxyClient` over ``ModelProxyService``."""

    service = "polar.proxy.v1.ModelProxyService"

    def __init__(
        self,
        target: str,
        *,
        auth_token: str = "",
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
        page_size: int = 500,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        super().__init__(
            target,
            auth_token=auth_token,
            tracer_provider=tracer_provider,
            tls=tls,
            max_message_bytes=max_message_bytes,
        )
        self._page_size = page_size

    @functools.cached_property
    def _stub(self) -> model_proxy_service_pb2_grpc.ModelProxyServiceAsyncStub:
        return model_proxy_service_pb2_grpc.ModelProxyServiceStub(self._channel)

    async def open_session(self, spec: SessionSpec, model: str, *, timeout_s: float) -> ProxyEndpoints:
        """Call OpenSession (idempotent by session id)."""
        request = convert.open_session_request(spec, model)
        reply = await rpc(self._stub.OpenSession(request, timeout=timeout_s), f"proxy {self.target} OpenSession")
        return convert.endpoints_from_proto(reply)

    async def close_session(self, session_id: str, *, timeout_s: float) -> int:
        """Call CloseSession (idempotent)."""
        request = model_proxy_service_pb2.CloseSessionRequest(session_id=session_id)
        reply = await rpc(self._stub.CloseSession(request, timeout=timeout_s), f"proxy {self.target} CloseSession")
        return reply.completions

    async def list_completions(self, session_id: str, *, timeout_s: float) -> list[CompletionRecord]:
        """Page through ListCompletions; ``timeout_s`` bounds each page."""
        records: list[CompletionRecord] = []
        token = ""
        while True:
            request = model_proxy_service_pb2.ListCompletionsRequest(
                session_id=session_id, page_size=self._page_size, page_token=token, max_page_bytes=self._chunk_bytes
            )
            reply = await rpc(
                self._stub.ListCompletions(request, timeout=timeout_s), f"proxy {self.target} ListCompletions"
            )
            records.extend(convert.completion_from_proto(c) for c in reply.completions)
            token = reply.next_page_token
            if not token:
                return records


class GrpcReconstructorClient(_Client):
    """A :class:`gateway.ports.ReconstructorClient` over ``ReconstructorService``.

    Completions go out and traces come back in chunks well under the message limit (``ReconstructStream``),
    so no message grows with the session; a reconstructor without that RPC gets the unary ``Reconstruct``.
    """

    service = "polar.reconstructor.v1.ReconstructorService"

    @functools.cached_property
    def _stub(self) -> reconstructor_service_pb2_grpc.ReconstructorServiceAsyncStub:
        return reconstructor_service_pb2_grpc.ReconstructorServiceStub(self._channel)

    async def reconstruct(
        self,
        completions: Sequence[CompletionRecord],
        *,
        task_id: str,
        reward: float,
        status: TerminalStatus,
        builder: BuilderConfig,
        timeout_s: float,
    ) -> Reconstruction:
        """Call ReconstructStream (Reconstruct when the reconstructor predates it)."""
        what = f"reconstructor {self.target} ReconstructStream"
        header = convert.reconstruct_request([], task_id=task_id, reward=reward, status=status, builder=builder)
        try:
            return await self._reconstruct_stream(header, completions, timeout_s=timeout_s, what=what)
        except Unimplemented:
            request = convert.reconstruct_request(
                completions, task_id=task_id, reward=reward, status=status, builder=builder
            )
            reply = await rpc(
                self._stub.Reconstruct(request, timeout=timeout_s), f"reconstructor {self.target} Reconstruct"
            )
            return convert.reconstruction_from_proto(reply)

    async def _reconstruct_stream(
        self,
        header: reconstructor_service_pb2.ReconstructRequest,
        completions: Sequence[CompletionRecord],
        *,
        timeout_s: float,
        what: str,
    ) -> Reconstruction:
        messages = _reconstruct_messages(header, completions, self._chunk_bytes)
        traces: list[Trace] = []
        stats: ReconstructionStats | None = None
        try:
            async for reply in self._stub.ReconstructStream(messages, timeout=timeout_s):
                traces.extend(trace_from_proto(t) for t in reply.traces)
                if reply.HasField("stats"):
                    stats = convert.stats_from_proto(reply.stats)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, what) from None
        if stats is None:
            raise Internal(f"{what}: the stream ended without statistics")
        return Reconstruction(traces, stats)


class GrpcEvaluatorClient(_Client):
    """A :class:`gateway.ports.EvaluatorClient` over ``EvaluatorService``."""

    service = "polar.evaluator.v1.EvaluatorService"

    @functools.cached_property
    def _stub(self) -> evaluator_service_pb2_grpc.EvaluatorServiceAsyncStub:
        return evaluator_service_pb2_grpc.EvaluatorServiceStub(self._channel)

    async def prepare(self, spec: SessionSpec, *, request_id: str, timeout_s: float) -> str:
        """Call Prepare (idempotent by ``request_id``)."""
        request = convert.prepare_request(spec, request_id)
        reply = await rpc(self._stub.Prepare(request, timeout=timeout_s), f"evaluator {self.target} Prepare")
        return reply.handle

    async def evaluate(self, handle: str, artifacts: Artifacts, run: AgentRun, *, timeout_s: float) -> Evaluation:
        """Call Evaluate; raises ``DeadlineExceeded`` when the evaluation ran past ``timeout_s``."""
        request = convert.evaluate_request(handle, artifacts, run, timeout_s=timeout_s)
        reply = await rpc(
            self._stub.Evaluate(request, timeout=timeout_s + _RPC_MARGIN_S), f"evaluator {self.target} Evaluate"
        )
        return convert.evaluation_from_proto(reply)

    async def release(self, handle: str, *, timeout_s: float) -> None:
        """Call Release (idempotent)."""
        request = evaluator_service_pb2.ReleaseRequest(handle=handle)
        await rpc(self._stub.Release(request, timeout=timeout_s), f"evaluator {self.target} Release")


class _RolloutClient(_Client):
    """A client of the rollout server's ``RolloutService``; ``timeout_s`` bounds each call."""

    default_timeout_s = 10.0

    def __init__(
        self,
        target: str,
        *,
        auth_token: str = "",
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
        timeout_s: float | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        super().__init__(
            target,
            auth_token=auth_token,
            tracer_provider=tracer_provider,
            tls=tls,
            max_message_bytes=max_message_bytes,
        )
        self._timeout_s = self.default_timeout_s if timeout_s is None else timeout_s

    @functools.cached_property
    def _stub(self) -> rollout_service_pb2_grpc.RolloutServiceAsyncStub:
        return rollout_service_pb2_grpc.RolloutServiceStub(self._channel)


class GrpcResultSink(_RolloutClient):
    """A :class:`gateway.ports.ResultSink` over the rollout server's ReportSessionResultStream.

    The result goes first and its traces follow in chunks well under the message limit, so a long session's
    result is never one message; a rollout server without that RPC gets the unary ReportSessionResult.
    """

    default_timeout_s = 30.0

    async def report(self, result: SessionResult) -> None:
        """Call ReportSessionResultStream (idempotent by the result's idempotency key).

        The call waits (up to its timeout) for a rollout server that is restarting instead of failing at once,
        so a result finished during the outage is delivered when the server is back. A retried report is one
        stream again from the start; the server records a result once, when its stream is complete.
        """
        try:
            await rpc(
                self._stub.ReportSessionResultStream(
                    _result_messages(result, self._chunk_bytes), timeout=self._timeout_s, wait_for_ready=True
                ),
                f"rollout server {self.target} ReportSessionResultStream",
            )
            return
        except Unimplemented:
            pass
        request = rollout_service_pb2.ReportSessionResultRequest(result=convert.result_to_proto(result))
        await rpc(
            self._stub.ReportSessionResult(request, timeout=self._timeout_s, wait_for_ready=True),
            f"rollout server {self.target} ReportSessionResult",
        )


class GrpcRolloutRegistrar(_RolloutClient):
    """A :class:`gateway.registration.Registrar` over the rollout server's RegisterGateway and Heartbeat."""

    async def register(
        self, gateway_id: str, address: str, capacity: int, labels: dict[str, str], version: str
    ) -> Lease:
        """Call RegisterGateway (idempotent by gateway id)."""
        request = rollout_service_pb2.RegisterGatewayRequest(
            gateway_id=gateway_id, address=address, capacity=capacity, labels=labels, version=version
        )
        reply = await rpc(
            self._stub.RegisterGateway(request, timeout=self._timeout_s),
            f"rollout server {self.target} RegisterGateway",
        )
        return convert.lease_from_proto(reply)

    async def heartbeat(self, capacity: Capacity) -> HeartbeatReply:
        """Call Heartbeat; raises ``NotFound`` when the rollout server no longer knows this gateway."""
        reply = await rpc(
            self._stub.Heartbeat(convert.heartbeat_request(capacity), timeout=self._timeout_s),
            f"rollout server {self.target} Heartbeat",
        )
        return convert.heartbeat_reply_from_proto(reply)


def _reconstruct_messages(
    header: reconstructor_service_pb2.ReconstructRequest, completions: Sequence[CompletionRecord], max_bytes: int
) -> Iterator[reconstructor_service_pb2.ReconstructStreamRequest]:
    """The ``ReconstructStream`` messages: the request, then the completions in chunks of about ``max_bytes``."""
    yield reconstructor_service_pb2.ReconstructStreamRequest(request=header)
    for chunk in chunked((completion_to_proto(c) for c in completions), max_bytes):
        yield reconstructor_service_pb2.ReconstructStreamRequest(
            completions=reconstructor_service_pb2.CompletionList(completions=chunk)
        )


def _result_messages(
    result: SessionResult, max_bytes: int
) -> Iterator[rollout_service_pb2.ReportSessionResultStreamRequest]:
    """The ``ReportSessionResultStream`` messages: the result without traces, then its traces in chunks."""
    yield rollout_service_pb2.ReportSessionResultStreamRequest(
        result=convert.result_to_proto(dataclasses.replace(result, traces=[]))
    )
    for chunk in chunked((trace_to_proto(t) for t in result.traces), max_bytes):
        yield rollout_service_pb2.ReportSessionResultStreamRequest(traces=rollout_service_pb2.TraceChunk(traces=chunk))
