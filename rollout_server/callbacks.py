"""Trainer callbacks: gRPC (TrainerCallbackService) and HTTP (POST JSON), behind one sender."""

from __future__ import annotations

import grpc
import httpx
from opentelemetry.sdk.trace import TracerProvider
from polar.rollout.v1 import trainer_callback_service_pb2, trainer_callback_service_pb2_grpc

from polar_core.channels import open_channel
from rollout_server.convert import result_to_json, result_to_proto
from rollout_server.errors import DeliveryFailed
from rollout_server.models import CallbackTarget, ResultRecord

__all__ = ["IDEMPOTENCY_HEADER", "CallbackSenders"]

IDEMPOTENCY_HEADER = "Idempotency-Key"
_RETRYABLE_HTTP = frozenset({408, 425, 429})
_PERMANENT_GRPC = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED})


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
