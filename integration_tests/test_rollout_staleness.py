"""Staleness through the real stack: a real rollout server (SQLite), a registered real gateway, the real model proxy
(scripted backend), reconstructor and evaluator, and the ``command`` harness making two chained chat calls.

The fleet moves from policy version 1 to 2 in the middle of the first session: right after its first call was
sampled (stamped "1") and before that call's answer reaches the agent, the test calls the proxy's real
``SetPolicyVersion("2")`` and sets the fleet's version that the rollout server reads (the port the fleet
coordinator will fill). So the session's second call carries "2" and, at recording time, the session's lag is 1.

* ``max_policy_lag: 0`` with ``resample``: the stale attempt is discarded and the session sampled again; the only
  result streamed by WatchTask, returned by GetTask and delivered to the trainer's callback has lag 0, and the
  statistics count one stale resample (not an infra retry).
* ``max_policy_lag: 0`` with ``keep``: the session is kept; the reconstructor split it at the version boundary by
  default (two traces, split reason ``policy_version``) and every trace carries its own lag (1, then 0).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.proxy.v1 import model_proxy_service_pb2 as proxy_pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as proxy_grpc
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc, trainer_callback_service_pb2, trainer_callback_service_pb2_grpc

from gateway.app import GatewayApp
from gateway.server import start_server as start_gateway
from gateway.settings import GatewaySettings
from model_proxy.app import ProxyApp
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.models import GenerationChunk, GenerationRequest
from model_proxy.servicer import registration
from model_proxy.settings import ProxySettings
from polar_core.channels import open_channel
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.server import RunningService, ServiceRegistration, start_grpc_server
from polar_run.serve import service_spec
from rollout_server.app import RolloutApp
from rollout_server.server import start_server as start_rollout
from rollout_server.settings import RolloutSettings

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

# Two chat calls, the second continuing the first's conversation (so without the version split they would be
# merged into one trace), then exit 0.
AGENT = """
import json, os, urllib.request
def chat(messages):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(request, timeout=60).read())["choices"][0]["message"]["content"]
messages = [{"role": "user", "content": "hi"}]
messages += [{"role": "assistant", "content": chat(messages)}, {"role": "user", "content": "and then?"}]
print(chat(messages))
"""


class Fleet:
    """The fleet's current policy version as the rollout server reads it (``CurrentPolicyVersion``)."""

    def __init__(self) -> None:
        self.version = 1

    async def current_version(self) -> int:
        return self.version


