"""Reading a session's completions from a model proxy over gRPC (``ModelProxyService.ListCompletions``)."""

from __future__ import annotations

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.proxy.v1 import model_proxy_service_pb2, model_proxy_service_pb2_grpc

from polar_core.channels import open_channel
from polar_core.convert import completion_from_proto
from polar_core.errors import Internal, InvalidArgument, PolarError
from polar_core.limits import DEFAULT_MAX_MESSAGE_BYTES, chunk_budget
from polar_core.records import CompletionRecord
from polar_core.rpc_client import error_from_rpc
from polar_core.tls import TlsFiles
from reconstructor.ports import CompletionSource

__all__ = ["CompletionSource", "ProxyCompletionSource"]

# The proxy's statuses this service passes on; any other is the proxy's own fault and stays INTERNAL here.
_PASSED_ON = frozenset({grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class ProxyCompletionSource:
    """Pages through ``ListCompletions`` of a real model proxy.

    Args:
        page_size: Completions per page.
        timeout_s: Limit on each page request.
        auth_token: The control-plane token the proxy expects (empty: none).
        tracer_provider: Provider for client spans.
        tls: Client certificate and CA for mutual TLS; ``None`` for plaintext.
        max_message_bytes: The largest message the channel to the proxy receives or sends.
    """

    def __init__(
        self,
        *,
        page_size: int = 500,
        timeout_s: float = 60.0,
        auth_token: str = "",
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._max_message_bytes = max_message_bytes
        self._tls = tls
        self._page_size = page_size
        self._timeout_s = timeout_s
        self._auth_token = auth_token
        self._tracer_provider = tracer_provider

    async def list_completions(self, proxy_target: str, session_id: str) -> list[CompletionRecord]:
        """Return every completion of ``session_id``, in seq order.

        Raises:
            InvalidArgument: The target or session id is empty.
            NotFound: The proxy has no such session.
            Unavailable: The proxy cannot be reached.
            DeadlineExceeded: A page took longer than ``timeout_s``.
        """
        if not proxy_target or not session_id:
            raise InvalidArgument("proxy source needs both proxy_target and session_id")
        records: list[CompletionRecord] = []
        channel = open_channel(
            proxy_target,
            tracer_provider=self._tracer_provider,
            auth_token=self._auth_token,
            tls=self._tls,
            max_message_bytes=self._max_message_bytes,
        )
        async with channel:
            stub = model_proxy_service_pb2_grpc.ModelProxyServiceStub(channel)
            page_token = ""
            while True:
                request = model_proxy_service_pb2.ListCompletionsRequest(
                    session_id=session_id,
                    page_size=self._page_size,
                    page_token=page_token,
                    max_page_bytes=chunk_budget(self._max_message_bytes),
                )
                try:
                    reply = await stub.ListCompletions(request, timeout=self._timeout_s)
                except grpc.aio.AioRpcError as exc:
                    raise _error_from_rpc(exc, proxy_target, session_id) from None
                records.extend(completion_from_proto(c) for c in reply.completions)
                page_token = reply.next_page_token
                if not page_token:
                    return records


def _error_from_rpc(exc: grpc.aio.AioRpcError, target: str, session_id: str) -> PolarError:
    """Map the proxy's status to the error this service reports (its own faults stay ``INTERNAL``)."""
    details = {"proxy_target": target, "session_id": session_id}
    if exc.code() in _PASSED_ON:
        return error_from_rpc(exc, f"model proxy {target}", details=details)
    return Internal(f"model proxy {target} answered {exc.code().name}", details=details)
