"""gRPC implementations of the pipeline's seams: model proxy, reconstructor, evaluator and result sink clients.

Each client owns one channel (opened with tracing and the control-plane token) and turns failed calls into
:mod:`polar_core.errors` exceptions, so the pipeline can retry ``Unavailable`` and score ``DeadlineExceeded``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.sdk.trace import TracerProvider
from polar.common.v1 import task_pb2
from polar.evaluator.v1 import evaluator_service_pb2, evaluator_service_pb2_grpc
from polar.proxy.v1 import model_proxy_service_pb2, model_proxy_service_pb2_grpc
from polar.reconstructor.v1 import reconstructor_service_pb2, reconstructor_service_pb2_grpc
from polar.rollout.v1 import rollout_service_pb2, rollout_service_pb2_grpc

from gateway.convert import (
    completion_from_proto,
    completion_to_proto,
    result_to_proto,
    snapshot_to_proto,
    status_from_proto,
    status_to_proto,
    trace_from_proto,
)
from gateway.models import (
    AgentRun,
    Artifacts,
    BuilderConfig,
    Evaluation,
    ProxyEndpoints,
    Reconstruction,
    SessionResult,
    SessionSpec,
)
from gateway.pipeline import Capacity
from gateway.registration import HeartbeatReply, Lease
from polar_core import errors
from polar_core.channels import open_channel
from polar_core.records import (
    AgentStatus,
    CompletionRecord,
    ReconstructionStats,
    ReconstructionStrategy,
    TerminalStatus,
)
from polar_core.tls import TlsFiles

__all__ = [
    "GrpcEvaluatorClient",
    "GrpcProxyClient",
    "GrpcReconstructorClient",
    "GrpcResultSink",
    "GrpcRolloutRegistrar",
    "error_from_rpc",
]

_ERRORS: dict[grpc.StatusCode, type[errors.PolarError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.CANCELLED: errors.Cancelled,
    grpc.StatusCode.UNIMPLEMENTED: errors.Unimplemented,
}
_STRATEGIES = {
    ReconstructionStrategy.PER_REQUEST: 1,
    ReconstructionStrategy.PREFIX_MERGE: 2,
    ReconstructionStrategy.EXACT: 3,
}
_AGENT_STATUS = {
    AgentStatus.COMPLETED: evaluator_service_pb2.AGENT_STATUS_COMPLETED,
    AgentStatus.TIMEOUT: evaluator_service_pb2.AGENT_STATUS_TIMEOUT,
    AgentStatus.ERROR: evaluator_service_pb2.AGENT_STATUS_ERROR,
    AgentStatus.CANCELLED: evaluator_service_pb2.AGENT_STATUS_CANCELLED,
}
# Extra seconds a call's gRPC deadline gets over the work's own time limit, so the server answers first.
_RPC_MARGIN_S = 5.0


def _retry_after(exc: grpc.aio.AioRpcError) -> float | None:
    metadata: Any = exc.trailing_metadata() or ()
    for key, value in metadata:
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        for detail in status_pb2.Status.FromString(value).details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                return float(info.retry_delay.ToNanoseconds()) / 1e9
    return None


def error_from_rpc(exc: grpc.aio.AioRpcError, what: str) -> errors.PolarError:
    """Return the :mod:`polar_core.errors` exception for a failed call to ``what``."""
    code = exc.code()
    message = f"{what}: {exc.details() or code.name}"
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        cls = errors.Unavailable if code == grpc.StatusCode.UNAVAILABLE else errors.ResourceExhausted
        return cls(message, retry_after_s=_retry_after(exc))
    return _ERRORS.get(code, errors.Internal)(message)


def _duration(seconds: float) -> duration_pb2.Duration:
    out = duration_pb2.Duration()
    out.FromNanoseconds(int(seconds * 1e9))
    return out


# A peer that restarts (a rollout server after a crash) should be found again within seconds, not after
# gRPC's default reconnect backoff of up to two minutes.
_RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 5000))


class _Client:
    def __init__(
        self,
        target: str,
        *,
        auth_token: str = "",
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.target = target
        self._channel = open_channel(
            target, tracer_provider=tracer_provider, auth_token=auth_token, options=_RECONNECT_OPTIONS, tls=tls
        )

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)


class GrpcProxyClient(_Client):
    """A :class:`gateway.ports.ProxyClient` over ``ModelProxyService``."""

    def __init__(
        self,
        target: str,
        *,
        auth_token: str = "",
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
        page_size: int = 500,
    ) -> None:
        super().__init__(target, auth_token=auth_token, tracer_provider=tracer_provider, tls=tls)
        self._stub = model_proxy_service_pb2_grpc.ModelProxyServiceStub(self._channel)
        self._page_size = page_size

    async def open_session(self, spec: SessionSpec, model: str, *, timeout_s: float) -> ProxyEndpoints:
        """Call OpenSession (idempotent by session id)."""
        request = model_proxy_service_pb2.OpenSessionRequest(session_id=spec.proxy_session_id, model=model)
        request.metadata.update({"task_id": spec.task_id, "sample_index": spec.sample_index, "attempt": spec.attempt})
        try:
            reply = await self._stub.OpenSession(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"proxy {self.target} OpenSession") from None
        return ProxyEndpoints(
            token=reply.session_token,
            anthropic_base_url=reply.anthropic_base_url,
            openai_base_url=reply.openai_base_url,
            google_base_url=reply.google_base_url,
        )

    async def close_session(self, session_id: str, *, timeout_s: float) -> int:
        """Call CloseSession (idempotent)."""
        try:
            reply = await self._stub.CloseSession(
                model_proxy_service_pb2.CloseSessionRequest(session_id=session_id), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"proxy {self.target} CloseSession") from None
        return reply.completions

    async def list_completions(self, session_id: str, *, timeout_s: float) -> list[CompletionRecord]:
        """Page through ListCompletions; ``timeout_s`` bounds each page."""
        records: list[CompletionRecord] = []
        token = ""
        while True:
            request = model_proxy_service_pb2.ListCompletionsRequest(
                session_id=session_id, page_size=self._page_size, page_token=token
            )
            try:
                reply = await self._stub.ListCompletions(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise error_from_rpc(exc, f"proxy {self.target} ListCompletions") from None
            records.extend(completion_from_proto(c) for c in reply.completions)
            token = reply.next_page_token
            if not token:
                return records


class GrpcReconstructorClient(_Client):
    """A :class:`gateway.ports.ReconstructorClient` over ``ReconstructorService`` (completions sent inline)."""

    def __init__(
        self,
        target: str,
        *,
        auth_token: str = "",
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        super().__init__(target, auth_token=auth_token, tracer_provider=tracer_provider, tls=tls)
        self._stub = reconstructor_service_pb2_grpc.ReconstructorServiceStub(self._channel)

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
        """Call Reconstruct."""
        request = reconstructor_service_pb2.ReconstructRequest(
            completions=reconstructor_service_pb2.CompletionList(
                completions=[completion_to_proto(c) for c in completions]
            ),
            end_of_turn_token_ids=builder.end_of_turn_ids,
            task_id=task_id,
            reward=reward,
            terminal_status=status_to_proto(status),
        )
        if builder.strategy is not None:
            request.strategy = _STRATEGIES[builder.strategy]  # type: ignore[assignment]
        try:
            reply = await self._stub.Reconstruct(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"reconstructor {self.target} Reconstruct") from None
        s = reply.stats
        stats = ReconstructionStats(
            calls=s.calls,
            chains=s.chains,
            merges=s.merges,
            splits_by_reason=dict(s.splits_by_reason),
            mismatched_context_calls=s.mismatched_context_calls,
            mismatched_context_tokens=s.mismatched_context_tokens,
            trainable_tokens=s.trainable_tokens,
            total_tokens=s.total_tokens,
        )
        return Reconstruction([trace_from_proto(t) for t in reply.traces], stats)


class GrpcEvaluatorClient(_Client):
    """A :class:`gateway.ports.EvaluatorClient` over ``EvaluatorService``."""

    def __init__(
        self,
        target: str,
        *,
        auth_token: str = "",
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        super().__init__(target, auth_token=auth_token, tracer_provider=tracer_provider, tls=tls)
        self._stub = evaluator_service_pb2_grpc.EvaluatorServiceStub(self._channel)

    async def prepare(self, spec: SessionSpec, *, request_id: str, timeout_s: float) -> str:
        """Call Prepare (idempotent by ``request_id``)."""
        evaluator = task_pb2.EvaluatorSpec(strategy=spec.evaluator.strategy)
        if spec.evaluator.options:
            evaluator.options.update(dict(spec.evaluator.options))
        request = evaluator_service_pb2.PrepareRequest(
            evaluator=evaluator,
            task_id=spec.task_id,
            session_id=spec.session_id,
            image=spec.runtime.image if spec.runtime.kind in ("docker", "apptainer") else "",
            request_id=request_id,
        )
        if spec.metadata:
            request.metadata.update(dict(spec.metadata))
        try:
            reply = await self._stub.Prepare(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"evaluator {self.target} Prepare") from None
        return reply.handle

    async def evaluate(self, handle: str, artifacts: Artifacts, run: AgentRun, *, timeout_s: float) -> Evaluation:
        """Call Evaluate; raises ``DeadlineExceeded`` when the evaluation ran past ``timeout_s``."""
        message = evaluator_service_pb2.EvaluationArtifacts(
            files=[evaluator_service_pb2.ArtifactFile(path=p, content=c) for p, c in artifacts.files.items()],
            agent_status=_AGENT_STATUS[run.outcome],
        )
        if artifacts.patch is not None:
            message.patch_bytes = artifacts.patch
        request = evaluator_service_pb2.EvaluateRequest(handle=handle, artifacts=message, timeout=_duration(timeout_s))
        try:
            reply = await self._stub.Evaluate(request, timeout=timeout_s + _RPC_MARGIN_S)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"evaluator {self.target} Evaluate") from None
        try:
            status = status_from_proto(reply.terminal_status)
        except errors.InvalidArgument:
            status = TerminalStatus.INFRA_ERROR
        return Evaluation(reply.reward, status, tuple(reply.trace_rewards), reply.error_message)

    async def release(self, handle: str, *, timeout_s: float) -> None:
        """Call Release (idempotent)."""
        try:
            await self._stub.Release(evaluator_service_pb2.ReleaseRequest(handle=handle), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"evaluator {self.target} Release") from None


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
    ) -> None:
        super().__init__(target, auth_token=auth_token, tracer_provider=tracer_provider, tls=tls)
        self._stub = rollout_service_pb2_grpc.RolloutServiceStub(self._channel)
        self._timeout_s = self.default_timeout_s if timeout_s is None else timeout_s


class GrpcResultSink(_RolloutClient):
    """A :class:`gateway.ports.ResultSink` that calls the rollout server's ReportSessionResult."""

    default_timeout_s = 30.0

    async def report(self, result: SessionResult) -> None:
        """Call ReportSessionResult (idempotent by the result's idempotency key).

        The call waits (up to its timeout) for a rollout server that is restarting instead of failing at once,
        so a result finished during the outage is delivered when the server is back.
        """
        request = rollout_service_pb2.ReportSessionResultRequest(result=result_to_proto(result))
        try:
            await self._stub.ReportSessionResult(request, timeout=self._timeout_s, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"rollout server {self.target} ReportSessionResult") from None


