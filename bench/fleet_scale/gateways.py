"""Simulated gateways: real GatewayService gRPC servers that run no sandbox (one process hosts many of them).

Run: ``python -m bench.fleet_scale.gateways --rollout ADDR --first 0 --count 32 --capacity 32 --events FILE``.

Each gateway listens on a port of its own, registers with the rollout server, heartbeats at the interval the
server names, accepts StartSession up to its capacity (RESOURCE_EXHAUSTED beyond it), "runs" each session for a
long-tailed (lognormal) time and reports its result through ReportSessionResultStream, as the real gateway does
(the result, then its traces in chunks). Results are of real size: one merged trace, or for a fraction of the
sessions a 60-call trace set of several MB. The task's ``metadata`` may set ``median_s``, ``sigma``,
``large_fraction`` and ``small_tokens`` (the driver varies them by phase); the flags are the defaults.

The process prints ``ready`` once every gateway is registered. On SIGTERM it stops and writes one JSON line per
accepted attempt to ``--events``: session, attempt, gateway, the times StartSession was answered and the report
began and was acknowledged (Unix seconds, comparable with the driver's on this host), bytes and whether the
server called it a duplicate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import random
import signal
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from polar.common.v1 import session_pb2, status_pb2, trace_pb2
from polar.gateway.v1 import gateway_service_pb2 as gw
from polar.gateway.v1 import gateway_service_pb2_grpc
from polar.rollout.v1 import rollout_service_pb2 as rpb
from polar.rollout.v1 import rollout_service_pb2_grpc

from bench.fleet_scale.payload import large_traces, small_traces, traces_bytes
from polar_core.channels import open_channel
from polar_core.errors import NotFound, ResourceExhausted, Unimplemented
from polar_core.limits import chunk_budget, chunked
from polar_core.server import ServiceRegistration, start_grpc_server

Context = grpc.aio.ServicerContext[Any, Any]
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    """How simulated sessions behave: lognormal duration and result sizes."""

    median_s: float
    sigma: float
    max_s: float
    large_fraction: float
    small_tokens: int


@dataclasses.dataclass
class _Attempt:
    spec: session_pb2.SessionSpec
    ack: float
    stage: int = status_pb2.SESSION_STAGE_RUNNING
    report_at: float = 0.0
    reported_at: float = 0.0
    size: int = 0
    duplicate: bool = False
    error: str = ""
    result: session_pb2.SessionResult | None = None
    runner: asyncio.Task[None] | None = None


class _Payloads:
    """Trace sets shared by a process's gateways: the large one, and one small one per size asked for."""

    def __init__(self) -> None:
        self.large = large_traces()
        self._small: dict[int, list[trace_pb2.Trace]] = {}

    def small(self, tokens: int) -> list[trace_pb2.Trace]:
        if tokens not in self._small:
            self._small[tokens] = small_traces(tokens)
        return self._small[tokens]


