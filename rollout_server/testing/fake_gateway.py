"""A fake GatewayService over real gRPC: it "runs" each session by sleeping, then reports its result.

Used by the integration tests and ``bench/dispatch`` so the rollout server is exercised through its real RPCs
without harnesses, runtimes or models.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from polar.common.v1 import session_pb2, status_pb2, trace_pb2
from polar.gateway.v1 import gateway_service_pb2 as gw
from polar.gateway.v1 import gateway_service_pb2_grpc
from polar.rollout.v1 import rollout_service_pb2, rollout_service_pb2_grpc

from polar_core.channels import open_channel
from polar_core.errors import NotFound, ResourceExhausted, Unimplemented
from polar_core.server import ServiceRegistration, start_grpc_server

__all__ = ["FakeGateway", "Outcome"]

# (status name, reward) for a session spec; the default resolves every session with reward 1.
Outcome = Callable[[session_pb2.SessionSpec], tuple[str, float]]
Context = grpc.aio.ServicerContext[Any, Any]


def _resolved(spec: session_pb2.SessionSpec) -> tuple[str, float]:
    return "resolved", 1.0


@dataclasses.dataclass
class _Held:
    spec: session_pb2.SessionSpec
    stage: int = status_pb2.SESSION_STAGE_RUNNING
    result: session_pb2.SessionResult | None = None
    runner: asyncio.Task[None] | None = None


class FakeGateway(gateway_service_pb2_grpc.GatewayServiceServicer):
    """A GatewayService that completes each session after ``delay_s`` and reports to the rollout server.

    Attributes:
        rollout_target: Where results are reported (may be changed, e.g. after the rollout server restarts).
        report: When false, results are kept for GetSession but not reported (a lost report).
        busy_retry_s: RetryInfo hint sent with RESOURCE_EXHAUSTED when full.
        started: Every accepted (session_id, attempt).
        refused: Number of StartSession calls answered RESOURCE_EXHAUSTED.
    """

    def __init__(
        self,
        gateway_id: str,
        *,
        capacity: int = 4,
        delay_s: float = 0.05,
        rollout_target: str = "",
        token: str = "",
        outcome: Outcome = _resolved,
        policy_version: str = "v1",
        busy_retry_s: float = 0.2,
        release: asyncio.Event | None = None,
    ) -> None:
        self.gateway_id = gateway_id
        self.release = release
        self.capacity = capacity
        self.delay_s = delay_s
        self.rollout_target = rollout_target
        self.token = token
        self.outcome = outcome
        self.policy_version = policy_version
        self.busy_retry_s = busy_retry_s
        self.report = True
        self.started: list[tuple[str, int]] = []
        self.refused = 0
        self.held: dict[str, _Held] = {}
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self._channel: grpc.aio.Channel | None = None
        self._channel_target = ""

    @property
    def address(self) -> str:
        """``host:port`` of this gateway."""
        return f"127.0.0.1:{self.port}"

    def active(self) -> int:
        """Sessions not yet done."""
        return sum(1 for h in self.held.values() if h.stage != status_pb2.SESSION_STAGE_DONE)

    async def start(self, port: int = 0) -> FakeGateway:
        """Serve on ``port`` (0: a free one)."""
        servicer = self
        registration = ServiceRegistration(
            gw.DESCRIPTOR.services_by_name["GatewayService"].full_name,
            lambda server: gateway_service_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server),
        )
        self.server, self.port = await start_grpc_server(
            [registration], host="127.0.0.1", port=port, auth_token=self.token
        )
        return self

    async def register(self, capacity: int | None = None) -> None:
        """Register with the rollout server at ``rollout_target``."""
        await self._rollout().RegisterGateway(
            rollout_service_pb2.RegisterGatewayRequest(
                gateway_id=self.gateway_id, address=self.address, capacity=capacity or self.capacity, version="fake"
            ),
            timeout=10,
        )

    async def stop(self) -> None:
        """Stop serving and cancel running sessions."""
        for held in self.held.values():
            if held.runner is not None:
                held.runner.cancel()
        await asyncio.gather(*(h.runner for h in self.held.values() if h.runner), return_exceptions=True)
        if self.server is not None:
            await self.server.stop(None)
        if self._channel is not None:
            await self._channel.close(None)

    def _rollout(self) -> rollout_service_pb2_grpc.RolloutServiceAsyncStub:
        if self._channel is None or self._channel_target != self.rollout_target:
            self._channel = open_channel(self.rollout_target, auth_token=self.token)
            self._channel_target = self.rollout_target
        return rollout_service_pb2_grpc.RolloutServiceStub(self._channel)

    def _state(self, held: _Held) -> session_pb2.SessionState:
        now = timestamp_pb2.Timestamp()
        now.GetCurrentTime()
        state = session_pb2.SessionState(
            session_id=held.spec.session_id,
            task_id=held.spec.task_id,
            sample_index=held.spec.sample_index,
            attempt=held.spec.attempt,
            stage=held.stage,  # type: ignore[arg-type]
            gateway_id=self.gateway_id,
            stage_entered_at=now,
        )
        if held.result is not None:
            state.terminal_status = held.result.terminal_status
        return state

    async def _run(self, held: _Held) -> None:
        # With ``release``, sessions finish when the test says so (no race with a loaded machine's clock).
        if self.release is not None:
            await self.release.wait()
        else:
            await asyncio.sleep(self.delay_s)
        status, reward = self.outcome(held.spec)
        spec = held.spec
        trace = trace_pb2.Trace(
            session_id=spec.session_id,
            task_id=spec.task_id,
            prompt_token_ids=[1, 2, 3],
            response_token_ids=[4, 5],
            loss_mask=[1, 1],
            response_logprobs=[-0.1, -0.2],
            reward=reward,
            weight=1.0,
            status=status,
            policy_versions=[self.policy_version],
        )
        result = session_pb2.SessionResult(
            session_id=spec.session_id,
            task_id=spec.task_id,
            status=status,
            reward=reward,
            traces=[trace],
            timings={"total": self.delay_s},
            statistics=session_pb2.SessionStatistics(completions=2),
            idempotency_key=f"{spec.session_id}#{spec.attempt}",
            gateway_id=self.gateway_id,
            attempt=spec.attempt,
            sample_index=spec.sample_index,
        )
        held.result, held.stage = result, status_pb2.SESSION_STAGE_DONE
        if not self.report:
            return
        for _ in range(50):
            try:
                await self._rollout().ReportSessionResult(
                    rollout_service_pb2.ReportSessionResultRequest(result=result), timeout=10
                )
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return  # stale or cancelled: the rollout server has moved on
                await asyncio.sleep(0.1)

    async def StartSession(self, request: gw.StartSessionRequest, context: Context) -> gw.StartSessionResponse:
        spec = request.spec
        held = self.held.get(spec.session_id)
        if held is not None and held.spec.attempt == spec.attempt:
            return gw.StartSessionResponse(state=self._state(held), already_started=True)
        if self.active() >= self.capacity:
            self.refused += 1
            raise ResourceExhausted("gateway is full", retry_after_s=self.busy_retry_s)
        held = _Held(spec)
        self.held[spec.session_id] = held
        self.started.append((spec.session_id, spec.attempt))
        held.runner = asyncio.create_task(self._run(held))
        return gw.StartSessionResponse(state=self._state(held))

    async def GetSession(self, request: gw.GetSessionRequest, context: Context) -> gw.GetSessionResponse:
        held = self.held.get(request.session_id)
        if held is None:
            raise NotFound(f"unknown session {request.session_id}")
        reply = gw.GetSessionResponse(state=self._state(held))
        if held.result is not None:
            reply.result.CopyFrom(held.result)
        return reply

    async def CancelSession(self, request: gw.CancelSessionRequest, context: Context) -> gw.CancelSessionResponse:
        held = self.held.get(request.session_id)
        if held is None:
            raise NotFound(f"unknown session {request.session_id}")
        if held.runner is not None and held.stage != status_pb2.SESSION_STAGE_DONE:
            held.runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await held.runner
            held.stage = status_pb2.SESSION_STAGE_DONE
        return gw.CancelSessionResponse(state=self._state(held))

    async def GetCapacity(self, request: gw.GetCapacityRequest, context: Context) -> gw.GetCapacityResponse:
        active = self.active()
        return gw.GetCapacityResponse(
            gateway_id=self.gateway_id,
            capacity=self.capacity,
            active_sessions=active,
            available=max(0, self.capacity - active),
        )

    async def WatchSessions(
        self, request: gw.WatchSessionsRequest, context: Context
    ) -> AsyncIterator[gw.WatchSessionsResponse]:
        raise Unimplemented("the fake gateway does not stream")
        yield gw.WatchSessionsResponse()  # pragma: no cover - makes this an async generator