class GrpcRolloutRegistrar(_RolloutClient):
    """A :class:`gateway.registration.Registrar` over the rollout server's RegisterGateway and Heartbeat."""

    async def register(
        self, gateway_id: str, address: str, capacity: int, labels: dict[str, str], version: str
    ) -> Lease:
        """Call RegisterGateway (idempotent by gateway id)."""
        request = rollout_service_pb2.RegisterGatewayRequest(
            gateway_id=gateway_id, address=address, capacity=capacity, labels=labels, version=version
        )
        try:
            reply = await self._stub.RegisterGateway(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"rollout server {self.target} RegisterGateway") from None
        return Lease(
            heartbeat_interval_s=reply.heartbeat_interval.ToNanoseconds() / 1e9,
            lease_ttl_s=reply.lease_ttl.ToNanoseconds() / 1e9,
        )

    async def heartbeat(self, capacity: Capacity) -> HeartbeatReply:
        """Call Heartbeat; raises ``NotFound`` when the rollout server no longer knows this gateway."""
        request = rollout_service_pb2.HeartbeatRequest(
            gateway_id=capacity.gateway_id,
            capacity=capacity.active + capacity.available,
            active_sessions=capacity.active,
            stage_metrics=[snapshot_to_proto(s) for s in capacity.stages],
            draining=capacity.draining,
        )
        try:
            reply = await self._stub.Heartbeat(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"rollout server {self.target} Heartbeat") from None
        return HeartbeatReply(reply.drain_requested, tuple(reply.cancelled_session_ids))
