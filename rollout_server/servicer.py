"""The thin gRPC servicer of the RolloutService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc

from polar_core.auth import require_gateway_identity
from polar_core.durations import duration, seconds
from polar_core.errors import InvalidArgument
from rollout_server.convert import (
    gateway_from_register,
    new_task_from_proto,
    outcome_to_proto,
    pause_mode_from_proto,
    policy_to_proto,
    proxy_info_to_proto,
    result_from_proto,
    result_to_proto,
    results_page_to_proto,
    stage_metrics_from_proto,
    summary_to_proto,
    task_state_from_proto,
)
from rollout_server.core import RolloutCore
from rollout_server.policy import PolicyCoordinator

__all__ = ["RolloutServicer"]

Context = grpc.aio.ServicerContext[Any, Any]


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
        if request.from_result_index < 0 or request.max_results < 0 or request.max_page_bytes < 0:
            raise InvalidArgument("from_result_index, max_results and max_page_bytes must not be negative")
        summary, results = await self._core.get_task(
            request.task_id, with_results=not request.summary_only, from_index=request.from_result_index
        )
        page, next_index = results_page_to_proto(
            results,
            omit_traces=request.omit_traces,
            max_results=request.max_results,
            max_bytes=request.max_page_bytes,
        )
        return pb.GetTaskResponse(task=summary_to_proto(summary), session_results=page, next_result_index=next_index)

    async def ListTasks(self, request: pb.ListTasksRequest, context: Context) -> pb.ListTasksResponse:
        page = await self._core.list_tasks(
            request.page_size, request.page_token, task_state_from_proto(request.status_filter)
        )
        return pb.ListTasksResponse(
            tasks=[summary_to_proto(s) for s in page.tasks], next_page_token=page.next_page_token
        )

    async def WatchTask(self, request: pb.WatchTaskRequest, context: Context) -> AsyncIterator[pb.WatchTaskResponse]:
        async for result, summary in self._core.watch_task(request.task_id, request.from_result_index):
            reply = pb.WatchTaskResponse(task=summary_to_proto(summary))
            if result is not None:
                reply.session_result.CopyFrom(result_to_proto(result, omit_traces=request.omit_traces))
                reply.result_index = result.result_index
            yield reply

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

    async def ReportSessionResult(
        self, request: pb.ReportSessionResultRequest, context: Context
    ) -> pb.ReportSessionResultResponse:
        if not request.HasField("result"):
            raise InvalidArgument("result is required")
        # Under mTLS a gateway reports only as itself; the core then refuses sessions not given to that gateway.
        require_gateway_identity(context, request.result.gateway_id, "ReportSessionResult")
        duplicate = await self._core.report_result(result_from_proto(request.result))
        return pb.ReportSessionResultResponse(duplicate=duplicate)

    async def UpdatePolicy(self, request: pb.UpdatePolicyRequest, context: Context) -> pb.UpdatePolicyResponse:
        drain = seconds(request.drain_timeout) if request.HasField("drain_timeout") else None
        outcome = await self._policy.update_policy(
            request.version,
            request.weights_path,
            pause_mode=pause_mode_from_proto(request.pause_mode),
            drain_timeout_s=drain,
        )
        return outcome_to_proto(outcome)

    async def GetPolicy(self, request: pb.GetPolicyRequest, context: Context) -> pb.GetPolicyResponse:
        policy, proxies = await self._policy.get_policy()
        return pb.GetPolicyResponse(policy=policy_to_proto(policy), proxies=[proxy_info_to_proto(p) for p in proxies])

    async def RegisterProxy(self, request: pb.RegisterProxyRequest, context: Context) -> pb.RegisterProxyResponse:
        policy = await self._policy.register_proxy(request.proxy_id, request.address, request.backend)
        return pb.RegisterProxyResponse(policy=policy_to_proto(policy))
