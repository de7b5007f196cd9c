"""The gRPC implementation of :class:`~rollout_server.ports.GatewayClient`."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.sdk.trace import TracerProvider
from polar.common.v1 import session_pb2, task_pb2
from polar.common.v1 import status_pb2 as polar_status_pb2
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc

from polar_core.channels import open_channel
from polar_core.errors import InvalidArgument
from polar_core.tls import TlsFiles
from rollout_server.convert import result_from_proto
from rollout_server.errors import GatewayBusy, GatewayRejected, GatewaySessionUnknown, GatewayUnreachable
from rollout_server.ports import CapacityView, GatewaySessionView, SessionDispatch

__all__ = ["GrpcGatewayClient", "retry_after_s"]


def retry_after_s(error: grpc.aio.AioRpcError) -> float | None:
    """The ``RetryInfo`` delay of a failed call, if the server sent one."""
    metadata: Any = error.trailing_metadata() or ()
    for key, value in metadata:
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


def _translate(error: grpc.aio.AioRpcError, address: str) -> Exception:
    code = error.code()
    message = f"{address}: {error.details() or code.name}"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return GatewayBusy(message, retry_after_s=retry_after_s(error))
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return GatewayRejected(message, draining=True)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.PERMISSION_DENIED):
        return GatewayRejected(message)
    if code == grpc.StatusCode.NOT_FOUND:
        return GatewaySessionUnknown(message)
    return GatewayUnreachable(message)


class GrpcGatewayClient:
    """Calls GatewayService over one cached channel per address."""

    def __init__(
        self,
        *,
        auth_token: str = "",
        timeout_s: float = 10.0,
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self._tls = tls
        self._token = auth_token
        self._timeout = timeout_s
        self._tracer_provider = tracer_provider
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, gateway_service_pb2_grpc.GatewayServiceAsyncStub] = {}

    def _stub(self, address: str) -> gateway_service_pb2_grpc.GatewayServiceAsyncStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = open_channel(
                address, tracer_provider=self._tracer_provider, auth_token=self._token, tls=self._tls
            )
            self._channels[address] = channel
            stub = self._stubs[address] = gateway_service_pb2_grpc.GatewayServiceStub(channel)
        return stub

    async def start_session(self, address: str, dispatch: SessionDispatch) -> None:
        """Call StartSession."""
        deadline = timestamp_pb2.Timestamp()
        deadline.FromNanoseconds(int(dispatch.deadline * 1e9))
        spec = session_pb2.SessionSpec(
            session_id=dispatch.session_id,
            task_id=dispatch.task_id,
            sample_index=dispatch.sample_index,
            task=task_pb2.Task.FromString(dispatch.task_spec),
            deadline=deadline,
            attempt=dispatch.attempt,
        )
        try:
            await self._stub(address).StartSession(
                gateway_service_pb2.StartSessionRequest(spec=spec), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, address) from None

    async def get_session(self, address: str, session_id: str) -> GatewaySessionView:
        """Call GetSession."""
        try:
            reply = await self._stub(address).GetSession(
                gateway_service_pb2.GetSessionRequest(session_id=session_id), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, address) from None
        done = reply.state.stage == polar_status_pb2.SESSION_STAGE_DONE
        result = None
        if done and reply.HasField("result"):
            try:
                result = result_from_proto(reply.result)
            except InvalidArgument:
                result = None
        return GatewaySessionView(attempt=reply.state.attempt, done=done, result=result)

    async def cancel_session(self, address: str, session_id: str, reason: str) -> None:
        """Call CancelSession."""
        try:
            await self._stub(address).CancelSession(
                gateway_service_pb2.CancelSessionRequest(session_id=session_id, reason=reason), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, address) from None

    async def get_capacity(self, address: str) -> CapacityView:
        """Call GetCapacity."""
        try:
            reply = await self._stub(address).GetCapacity(
                gateway_service_pb2.GetCapacityRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise GatewayUnreachable(f"{address}: {exc.details() or exc.code().name}") from None
        return CapacityView(reply.gateway_id, reply.capacity, reply.active_sessions, reply.draining)

    async def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()
        self._stubs.clear()
