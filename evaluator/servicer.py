"""gRPC servicer of ``polar.evaluator.v1.EvaluatorService``: converts with :mod:`evaluator.convert`, delegates.

Errors are raised as :mod:`polar_core.errors` classes; the server's interceptor maps them to status codes.
An evaluation that runs past its timeout is answered with ``TERMINAL_STATUS_EVAL_TIMEOUT`` in a normal
response (rather than ``DEADLINE_EXCEEDED``), so the stored, idempotent result reaches the caller.
"""

from __future__ import annotations

from typing import Any

import grpc
from polar.evaluator.v1 import evaluator_service_pb2 as pb
from polar.evaluator.v1 import evaluator_service_pb2_grpc as pb_grpc

from evaluator.convert import artifacts_from_proto, prepare_params_from_proto, result_to_proto, timeout_from_proto
from evaluator.core import EvaluatorService
from polar_core.errors import InvalidArgument

__all__ = ["EvaluatorServicer"]

Context = grpc.aio.ServicerContext[Any, Any]


class EvaluatorServicer(pb_grpc.EvaluatorServiceServicer):
    """Serves an :class:`EvaluatorService`.

    Args:
        service: The domain service (its owner closes it on shutdown).
    """

    def __init__(self, service: EvaluatorService) -> None:
        self._service = service

    async def Prepare(self, request: pb.PrepareRequest, context: Context) -> pb.PrepareResponse:
        """Prepare an evaluation; see the proto."""
        return pb.PrepareResponse(handle=await self._service.prepare(prepare_params_from_proto(request)))

    async def Evaluate(self, request: pb.EvaluateRequest, context: Context) -> pb.EvaluateResponse:
        """Evaluate artifacts; see the proto."""
        if not request.handle:
            raise InvalidArgument("handle is required")
        result = await self._service.evaluate(
            request.handle, artifacts_from_proto(request.artifacts), timeout_s=timeout_from_proto(request)
        )
        return result_to_proto(result)

    async def Release(self, request: pb.ReleaseRequest, context: Context) -> pb.ReleaseResponse:
        """Release an evaluation; see the proto."""
        return pb.ReleaseResponse(released=await self._service.release(request.handle))
