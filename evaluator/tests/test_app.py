from __future__ import annotations

from pathlib import Path

from polar.common.v1 import task_pb2
from polar.evaluator.v1 import evaluator_service_pb2 as pb
from polar.evaluator.v1 import evaluator_service_pb2_grpc as pb_grpc

from evaluator import EvaluatorSettings, evaluator_config
from evaluator.server import start_server
from polar_core.channels import open_channel


def test_config_carries_the_settings(tmp_path: Path) -> None:
    settings = EvaluatorSettings(state_dir=tmp_path, default_timeout_s=7.0, docker_pids_limit=3)
    config = evaluator_config(settings)
    assert config.evaluations_dir == tmp_path / "evaluations"
    assert config.runtimes_dir == tmp_path / "runtimes"
    assert config.default_timeout_s == 7.0
    assert config.docker_pids_limit == 3


async def test_stopping_the_service_releases_live_handles(tmp_path: Path) -> None:
    running = await start_server(EvaluatorSettings(state_dir=tmp_path))
    async with open_channel(f"127.0.0.1:{running.port}") as channel:
        stub = pb_grpc.EvaluatorServiceStub(channel)
        spec = task_pb2.EvaluatorSpec(strategy="session_completed")
        handle = (await stub.Prepare(pb.PrepareRequest(evaluator=spec, request_id="r"))).handle
    await running.stop(None)
    assert await running.app.service.release(handle) is False  # closing the app released it