class SimGateway(gateway_service_pb2_grpc.GatewayServiceServicer):
    """One simulated gateway: a GatewayService whose sessions sleep, then report a result of real size."""

    def __init__(
        self,
        gateway_id: str,
        capacity: int,
        shape: Shape,
        rollout: rollout_service_pb2_grpc.RolloutServiceAsyncStub,
        payloads: _Payloads,
        rng: random.Random,
    ) -> None:
        self.gateway_id = gateway_id
        self.capacity = capacity
        self.shape = shape
        self.rollout = rollout
        self.payloads = payloads
        self.rng = rng
        self.held: dict[str, _Attempt] = {}
        self.attempts: list[_Attempt] = []
        self.refused = 0
        self.address = ""
        self.server: grpc.aio.Server | None = None
        self.heartbeat_s = 5.0
        self._chunk = chunk_budget()

    def active(self) -> int:
        return sum(1 for a in self.held.values() if a.stage != status_pb2.SESSION_STAGE_DONE)

    async def start(self) -> None:
        servicer = self
        registration = ServiceRegistration(
            gw.DESCRIPTOR.services_by_name["GatewayService"].full_name,
            lambda server: gateway_service_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server),
        )
        self.server, port = await start_grpc_server([registration], host="127.0.0.1", port=0)
        self.address = f"127.0.0.1:{port}"

    async def register(self) -> None:
        request = rpb.RegisterGatewayRequest(
            gateway_id=self.gateway_id, address=self.address, capacity=self.capacity, version="bench"
        )
        while True:
            try:
                reply = await self.rollout.RegisterGateway(request, timeout=30, wait_for_ready=True)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _RETRYABLE:
                    raise
                continue
            if reply.heartbeat_interval.seconds or reply.heartbeat_interval.nanos:
                self.heartbeat_s = reply.heartbeat_interval.seconds + reply.heartbeat_interval.nanos / 1e9
            return

    async def heartbeats(self) -> None:
        """Heartbeat forever, starting at a random phase so a fleet's beats spread over the interval."""
        await asyncio.sleep(self.rng.random() * self.heartbeat_s)
        while True:
            request = rpb.HeartbeatRequest(
                gateway_id=self.gateway_id, capacity=self.capacity, active_sessions=self.active()
            )
            try:
                await self.rollout.Heartbeat(request, timeout=30)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    await self.register()
            await asyncio.sleep(self.heartbeat_s)

    def _shape(self, spec: session_pb2.SessionSpec) -> Shape:
        fields = spec.task.metadata.fields
        values = {
            k: fields[k].number_value for k in ("median_s", "sigma", "large_fraction", "small_tokens") if k in fields
        }
        if "small_tokens" in values:
            values["small_tokens"] = int(values["small_tokens"])
        return dataclasses.replace(self.shape, **values)  # type: ignore[arg-type]

    def _result(self, spec: session_pb2.SessionSpec, traces: list[trace_pb2.Trace]) -> session_pb2.SessionResult:
        return session_pb2.SessionResult(
            session_id=spec.session_id,
            task_id=spec.task_id,
            status="resolved",
            terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
            reward=1.0,
            traces=traces,
            timings={"total": 1.0},
            statistics=session_pb2.SessionStatistics(completions=len(traces) if len(traces) > 1 else 60),
            idempotency_key=f"{spec.session_id}#{spec.attempt}",
            gateway_id=self.gateway_id,
            attempt=spec.attempt,
            sample_index=spec.sample_index,
        )

    def _messages(self, header: session_pb2.SessionResult, traces: Sequence[trace_pb2.Trace]) -> Iterator[Any]:
        yield rpb.ReportSessionResultStreamRequest(result=header)
        for chunk in chunked(traces, self._chunk):
            yield rpb.ReportSessionResultStreamRequest(traces=rpb.TraceChunk(traces=chunk))

    async def _run(self, attempt: _Attempt, shape: Shape) -> None:
        await asyncio.sleep(min(shape.max_s, shape.median_s * math.exp(self.rng.gauss(0.0, shape.sigma))))
        large = self.rng.random() < shape.large_fraction
        traces = self.payloads.large if large else self.payloads.small(shape.small_tokens)
        header = self._result(attempt.spec, [])
        attempt.result = self._result(attempt.spec, traces)
        attempt.stage = status_pb2.SESSION_STAGE_DONE
        attempt.size = header.ByteSize() + traces_bytes(traces)
        attempt.report_at = time.time()
        for _ in range(100):
            try:
                reply = await self.rollout.ReportSessionResultStream(
                    self._messages(header, traces), timeout=60, wait_for_ready=True
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _RETRYABLE:
                    await asyncio.sleep(0.2)
                    continue
                attempt.error = f"{exc.code().name}: {exc.details()}"  # stale or cancelled: the server moved on
                return
            attempt.reported_at, attempt.duplicate = time.time(), reply.duplicate
            return
        attempt.error = "report retries exhausted"

    def _state(self, attempt: _Attempt) -> session_pb2.SessionState:
        spec = attempt.spec
        return session_pb2.SessionState(
            session_id=spec.session_id,
            task_id=spec.task_id,
            sample_index=spec.sample_index,
            attempt=spec.attempt,
            stage=attempt.stage,  # type: ignore[arg-type]
            gateway_id=self.gateway_id,
        )

    async def StartSession(self, request: gw.StartSessionRequest, context: Context) -> gw.StartSessionResponse:
        spec = request.spec
        held = self.held.get(spec.session_id)
        if held is not None and held.spec.attempt == spec.attempt:
            return gw.StartSessionResponse(state=self._state(held), already_started=True)
        if self.active() >= self.capacity:
            self.refused += 1
            raise ResourceExhausted("gateway is full", retry_after_s=0.2)
        shape = self._shape(spec)
        spec.ClearField("task")  # the task spec is not needed to simulate; keep memory flat
        attempt = _Attempt(spec, time.time())
        self.held[spec.session_id] = attempt
        self.attempts.append(attempt)
        attempt.runner = asyncio.create_task(self._run(attempt, shape))
        return gw.StartSessionResponse(state=self._state(attempt))

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
        raise Unimplemented("the simulated gateway does not stream")
        yield gw.WatchSessionsResponse()  # pragma: no cover - makes this an async generator

    def forget_done(self) -> None:
        """Drop finished attempts from the live table (their events stay in ``attempts``)."""
        for sid in [sid for sid, a in self.held.items() if a.reported_at or a.error]:
            del self.held[sid]

    def events(self) -> Iterator[dict[str, object]]:
        for a in self.attempts:
            yield {
                "session": a.spec.session_id,
                "attempt": a.spec.attempt,
                "gateway": self.gateway_id,
                "ack": a.ack,
                "report_at": a.report_at,
                "reported_at": a.reported_at,
                "bytes": a.size,
                "duplicate": a.duplicate,
                "error": a.error,
            }


async def _serve(args: argparse.Namespace) -> list[dict[str, object]]:
    shape = Shape(args.median_s, args.sigma, args.max_s, args.large_fraction, args.small_tokens)
    payloads = _Payloads()
    channel = open_channel(args.rollout)
    rollout: rollout_service_pb2_grpc.RolloutServiceAsyncStub = rollout_service_pb2_grpc.RolloutServiceStub(channel)  # type: ignore[assignment]
    gateways = [
        SimGateway(f"gw{i:04d}", args.capacity, shape, rollout, payloads, random.Random(args.seed * 100_003 + i))
        for i in range(args.first, args.first + args.count)
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for g in gateways:
        await g.start()
    await asyncio.gather(*(g.register() for g in gateways))
    beats = [asyncio.create_task(g.heartbeats()) for g in gateways]
    print("ready", flush=True)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 5.0)
        for g in gateways:
            g.forget_done()
    for b in beats:
        b.cancel()
    for g in gateways:
        for a in g.held.values():
            if a.runner is not None:
                a.runner.cancel()
    await asyncio.gather(
        *beats, *(a.runner for g in gateways for a in g.held.values() if a.runner), return_exceptions=True
    )
    events = [e for g in gateways for e in g.events()]
    events += [{"gateway": g.gateway_id, "refused": g.refused} for g in gateways]
    await asyncio.gather(*(g.server.stop(None) for g in gateways if g.server is not None))
    await channel.close(None)
    return events


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_scale.gateways", description=__doc__.splitlines()[0])
    parser.add_argument("--rollout", required=True, help="host:port of the rollout server")
    parser.add_argument("--first", type=int, default=0, help="index of this process's first gateway")
    parser.add_argument("--count", type=int, default=1, help="gateways in this process")
    parser.add_argument("--capacity", type=int, default=8, help="sessions per gateway")
    parser.add_argument("--median-s", type=float, default=10.0)
    parser.add_argument("--sigma", type=float, default=0.8)
    parser.add_argument("--max-s", type=float, default=60.0)
    parser.add_argument("--large-fraction", type=float, default=0.05)
    parser.add_argument("--small-tokens", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--events", required=True, help="JSON-lines file written on SIGTERM")
    args = parser.parse_args()
    events = asyncio.run(_serve(args))
    with Path(args.events).open("w") as out:
        out.writelines(json.dumps(e) + "\n" for e in events)


if __name__ == "__main__":
    main()
