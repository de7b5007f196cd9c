"""The clients the rollout server calls out with: gateways (GatewayService) and trainer callbacks (gRPC or HTTP).

They implement :class:`~rollout_server.ports.GatewayClient` and :class:`~rollout_server.ports.CallbackSender`.
A failed gateway call becomes one of the :mod:`rollout_server.errors` gateway errors (on top of
:func:`polar_core.rpc_client.error_from_rpc`); a failed delivery becomes
:class:`~rollout_server.errors.DeliveryFailed`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import grpc
import httpx
from opentelemetry.sdk.trace import TracerProvider
from polar.common.v1 import session_pb2, task_pb2
from polar.common.v1 import status_pb2 as polar_status_pb2
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc
from polar.rollout.v1 import trainer_callback_service_pb2, trainer_callback_service_pb2_grpc

from polar_core import errors
from polar_core.channels import open_channel
from polar_core.durations import timestamp
from polar_core.rpc_client import error_from_rpc
from polar_core.tls import TlsFiles
from rollout_server.convert import result_from_proto, result_to_json, result_to_proto
from rollout_server.errors import (
    DeliveryFailed,
    GatewayBusy,
    GatewayRejected,
    GatewaySessionUnknown,
    GatewayUnreachable,
)
from rollout_server.models import CallbackTarget, ResultRecord
from rollout_server.ports import CapacityView, GatewaySessionView, SessionDispatch

__all__ = ["IDEMPOTENCY_HEADER", "CallbackSenders", "GrpcGatewayClient"]

_T = TypeVar("_T")

IDEMPOTENCY_HEADER = "Idempotency-Key"
_RETRYABLE_HTTP = frozenset({408, 425, 429})
_PERMANENT_GRPC = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED})
_REJECTED = (errors.InvalidArgument, errors.AlreadyExists, errors.PermissionDenied)


def _gateway_error(exc: grpc.aio.AioRpcError, address: str) -> errors.PolarError:
    """The gateway error for a failed call: busy, rejected (draining or for good), session unknown, unreachable."""
    error = error_from_rpc(exc, address)
    if isinstance(error, errors.ResourceExhausted):
        return GatewayBusy(error.message, retry_after_s=error.retry_after_s)
    if isinstance(error, errors.FailedPrecondition):
        return GatewayRejected(error.message, draining=True)
    if isinstance(error, _REJECTED):
        return GatewayRejected(error.message)
    if isinstance(error, errors.NotFound):
        return GatewaySessionUnknown(error.message)
    return GatewayUnreachable(error.message)


async def _gateway_rpc(call: Awaitable[_T], address: str) -> _T:
    """Await one call to the gateway at ``address``, raising :func:`_gateway_error`'s error if it fails."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise _gateway_error(exc, address) from None


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
        spec = session_pb2.SessionSpec(
            session_id=dispatch.session_id,
            task_id=dispatch.task_id,
            sample_index=dispatch.sample_index,
            task=task_pb2.Task.FromString(dispatch.task_spec),
            deadline=timestamp(dispatch.deadline),
            attempt=dispatch.attempt,
        )
        request = gateway_service_pb2.StartSessionRequest(spec=spec)
        await _gateway_rpc(self._stub(address).StartSession(request, timeout=self._timeout), address)

    async def get_session(self, address: str, session_id: str) -> GatewaySessionView:
        """Call GetSession."""
        request = gateway_service_pb2.GetSessionRequest(session_id=session_id)
        reply = await _gateway_rpc(self._stub(address).GetSession(request, timeout=self._timeout), address)
        done = reply.state.stage == polar_status_pb2.SESSION_STAGE_DONE
        result = None
        if done and reply.HasField("result"):
            try:
                result = result_from_proto(reply.result)
            except errors.InvalidArgument:
                result = None
        return GatewaySessionView(attempt=reply.state.attempt, done=done, result=result)

    async def cancel_session(self, address: str, session_id: str, reason: str) -> None:
        """Call CancelSession."""
        request = gateway_service_pb2.CancelSessionRequest(session_id=session_id, reason=reason)
        await _gateway_rpc(self._stub(address).CancelSession(request, timeout=self._timeout), address)

    async def get_capacity(self, address: str) -> CapacityView:
        """Call GetCapacity."""
        try:
            reply = await self._stub(address).GetCapacity(
                gateway_service_pb2.GetCapacityRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise GatewayUnreachable(error_from_rpc(exc, address).message) from None
        # What it would hold now (as its heartbeat reports): no free slots while it is full or a dependency is down.
        capacity = min(reply.capacity, reply.active_sessions + reply.available)
        return CapacityView(reply.gateway_id, capacity, reply.active_sessions, reply.draining)

    async def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()
        self._stubs.clear()


class CallbackSenders:
    """A :class:`~rollout_server.ports.CallbackSender` for both target kinds.

    HTTP targets receive ``{"idempotency_key", "delivery_attempt", "session_result"}`` as JSON with an
    ``Idempotency-Key`` header; 2xx is success, 408/425/429/5xx and network errors are retried, other 4xx are
    permanent. gRPC targets get ``DeliverSessionResult``; INVALID_ARGUMENT is permanent, the rest is retried.
    """

    def __init__(
        self, *, auth_token: str = "", timeout_s: float = 10.0, tracer_provider: TracerProvider | None = None
    ) -> None:
        self._token = auth_token
        self._timeout = timeout_s
        self._tracer_provider = tracer_provider
        self._http: httpx.AsyncClient | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def deliver(self, target: CallbackTarget, result: ResultRecord, attempt: int) -> bool:
        """Deliver one result; return whether the trainer had it already."""
        if target.kind == "http":
            return await self._deliver_http(target.target, result, attempt)
        return await self._deliver_grpc(target.target, result, attempt)

    async def _deliver_http(self, url: str, result: ResultRecord, attempt: int) -> bool:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self._timeout)
        body = {
            "idempotency_key": result.idempotency_key,
            "delivery_attempt": attempt,
            "session_result": result_to_json(result),
        }
        try:
            reply = await self._http.post(url, json=body, headers={IDEMPOTENCY_HEADER: result.idempotency_key})
        except httpx.HTTPError as exc:
            raise DeliveryFailed(f"POST {url}: {type(exc).__name__}", retryable=True) from None
        if reply.is_success:
            try:
                return bool(reply.json().get("duplicate", False))
            except ValueError:
                return False
        retryable = reply.status_code in _RETRYABLE_HTTP or reply.status_code >= 500
        raise DeliveryFailed(f"POST {url}: HTTP {reply.status_code}", retryable=retryable)

    async def _deliver_grpc(self, target: str, result: ResultRecord, attempt: int) -> bool:
        channel = self._channels.get(target)
        if channel is None:
            channel = open_channel(target, tracer_provider=self._tracer_provider, auth_token=self._token)
            self._channels[target] = channel
        stub = trainer_callback_service_pb2_grpc.TrainerCallbackServiceStub(channel)
        request = trainer_callback_service_pb2.DeliverSessionResultRequest(
            idempotency_key=result.idempotency_key, session_result=result_to_proto(result), delivery_attempt=attempt
        )
        try:
            reply = await stub.DeliverSessionResult(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise DeliveryFailed(
                f"{target}: {exc.code().name} {exc.details() or ''}".strip(),
                retryable=exc.code() not in _PERMANENT_GRPC,
            ) from None
        return bool(reply.duplicate)

    async def close(self) -> None:
        """Close the HTTP client and channels."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()
