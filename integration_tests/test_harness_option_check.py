"""A harness option no adapter knows is refused at submission, with the field named, and nothing is recorded.

Both doors: the rollout server's SubmitTask (a real server in-process; the raw Task bypasses the client's check)
answers INVALID_ARGUMENT with ``ErrorInfo.metadata["field"]``; ``polar submit`` and ``polar run`` exit 2 naming
the field before anything reaches a server.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from polar.common.v1 import task_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc

from polar_core.server import RunningService
from rollout_server.app import RolloutApp
from rollout_server.server import start_server
from rollout_server.settings import RolloutSettings

TOKEN = "s3cret-token"
_CLI = [sys.executable, "-c", "import sys; from polar_run.cli import main; main(sys.argv[1:])"]


@pytest.fixture
async def rollout(tmp_path: Path) -> AsyncIterator[RunningService[RolloutApp]]:
    running = await start_server(RolloutSettings(port=0, state_dir=tmp_path, auth_token=TOKEN))
    yield running
    await running.stop(None)


def _error_field(err: grpc.aio.AioRpcError) -> str:
    metadata: Any = err.trailing_metadata() or ()
    status = status_pb2.Status.FromString(dict(metadata)["grpc-status-details-bin"])
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return str(info.metadata["field"])


async def _task_ids(stub: rollout_service_pb2_grpc.RolloutServiceAsyncStub) -> list[str]:
    listed = await stub.ListTasks(pb.ListTasksRequest(page_size=50), metadata=(("authorization", f"Bearer {TOKEN}"),))
    return [t.task.task_id for t in listed.tasks]


def _task(task_id: str, harness: str, **options: Any) -> task_pb2.Task:
    task = task_pb2.Task(task_id=task_id, instruction="fix it", num_samples=1, timeout_seconds=60)
    task.harness.name = harness
    task.harness.options.update(options)
    return task


@pytest.mark.parametrize(
    ("harness", "options", "field"),
    [
        ("pi", {"provdier_mode": "openai-responses"}, "harness.provdier_mode"),
        ("claude-code", {"yolo": True}, "harness.yolo"),
        ("claude_code", {}, "harness.name"),
    ],
)
async def test_submit_task_refuses_an_unknown_harness_option_and_stores_nothing(
    rollout: RunningService[RolloutApp], harness: str, options: dict[str, Any], field: str
) -> None:
    auth = (("authorization", f"Bearer {TOKEN}"),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{rollout.port}") as channel:
        stub: Any = rollout_service_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.SubmitTask(pb.SubmitTaskRequest(task=_task("bad", harness, **options)), metadata=auth)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (info.value.details() or "")
        assert _error_field(info.value) == field
        assert await _task_ids(stub) == []
        # The same task with the adapter's real option is accepted: the check refuses only what it should.
        await stub.SubmitTask(
            pb.SubmitTaskRequest(task=_task("good", "pi", provider_mode="openai-responses")), metadata=auth
        )
        assert await _task_ids(stub) == ["good"]


def _polar(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    return subprocess.run([*_CLI, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env, check=False)


async def test_cli_submit_and_run_exit_2_naming_the_option(rollout: RunningService[RolloutApp], tmp_path: Path) -> None:
    task_file = tmp_path / "TASK.yaml"
    task_file.write_text(
        "task_id: typo\ninstruction: say hi\nnum_samples: 1\ntimeout_seconds: 30\n"
        "harness: {name: pi, provdier_mode: openai-responses}\nevaluator: {strategy: none}\n"
    )
    target = f"127.0.0.1:{rollout.port}"
    submitted = await asyncio.to_thread(
        _polar, "submit", str(task_file), "--server", target, "--token", TOKEN, cwd=tmp_path
    )
    assert submitted.returncode == 2, submitted.stdout + submitted.stderr
    assert "harness.provdier_mode" in submitted.stderr
    assert "Traceback" not in submitted.stderr
    ran = await asyncio.to_thread(_polar, "run", str(task_file), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "harness.provdier_mode" in ran.stderr
    assert not (tmp_path / "out" / "sessions.jsonl").exists()
    async with grpc.aio.insecure_channel(target) as channel:
        stub: Any = rollout_service_pb2_grpc.RolloutServiceStub(channel)
        assert await _task_ids(stub) == []