class BumpingBackend(ScriptedBackend):
    """The scripted backend, which runs ``bump`` once: after the first call was sampled, before it is answered."""

    def __init__(self, *args: Any, bump: Callable[[], Awaitable[None]], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._bump: Callable[[], Awaitable[None]] | None = bump

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        chunks = [chunk async for chunk in super().generate(request)]
        bump, self._bump = self._bump, None
        if bump is not None:
            await bump()
        for chunk in chunks:
            yield chunk


class Trainer(trainer_callback_service_pb2_grpc.TrainerCallbackServiceServicer):
    """Records every delivered result."""

    def __init__(self) -> None:
        self.delivered: list[session_pb2.SessionResult] = []

    async def DeliverSessionResult(self, request: Any, context: Any) -> Any:
        self.delivered.append(request.session_result)
        return trainer_callback_service_pb2.DeliverSessionResultResponse(duplicate=False)


class Stack:
    rollout: RunningService[RolloutApp]
    gateway: RunningService[GatewayApp]
    rollout_stub: Any
    trainer: Trainer
    trainer_port: int
    bumped: asyncio.Event


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    s = Stack()
    fleet = Fleet()
    s.bumped = asyncio.Event()
    proxy_channel: grpc.aio.Channel | None = None

    async def bump() -> None:
        assert proxy_channel is not None
        stub = proxy_grpc.ModelProxyServiceStub(proxy_channel)
        reply = await stub.SetPolicyVersion(proxy_pb.SetPolicyVersionRequest(policy_version="2"))
        assert reply.previous_policy_version == "1"
        fleet.version = 2
        s.bumped.set()

    tokenizer = build_tiny_tokenizer()
    eot: Any = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = [ScriptTurn.from_dict({"text": f"Answer {i}."}) for i in range(8)]
    app = ProxyApp(
        ProxySettings(state_dir=tmp_path / "proxy", fsync=False, context_length=32768, policy_version="1"),
        BumpingBackend(turns, tokenizer, end_of_turn_id=eot, bump=bump),
        tokenizer,
    )
    await app.start()
    proxy_server, proxy_port = await start_grpc_server([registration(app)], host="127.0.0.1", port=0)
    proxy_channel = open_channel(f"127.0.0.1:{proxy_port}")
    recon = service_spec("reconstructor")
    recon_server, recon_port = await recon.start(recon.settings_cls.load(state_dir=tmp_path / "reconstructor"))
    evaluator = service_spec("evaluator")
    eval_server, eval_port = await evaluator.start(evaluator.settings_cls.load(state_dir=tmp_path / "evaluator"))
    s.trainer = Trainer()
    name = trainer_callback_service_pb2.DESCRIPTOR.services_by_name["TrainerCallbackService"].full_name
    trainer_server, s.trainer_port = await start_grpc_server(
        [
            ServiceRegistration(
                name,
                lambda server: trainer_callback_service_pb2_grpc.add_TrainerCallbackServiceServicer_to_server(
                    s.trainer, server
                ),
            )
        ],
        host="127.0.0.1",
        port=0,
    )
    s.rollout = await start_rollout(
        RolloutSettings(
            state_dir=tmp_path / "rollout",
            heartbeat_interval_s=0.2,
            dispatch_interval_s=0.05,
            watchdog_interval_s=0.1,
            callback_backoff_s=0.05,
        ),
        current_policy=fleet,
    )
    s.gateway = await start_gateway(
        GatewaySettings(
            state_dir=tmp_path / "gateway",
            gateway_id="gw-1",
            proxy_address=f"127.0.0.1:{proxy_port}",
            reconstructor_address=f"127.0.0.1:{recon_port}",
            evaluator_address=f"127.0.0.1:{eval_port}",
            rollout_address=f"127.0.0.1:{s.rollout.port}",
            metrics_port=-1,
        )
    )
    rollout_channel = open_channel(f"127.0.0.1:{s.rollout.port}")
    s.rollout_stub = rollout_service_pb2_grpc.RolloutServiceStub(rollout_channel)
    membership = s.gateway.app.membership
    assert membership is not None
    try:
        async with asyncio.timeout(10):
            await membership.registered.wait()
        yield s
    finally:
        await rollout_channel.close(None)
        await s.gateway.stop(None)
        await s.rollout.stop(None)
        await proxy_channel.close(None)
        for server in (trainer_server, eval_server, recon_server, proxy_server):
            await server.stop(None)
        await app.close()


def _task(task_id: str, stale_policy: task_pb2.StalePolicy, trainer_port: int) -> task_pb2.Task:
    task = task_pb2.Task(
        task_id=task_id,
        instruction="Answer.",
        num_samples=1,
        timeout_seconds=60,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=task_pb2.EvaluatorSpec(strategy="session_completed"),
        max_policy_lag=0,
        stale_policy=stale_policy,
        callback=task_pb2.CallbackSpec(grpc_target=f"127.0.0.1:{trainer_port}"),
    )
    task.harness.options.update({"argv": ["python3", "-c", AGENT]})
    return task


async def _watch(stack: Stack, task_id: str) -> tuple[list[session_pb2.SessionResult], pb.GetTaskResponse]:
    """Every result WatchTask streams until the task ends, then GetTask once its delivery went out."""
    streamed: list[session_pb2.SessionResult] = []
    async with asyncio.timeout(90):
        async for item in stack.rollout_stub.WatchTask(pb.WatchTaskRequest(task_id=task_id)):
            if item.HasField("session_result"):
                streamed.append(item.session_result)
        while True:
            reply = await stack.rollout_stub.GetTask(pb.GetTaskRequest(task_id=task_id))
            if reply.task.statistics.deliveries_delivered == len(reply.session_results):
                return streamed, reply
            await asyncio.sleep(0.05)


async def test_resample_samples_a_stale_session_again_and_delivers_only_a_fresh_result(stack: Stack) -> None:
    await stack.rollout_stub.SubmitTask(
        pb.SubmitTaskRequest(task=_task("stale-resample", task_pb2.STALE_POLICY_RESAMPLE, stack.trainer_port))
    )
    streamed, reply = await _watch(stack, "stale-resample")
    assert stack.bumped.is_set()
    assert reply.task.status == status_pb2.TASK_STATUS_COMPLETED
    (result,) = reply.session_results
    assert result.status == "resolved"
    assert result.attempt == 2  # the first attempt (calls under "1" and "2") was discarded
    assert result.policy_lag == 0
    assert {v for t in result.traces for v in t.policy_versions} == {"2"}
    assert [t.policy_lag for t in result.traces] == [0] * len(result.traces)
    stats = reply.task.statistics
    assert (stats.sessions_stale_resampled, stats.sessions_stale_kept) == (1, 0)
    assert (stats.sessions_retried, stats.attempts_total) == (0, 2)  # not an infra_error retry
    assert (stats.policy_lag.count, stats.policy_lag.max) == (1, 0)
    assert dict(reply.task.sessions_by_status) == {"resolved": 1}
    # Nothing beyond the bound was streamed or delivered: one result each, the fresh one.
    assert [(r.attempt, r.policy_lag) for r in streamed] == [(2, 0)]
    assert [(r.attempt, r.policy_lag) for r in stack.trainer.delivered] == [(2, 0)]


async def test_keep_carries_the_lag_on_every_trace_split_at_the_version_boundary(stack: Stack) -> None:
    await stack.rollout_stub.SubmitTask(
        pb.SubmitTaskRequest(task=_task("stale-keep", task_pb2.STALE_POLICY_KEEP, stack.trainer_port))
    )
    streamed, reply = await _watch(stack, "stale-keep")
    (result,) = reply.session_results
    assert result.status == "resolved"
    assert result.attempt == 1
    assert result.policy_lag == 1
    # The reconstructor split the session where the version changed (its default) ...
    assert [list(t.policy_versions) for t in result.traces] == [["1"], ["2"]]
    assert dict(result.statistics.reconstruction.splits_by_reason) == {"policy_version": 1}
    # ... and each trace carries how far behind its own oldest call was.
    assert [t.policy_lag for t in result.traces] == [1, 0]
    stats = reply.task.statistics
    assert (stats.sessions_stale_kept, stats.sessions_stale_resampled) == (1, 0)
    assert (stats.policy_lag.count, stats.policy_lag.max) == (1, 1)
    assert [r.policy_lag for r in streamed] == [1]
    (delivered,) = stack.trainer.delivered
    assert delivered.policy_lag == 1
    assert [t.policy_lag for t in delivered.traces] == [1, 0]
