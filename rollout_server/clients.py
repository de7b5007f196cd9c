"""The clients the rollout server calls out with: gateways, trainer callbacks (gRPC or HTTP), model proxies.

They implement :class:`~rollout_server.ports.GatewayClient`, :class:`~rollout_server.ports.CallbackSender` and
:class:`~rollout_server.ports.ProxyClient` (ModelProxyService's policy RPCs; its errors are
:func:`polar_core.rpc_client.rpc`'s).
A failed gateway call becomes one of the :mod:`rollout_server.errors` gateway errors (on top of
:func:`polar_core.rpc_client.error_from_rpc`); a failed delivery becomes
:class:`~rollout_server.errors.DeliveryFailed`.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable
from typing import TypeVar

import grpc
import httpx
from opentelemetry.sdk.trace import TracerProvider
from polar.common.v1 import session_pb2, task_pb2
from polar.common.v1 import status_pb2 as polar_status_pb2
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc
from polar.proxy.v1 import model_proxy_service_pb2, model_proxy_service_pb2_grpc
from polar.rollout.v1 import trainer_callback_service_pb2, trainer_callback_service_pb2_grpc

from polar_core import errors
from polar_core.channels import StubPool
from polar_core.durations import duration, timestamp
from polar_core.limits import DEFAULT_MAX_MESSAGE_BYTES
from polar_core.policy_version import format_version
from polar_core.rpc_client import error_from_rpc, rpc
from polar_core.tls import TlsFiles
from rollout_server.convert import (
    proxy_policy_from_proto,
    result_from_proto,
    result_to_json,
    result_to_proto,
    stage_metrics_from_proto,
)
from rollout_server.errors import (
    DeliveryFailed,
    GatewayBusy,
    GatewayRejected,
    GatewaySessionUnknown,
    GatewayUnreachable,
)
from rollout_server.models import CallbackTarget, ResultRecord
from rollout_server.ports import CapacityView, GatewaySessionView, ProxyPolicyView, SessionDispatch

__all__ = ["IDEMPOTENCY_HEADER", "CallbackSenders", "GrpcGatewayClient", "GrpcProxyClient"]

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
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._timeout = timeout_s
        self._stubs: StubPool[gateway_service_pb2_grpc.GatewayServiceAsyncStub] = StubPool(
            gateway_service_pb2_grpc.GatewayServiceStub,
            auth_token=auth_token,
            tracer_provider=tracer_provider,
            tls=tls,
            max_message_bytes=max_message_bytes,
        )

    def _stub(self, address: str) -> gateway_service_pb2_grpc.GatewayServiceAsyncStub:
        return self._stubs.stub(address)

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
        stages = stage_metrics_from_proto(reply.stage_metrics)
        return CapacityView(reply.gateway_id, capacity, reply.active_sessions, reply.draining, stages)

    async def close(self) -> None:
        """Close every channel."""
        await self._stubs.close()


class CallbackSenders:
    """A :class:`~rollout_server.ports.CallbackSender` for both target kinds.

    HTTP targets receive ``{"idempotency_key", "delivery_attempt", "session_result"}`` as JSON with an
    ``Idempotency-Key`` header; 2xx is success, 408/425/429/5xx and network errors are retried, other 4xx are
    permanent. gRPC targets get ``DeliverSessionResult``; INVALID_ARGUMENT is permanent, the rest is retried.

    With ``tls`` (the fleet's mTLS files) callbacks use TLS too: gRPC targets get mTLS with this server's
    certificate, HTTPS targets are verified against the fleet's CA and shown the same client certificate, and a
    plain ``http://`` target is refused for good (its results are dead-lettered, never sent in the clear).
    """

    def __init__(
        self,
        *,
        auth_token: str = "",
        timeout_s: float = 10.0,
        tracer_provider: TracerProvider | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: TlsFiles | None = None,
    ) -> None:
        self._timeout = timeout_s
        self._tls = tls
        self._http: httpx.AsyncClient | None = None
        self._stubs: StubPool[trainer_callback_service_pb2_grpc.TrainerCallbackServiceAsyncStub] = StubPool(
            trainer_callback_service_pb2_grpc.TrainerCallbackServiceStub,
            auth_token=auth_token,
            tracer_provider=tracer_provider,
            tls=tls,
            max_message_bytes=max_message_bytes,
        )

    async def deliver(self, target: CallbackTarget, result: ResultRecord, attempt: int) -> bool:
        """Deliver one result; return whether the trainer had it already."""
        if target.kind == "http":
            return await self._deliver_http(target.target, result, attempt)
        return await self._deliver_grpc(target.target, result, attempt)

    async def _deliver_http(self, url: str, result: ResultRecord, attempt: int) -> bool:
        if self._tls is not None and not url.startswith("https://"):
            raise DeliveryFailed(f"POST {url}: the fleet uses TLS, so callbacks must be https:// URLs", retryable=False)
        if self._http is None:
            verify: ssl.SSLContext | bool = True
            if self._tls is not None:
                verify = ssl.create_default_context(cafile=str(self._tls.ca_file))
                verify.load_cert_chain(str(self._tls.cert_file), str(self._tls.key_file))
            self._http = httpx.AsyncClient(timeout=self._timeout, verify=verify)
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
        stub = self._stubs.stub(target)
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
        await self._stubs.close()


# Extra time a PauseGeneration call gets on top of the drain it asks for.
_PAUSE_SLACK_S = 10.0


class GrpcProxyClient:
    """Calls ModelProxyService's policy RPCs.

    Args:
        auth_token: The control-plane token.
        timeout_s: Deadline of the short calls (check, resume, get).
        load_timeout_s: Deadline of LoadWeights (a large checkpoint takes minutes).
        tracer_provider: Provider for client spans.
        tls: mTLS files, when mTLS is on.
    """

    def __init__(
        self,
        *,
        auth_token: str = "",
        timeout_s: float = 10.0,
        load_timeout_s: float = 600.0,
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._timeout = timeout_s
        self._load_timeout = load_timeout_s
        self._stubs: StubPool[model_proxy_service_pb2_grpc.ModelProxyServiceAsyncStub] = StubPool(
            model_proxy_service_pb2_grpc.ModelProxyServiceStub,
            auth_token=auth_token,
            tracer_provider=tracer_provider,
            tls=tls,
            max_message_bytes=max_message_bytes,
        )

    def _stub(self, address: str) -> model_proxy_service_pb2_grpc.ModelProxyServiceAsyncStub:
        return self._stubs.stub(address)

    async def check_weights(self, address: str, weights_path: str) -> str:
        """Call CheckWeights; return the checkpoint's architecture."""
        reply = await rpc(
            self._stub(address).CheckWeights(
                model_proxy_service_pb2.CheckWeightsRequest(weights_path=weights_path), timeout=self._timeout
            ),
            address,
        )
        return reply.architecture

    async def pause(self, address: str, *, abort_in_flight: bool, drain_timeout_s: float) -> tuple[int, int]:
        """Call PauseGeneration with the drain limit; return (in flight, aborted)."""
        request = model_proxy_service_pb2.PauseGenerationRequest(
            abort_in_flight=abort_in_flight, drain_timeout=duration(drain_timeout_s)
        )
        call = self._stub(address).PauseGeneration(request, timeout=drain_timeout_s + _PAUSE_SLACK_S)
        reply = await rpc(call, address)
        return reply.in_flight, reply.aborted

    async def load_weights(self, address: str, policy_version: int, weights_path: str) -> float:
        """Call LoadWeights; return the backend's load seconds."""
        request = model_proxy_service_pb2.LoadWeightsRequest(
            policy_version=format_version(policy_version), weights_path=weights_path
        )
        reply = await rpc(self._stub(address).LoadWeights(request, timeout=self._load_timeout), address)
        return reply.load_seconds

    async def set_policy_version(self, address: str, policy_version: int) -> None:
        """Call SetPolicyVersion (weights synced into the proxy's backend outside Polar)."""
        request = model_proxy_service_pb2.SetPolicyVersionRequest(policy_version=format_version(policy_version))
        await rpc(self._stub(address).SetPolicyVersion(request, timeout=self._timeout), address)

    async def resume(self, address: str) -> int:
        """Call ResumeGeneration; return the released calls."""
        reply = await rpc(
            self._stub(address).ResumeGeneration(
                model_proxy_service_pb2.ResumeGenerationRequest(), timeout=self._timeout
            ),
            address,
        )
        return reply.released

    async def get_policy(self, address: str) -> ProxyPolicyView:
        """Call GetPolicy."""
        reply = await rpc(
            self._stub(address).GetPolicy(model_proxy_service_pb2.GetPolicyRequest(), timeout=self._timeout), address
        )
        return proxy_policy_from_proto(reply)

    async def close(self) -> None:
        """Close every channel."""
        await self._stubs.close()
