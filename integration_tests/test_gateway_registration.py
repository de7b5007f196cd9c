"""A real gateway joins a real rollout server (SQLite) by itself and runs the sessions it is given.

The gateway has only ``rollout_address``: it calls RegisterGateway at start, heartbeats with its capacity and
stage metrics, and reports results with ReportSessionResult. A task submitted with ``num_samples=2`` runs both
sessions through the real model proxy (scripted backend), reconstructor and evaluator with the ``command``
harness, and GetTask shows both results. DrainGateway reaches the gateway through the next heartbeat.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from polar.common.v1 import status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2 as gw_pb
from polar.gateway.v1 import gateway_service_pb2_grpc as gw_grpc
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc

from gateway.app import GatewayApp
from gateway.server import start_server
from gateway.settings import GatewaySettings
from model_proxy.app import ProxyApp
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.servicer import registration
from model_proxy.settings import ProxySettings
from polar_core.channels import open_channel
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.server import RunningService, start_grpc_server
from polar_run.serve import service_spec
from rollout_server.app import RolloutApp
from rollout_server.server import start_server as start_rollout_server
from rollout_server.settings import RolloutSettings

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

# One chat call through the proxy (via the tunnel), then exit 0.
AGENT = """
import json, os, urllib.request
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
)
print(json.loads(urllib.request.urlopen(request, timeout=60).read())["choices"][0]["message"]["content"])
"""


class Stack:
    rollout: RunningService[RolloutApp]
    gateway: RunningService[GatewayApp]
    gateway_port: int
    rollout_stub: Any
    gateway_stub: Any


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    tokenizer = build_tiny_tokenizer()
    eot: Any = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = [ScriptTurn.from_dict({"text": f"Answer {i}."}) for i in range(4)]
    app = ProxyApp(
        ProxySettings(state_dir=tmp_path / "proxy", fsync=False, context_length=32768),
        ScriptedBackend(turns, tokenizer, end_of_turn_id=eot),
        tokenizer,
    )
    await app.start()
    proxy_server, proxy_port = await start_grpc_server([registration(app)], host="127.0.0.1", port=0)
    recon = service_spec("reconstructor")
    recon_server, recon_port = await recon.start(recon.settings_cls.load(state_dir=tmp_path / "reconstructor"))
    evaluator = service_spec("evaluator")
    eval_server, eval_port = await evaluator.start(evaluator.settings_cls.load(state_dir=tmp_path / "evaluator"))
    rollout = await start_rollout_server(
        RolloutSettings(
            state_dir=tmp_path / "rollout",
            heartbeat_interval_s=0.2,
            lease_ttl_s=10.0,
            dispatch_interval_s=0.05,
            watchdog_interval_s=0.1,
        )
    )
    gateway = await start_server(
        GatewaySettings(
            state_dir=tmp_path / "gateway",
            gateway_id="gw-1",
            proxy_address=f"127.0.0.1:{proxy_port}",
            reconstructor_address=f"127.0.0.1:{recon_port}",
            evaluator_address=f"127.0.0.1:{eval_port}",
            rollout_address=f"127.0.0.1:{rollout.port}",
            metrics_port=-1,
        )
    )
    rollout_channel = open_channel(f"127.0.0.1:{rollout.port}")
    gateway_channel = open_channel(f"127.0.0.1:{gateway.port}")
    s = Stack()
    s.rollout, s.gateway, s.gateway_port = rollout, gateway, gateway.port
    s.rollout_stub = rollout_service_pb2_grpc.RolloutServiceStub(rollout_channel)
    s.gateway_stub = gw_grpc.GatewayServiceStub(gateway_channel)
    try:
        yield s
    finally:
        await rollout_channel.close(None)
        await gateway_channel.close(None)
        await gateway.stop(None)
        await rollout.stop(None)
        for server in (eval_server, recon_server, proxy_server):
            await server.stop(None)
        await app.close()


async def test_registered_gateway_runs_a_submitted_task(stack: Stack) -> None:
    task = task_pb2.Task(
        task_id="reg-task",
        instruction="Answer.",
        num_samples=2,
        timeout_seconds=60,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=task_pb2.EvaluatorSpec(strategy="session_completed"),
    )
    task.harness.options.update({"argv": ["python3", "-c", AGENT]})
    membership = stack.gateway.app.membership
    assert membership is not None
    async with asyncio.timeout(10):
        await membership.registered.wait()
    await stack.rollout_stub.SubmitTask(pb.SubmitTaskRequest(task=task))
    async with asyncio.timeout(90):
        while True:
            reply = await stack.rollout_stub.GetTask(pb.GetTaskRequest(task_id="reg-task"))
            if reply.task.status == status_pb2.TASK_STATUS_COMPLETED:
                break
            assert reply.task.status in (status_pb2.TASK_STATUS_PENDING, status_pb2.TASK_STATUS_RUNNING), reply
            await asyncio.sleep(0.1)
    results = sorted(reply.session_results, key=lambda r: r.sample_index)
    assert [r.sample_index for r in results] == [0, 1]
    assert all(r.status == "resolved" for r in results), results
    assert all(r.gateway_id == "gw-1" for r in results)
    assert all(r.statistics.completions == 1 and len(r.traces) == 1 for r in results)
    assert reply.task.sessions_done == 2

    # Heartbeats carried capacity and the stage load.
    async with asyncio.timeout(5):
        await membership.beat.wait()
    (record,) = await stack.rollout.app.core.store.list_gateways()
    assert record.gateway_id == "gw-1"
    assert record.address == f"127.0.0.1:{stack.gateway_port}"
    assert record.capacity == 64
    assert set(record.stage_metrics) == {"init", "ready", "running", "postrun"}
    assert record.stage_metrics["running"]["workers"] == 8

    # DrainGateway reaches the gateway with the next heartbeat: it then refuses new sessions.
    await stack.rollout_stub.DrainGateway(pb.DrainGatewayRequest(gateway_id="gw-1", reason="test"))
    async with asyncio.timeout(5):
        while True:
            capacity = await stack.gateway_stub.GetCapacity(gw_pb.GetCapacityRequest())
            if capacity.draining:
                break
            await asyncio.sleep(0.05)
    assert capacity.available == 0
