"""The thin gRPC servicer of the RolloutService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import grpc
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc

from polar_core.auth import require_gateway_identity
from polar_core.durations import duration, seconds
from polar_core.errors import InvalidArgument
from rollout_server.convert import (
    gateway_from_register,
    gateway_info_to_proto,
    new_task_from_proto,
    outcome_to_proto,
    pause_mode_from_proto,
    policy_to_proto,
    proxy_info_to_proto,
    result_from_proto,
    result_to_proto,
    results_page_to_proto,
    split_result,
    stage_metrics_from_proto,
    summary_to_proto,
    task_state_from_proto,
)
from rollout_server.core import RolloutCore
from rollout_server.policy import PolicyCoordinator

__all__ = ["RolloutServicer"]

Context = grpc.aio.ServicerContext[Any, Any]
# Results a byte-budgeted GetTask page holds at most (when it sets no max_results).
_PAGE_BATCH = 100


class RolloutServicer(rollout_service_pb2_grpc.RolloutServiceServicer):
    """Implements polar.rollout.v1.RolloutService over :class:`RolloutCore` and :class:`PolicyCoordinator`."""

    def __init__(self, core: RolloutCore, policy: PolicyCoordinator) -> None:
        self._core = core
        self._policy = policy

    async def SubmitTask(self, request: pb.SubmitTaskRequest, context: Context) -> pb.SubmitTaskResponse:
        if not request.HasField("task"):
            raise InvalidArgument("task is required")
        timeout = request.task_timeout if request.HasField("task_timeout") else None
        summary, existed = await self._core.submit_task(new_task_from_proto(request.task, timeout))
        return pb.SubmitTaskResponse(
            task_id=summary.task.task_id, task=summary_to_proto(summary), already_existed=existed
        )

    async def GetTask(self, request: pb.GetTaskRequest, context: Context) -> pb.GetTaskResponse:
        if (
            min(
                request.from_result_index,
                request.max_results,
                request.max_page_bytes,
                request.from_trace_index,
                request.max_result_bytes,
            )
            < 0
        ):
            raise InvalidArgument(
                "from_result_index, max_results, max_page_bytes, from_trace_index and max_result_bytes"
                " must not be negative"
            )
        # A paged read loads one batch of results from the store (one more says whether a next page exists).
        batch = request.max_results or (_PAGE_BATCH if request.max_page_bytes else 0)
        summary, results = await self._core.get_task(
            request.task_id,
            with_results=not request.summary_only,
            from_index=request.from_result_index,
            limit=batch + 1 if batch else 0,
        )
        page, next_index, next_trace = results_page_to_proto(
            results,
            omit_traces=request.omit_traces,
            max_results=batch,
            max_bytes=request.max_page_bytes,
            from_trace=request.from_trace_index,
            max_result_bytes=request.max_result_bytes,
        )
        return pb.GetTaskResponse(
            task=summary_to_proto(summary),
            session_results=page,
            next_result_index=next_index,
            next_trace_index=next_trace,
        )

    async def ListTasks(self, request: pb.ListTasksRequest, context: Context) -> pb.ListTasksResponse:
        page = await self._core.list_tasks(
            request.page_size, request.page_token, task_state_from_proto(request.status_filter)
        )
        return pb.ListTasksResponse(
            tasks=[summary_to_proto(s) for s in page.tasks], next_page_token=page.next_page_token
        )

    async def WatchTask(self, request: pb.WatchTaskRequest, context: Context) -> AsyncIterator[pb.WatchTaskResponse]:
        async for result, summary in self._core.watch_task(request.task_id, request.from_result_index):
            info = summary_to_proto(summary)
            if result is None:
                yield pb.WatchTaskResponse(task=info)
                continue
            message = result_to_proto(result, omit_traces=request.omit_traces)
            parts = split_result(message, request.max_result_bytes)
            for number, (part, first_trace) in enumerate(parts):
                yield pb.WatchTaskResponse(
                    session_result=part,
                    result_index=result.result_index,
                    task=info,
                    result_continues=number + 1 < len(parts),
                    first_trace_index=first_trace,
                )

    async def CancelTask(self, request: pb.CancelTaskRequest, context: Context) -> pb.CancelTaskResponse:
        summary = await self._core.cancel_task(request.task_id, request.reason)
        return pb.CancelTaskResponse(task=summary_to_proto(summary))

    async def RegisterGateway(self, request: pb.RegisterGatewayRequest, context: Context) -> pb.RegisterGatewayResponse:
        require_gateway_identity(context, request.gateway_id, "RegisterGateway")
        gateway = await self._core.register_gateway(gateway_from_register(request))
        config = self._core.config
        return pb.RegisterGatewayResponse(
            gateway_id=gateway.gateway_id,
            heartbeat_interval=duration(config.heartbeat_interval_s),
            lease_ttl=duration(config.lease_ttl_s),
        )

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Context) -> pb.HeartbeatResponse:
        require_gateway_identity(context, request.gateway_id, "Heartbeat")
        drain, cancelled = await self._core.heartbeat(
            request.gateway_id,
            capacity=request.capacity,
            active_sessions=request.active_sessions,
            draining=request.draining,
            stage_metrics=stage_metrics_from_proto(request.stage_metrics),
        )
        return pb.HeartbeatResponse(drain_requested=drain, cancelled_session_ids=cancelled)

    async def DrainGateway(self, request: pb.DrainGatewayRequest, context: Context) -> pb.DrainGatewayResponse:
        require_gateway_identity(context, request.gateway_id, "DrainGateway")
        active = await self._core.drain_gateway(request.gateway_id)
        return pb.DrainGatewayResponse(active_sessions=active)

    async def ListGateways(self, request: pb.ListGatewaysRequest, context: Context) -> pb.ListGatewaysResponse:
        gateways, now = await self._core.list_gateways()
        return pb.ListGatewaysResponse(gateways=[gateway_info_to_proto(g, now) for g in gateways])

    async def ReportSessionResult(
        self, request: pb.ReportSessionResultRequest, context: Context
    ) -> pb.ReportSessionResultResponse:
        if not request.HasField("result"):
            raise InvalidArgument("result is required")
        # Under mTLS a gateway reports only as itself; the core then refuses sessions not given to that gateway.
        require_gateway_identity(context, request.result.gateway_id, "ReportSessionResult")
        duplicate = await self._core.report_result(result_from_proto(request.result))
        return pb.ReportSessionResultResponse(duplicate=duplicate)

    async def ReportSessionResultStream(
        self, request_iterator: AsyncIterable[pb.ReportSessionResultStreamRequest], context: Context
    ) -> pb.ReportSessionResultStreamResponse:
        """Join a result streamed in parts and record it as ReportSessionResult does (once, when complete)."""
        request: pb.ReportSessionResultRequest | None = None
        async for message in request_iterator:
            part = message.WhichOneof("part")
            if request is None:
                if part != "result":
                    raise InvalidArgument("the first ReportSessionResultStream message must carry the result")
                request = pb.ReportSessionResultRequest(result=message.result)
            elif part == "traces":
                request.result.traces.extend(message.traces.traces)
            else:
                raise InvalidArgument("after the result, ReportSessionResultStream takes only trace chunks")
        if request is None:
            raise InvalidArgument("ReportSessionResultStream received no result")
        # One recording path: whatever ReportSessionResult checks (and its idempotency) applies here too.
        reply = await self.ReportSessionResult(request, context)
        return pb.ReportSessionResultStreamResponse(duplicate=reply.duplicate)

    async def UpdatePolicy(self, request: pb.UpdatePolicyRequest, context: Context) -> pb.UpdatePolicyResponse:
        drain = seconds(request.drain_timeout) if request.HasField("drain_timeout") else None
        outcome = await self._policy.update_policy(
            request.version,
            request.weights_path,
            pause_mode=pause_mode_from_proto(request.pause_mode),
            drain_timeout_s=drain,
            weights_synced=request.weights_synced,
        )
        return outcome_to_proto(outcome)

    async def GetPolicy(self, request: pb.GetPolicyRequest, context: Context) -> pb.GetPolicyResponse:
        policy, proxies = await self._policy.get_policy()
        return pb.GetPolicyResponse(policy=policy_to_proto(policy), proxies=[proxy_info_to_proto(p) for p in proxies])

    async def RegisterProxy(self, request: pb.RegisterProxyRequest, context: Context) -> pb.RegisterProxyResponse:
        policy = await self._policy.register_proxy(request.proxy_id, request.address, request.backend, request.version)
        return pb.RegisterProxyResponse(policy=policy_to_proto(policy))
