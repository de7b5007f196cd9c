"""The GatewayService over real gRPC (fake runtime, harness, proxy, evaluator): RPCs, errors, metrics endpoint."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from google.rpc import status_pb2 as rpc_status_pb2
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2 as pb
from polar.gateway.v1 import gateway_service_pb2_grpc as pb_grpc

from gateway.app import GatewayApp, GatewaySeams
from gateway.server import start_server
from gateway.settings import GatewaySettings
from gateway.testing import (
    FakeAgentRunner,
    FakeEvaluator,
    FakeProxy,
    FakeReconstructor,
    FakeRuntimeFactory,
    RecordingSink,
)
from polar_core.channels import open_channel
from polar_core.server import RunningService


class Gateway:
    def __init__(self, running: RunningService[GatewayApp], seams: GatewaySeams) -> None:
        self.server = running
        self.port = running.port
        self.seams = seams
        self.channel = open_channel(f"127.0.0.1:{running.port}")
        self.stub = pb_grpc.GatewayServiceStub(self.channel)

    @property
    def metrics_port(self) -> int:
        return self.server.app.metrics_port

    @property
    def agents(self) -> FakeAgentRunner:
        assert isinstance(self.seams.agents, FakeAgentRunner)
        return self.seams.agents

    @property
    def evaluator(self) -> FakeEvaluator:
        assert isinstance(self.seams.evaluator, FakeEvaluator)
        return self.seams.evaluator


async def start_gateway(**settings: Any) -> Gateway:
    proxy = FakeProxy()
    seams = GatewaySeams(
        runtimes=FakeRuntimeFactory(),
        agents=FakeAgentRunner(proxy),
        proxy=proxy,
        reconstructor=FakeReconstructor(),
        evaluator=FakeEvaluator(),
        sink=RecordingSink(),
    )
    running = await start_server(GatewaySettings(**settings), seams=seams)
    return Gateway(running, seams)


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    gw = await start_gateway(gateway_id="gw-1", postrun_workers=1, postrun_backlog_limit=1)
    try:
        yield gw
    finally:
        await gw.channel.close(None)
        await gw.server.stop(None)


def session(session_id: str, *, timeout_s: float = 0.0) -> session_pb2.SessionSpec:
    task = task_pb2.Task(
        task_id="t1",
        instruction="do it",
        timeout_seconds=timeout_s,
        harness=task_pb2.HarnessSpec(name="fake"),
        evaluator=task_pb2.EvaluatorSpec(strategy="fake"),
    )
    return session_pb2.SessionSpec(session_id=session_id, task_id="t1", task=task, attempt=1)


async def wait_done(stub: Any, session_id: str) -> Any:
    async with asyncio.timeout(10):
        while True:
            reply = await stub.GetSession(pb.GetSessionRequest(session_id=session_id))
            if reply.state.stage == status_pb2.SESSION_STAGE_DONE:
                return reply
            await asyncio.sleep(0.02)


async def test_watch_headers_arrive_once_subscribed(gateway: Gateway) -> None:
    # Regression: the headers used to come with the first event, so a client could not know when its watcher
    # was subscribed; one that started a session meanwhile missed its first changes (or all of them, and
    # then waited forever for DONE).
    watch = gateway.stub.WatchSessions(pb.WatchSessionsRequest(session_ids=["a"]))
    try:
        async with asyncio.timeout(10):
            await watch.initial_metadata()
        await gateway.stub.StartSession(pb.StartSessionRequest(spec=session("a")))
        async with asyncio.timeout(10):
            first = await watch.read()
        assert isinstance(first, pb.WatchSessionsResponse)
        assert first.state.stage == status_pb2.SESSION_STAGE_INIT
        assert not first.HasField("result")
    finally:
        watch.cancel()


async def test_start_get_watch_and_result(gateway: Gateway) -> None:
    watch = gateway.stub.WatchSessions(pb.WatchSessionsRequest(session_ids=["a"]))
    await watch.initial_metadata()  # subscribed: no change of "a" can be missed from here on
    first = await gateway.stub.StartSession(pb.StartSessionRequest(spec=session("a")))
    assert not first.already_started
    assert first.state.gateway_id == "gw-1"
    again = await gateway.stub.StartSession(pb.StartSessionRequest(spec=session("a")))
    assert again.already_started
    reply = await wait_done(gateway.stub, "a")
    assert reply.state.terminal_status == status_pb2.TERMINAL_STATUS_RESOLVED
    assert reply.result.status == "resolved"
    assert reply.result.idempotency_key == "a/1"
    assert reply.result.statistics.completions == 2
    assert len(reply.result.traces) == 2
    assert set(reply.result.timings) == {"init", "ready", "running", "postrun", "total"}
    stages = []
    async for event in watch:
        stages.append(event.state.stage)
        if event.state.stage == status_pb2.SESSION_STAGE_DONE:
            assert event.result.status == "resolved"
            assert event.previous_stage == status_pb2.SESSION_STAGE_POSTRUN
            break
    watch.cancel()
    assert stages == [
        status_pb2.SESSION_STAGE_INIT,
        status_pb2.SESSION_STAGE_READY,
        status_pb2.SESSION_STAGE_RUNNING,
        status_pb2.SESSION_STAGE_POSTRUN,
        status_pb2.SESSION_STAGE_DONE,
    ]
    sink = gateway.seams.sink
    assert isinstance(sink, RecordingSink)
    assert [r.session_id for r in sink.results] == ["a"]


async def test_errors_map_to_status_codes(gateway: Gateway) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gateway.stub.GetSession(pb.GetSessionRequest(session_id="missing"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gateway.stub.StartSession(pb.StartSessionRequest(spec=session_pb2.SessionSpec(session_id="x")))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    gateway.agents.run_s = 1.0
    await gateway.stub.StartSession(pb.StartSessionRequest(spec=session("b")))
    spec = session("b")
    spec.attempt = 2
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gateway.stub.StartSession(pb.StartSessionRequest(spec=spec))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_cancel_over_grpc(gateway: Gateway) -> None:
    gateway.agents.run_s = 5.0
    await gateway.stub.StartSession(pb.StartSessionRequest(spec=session("c")))
    async with asyncio.timeout(5):
        while True:
            reply = await gateway.stub.GetSession(pb.GetSessionRequest(session_id="c"))
            if reply.state.stage == status_pb2.SESSION_STAGE_RUNNING:
                break
            await asyncio.sleep(0.02)
    await gateway.stub.CancelSession(pb.CancelSessionRequest(session_id="c", reason="test"))
    reply = await wait_done(gateway.stub, "c")
    assert reply.result.terminal_status == status_pb2.TERMINAL_STATUS_CANCELLED
    runtimes = gateway.seams.runtimes
    assert isinstance(runtimes, FakeRuntimeFactory)
    assert runtimes.created["c"].stopped


async def test_postrun_backpressure_is_resource_exhausted_with_retry_info(gateway: Gateway) -> None:
    gateway.evaluator.evaluate_s = 2.0
    for i in range(3):
        await gateway.stub.StartSession(pb.StartSessionRequest(spec=session(f"p{i}")))
    async with asyncio.timeout(5):
        while True:
            cap = await gateway.stub.GetCapacity(pb.GetCapacityRequest())
            postrun = next(m for m in cap.stage_metrics if m.stage == status_pb2.SESSION_STAGE_POSTRUN)
            if postrun.queue_length >= 2:
                break
            await asyncio.sleep(0.02)
    assert cap.available == 0
    assert postrun.occupancy == 1
    assert postrun.workers == 1
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gateway.stub.StartSession(pb.StartSessionRequest(spec=session("refused")))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    metadata: Any = info.value.trailing_metadata() or ()
    details = dict(metadata)["grpc-status-details-bin"]
    status = rpc_status_pb2.Status.FromString(details)
    retry = error_details_pb2.RetryInfo()
    assert any(d.Unpack(retry) for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR))
    assert retry.retry_delay.ToNanoseconds() > 0


def _scrape(port: int) -> dict[tuple[str, str], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        match = re.match(r'^(polar_gateway_\w+)\{.*?stage="(\w+)".*\} ([0-9.e+-]+)$', line)
        if match:
            values[(match.group(1), match.group(2))] = float(match.group(3))
    return values


async def test_littles_law_holds_on_the_prometheus_endpoint() -> None:
    """Sampled occupancy L of each stage agrees with λW from the exported counters and histograms."""
    gw = await start_gateway(init_workers=2, running_workers=4, postrun_workers=2, ready_capacity=2)
    try:
        # Every stage holds a session for several scrape intervals, so the sampled mean occupancy resolves it.
        gw.agents.run_s = 0.2
        gw.agents.prepare_s = 0.1
        gw.evaluator.evaluate_s = 0.15
        samples: list[dict[tuple[str, str], float]] = []
        times = [time.monotonic()]  # the stages are empty at the start: the first sample is all zeros
        samples.append({})
        for i in range(60):
            await gw.stub.StartSession(pb.StartSessionRequest(spec=session(f"l{i}")))
        async with asyncio.timeout(60):
            while True:
                samples.append(await asyncio.to_thread(_scrape, gw.metrics_port))
                times.append(time.monotonic())
                if samples[-1].get(("polar_gateway_stage_exited_total", "postrun"), 0) >= 60:
                    break
                await asyncio.sleep(0.02)
        elapsed = times[-1] - times[0]
        final = samples[-1]
        for stage in ("init", "running", "postrun"):
            occupancy = [s.get(("polar_gateway_stage_occupancy", stage), 0.0) for s in samples]
            # Time-weighted (trapezoid) mean, so uneven scrape intervals on a loaded machine bias nothing.
            points = itertools.pairwise(zip(occupancy, times, strict=True))
            area = sum((a + b) / 2 * (t1 - t0) for (a, t0), (b, t1) in points)
            mean_l = area / elapsed
            exits = final[("polar_gateway_stage_exited_total", stage)]
            residence = final[("polar_gateway_stage_residence_seconds_sum", stage)]
            count = final[("polar_gateway_stage_residence_seconds_count", stage)]
            lam = exits / elapsed
            w = residence / count
            assert exits == 60
            assert mean_l == pytest.approx(lam * w, rel=0.2), (stage, mean_l, lam, w)
        # The RUNNING stage never holds more sessions than its slots.
        assert max(s.get(("polar_gateway_stage_occupancy", "running"), 0) for s in samples) <= 4
    finally:
        await gw.channel.close(None)
        await gw.server.stop(None)
