"""GatewayApp's wiring: the pipeline's config comes from the settings, and the app closes what it opened."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
from polar.common.v1 import session_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2 as pb
from polar.gateway.v1 import gateway_service_pb2_grpc as pb_grpc

from gateway.app import GatewayApp, GatewaySeams, pipeline_config
from gateway.models import PipelineConfig
from gateway.server import start_server
from gateway.settings import GatewaySettings
from gateway.testing import FakeAgentRunner, FakeProxy, FakeRuntimeFactory
from runtimes import Isolation
from runtimes.local import IsolationProbe


def test_pipeline_config_defaults_are_the_settings_defaults() -> None:
    assert pipeline_config(GatewaySettings()) == PipelineConfig()


def test_pipeline_config_takes_every_field_from_the_settings() -> None:
    changed: dict[str, Any] = {
        f.name: getattr(PipelineConfig(), f.name) * 2
        for f in dataclasses.fields(PipelineConfig)
        if f.name != "default_model"
    }
    config = pipeline_config(GatewaySettings.model_validate({**changed, "default_model": "m"}))
    assert config == PipelineConfig(**changed, default_model="m")


async def test_open_without_addresses_builds_no_clients_and_closes(tmp_path: Path) -> None:
    proxy = FakeProxy()
    seams = GatewaySeams(runtimes=FakeRuntimeFactory(), agents=FakeAgentRunner(proxy), proxy=proxy)
    app = await GatewayApp.open(GatewaySettings(state_dir=tmp_path, metrics_port=-1), seams=seams)
    try:
        assert app.metrics_port == -1
        app.serving(4321)
        assert app.pipeline.gateway_id == "gateway-4321"
        assert app.membership is None
    finally:
        await app.close()
    assert app.pipeline.capacity().draining


async def test_a_host_without_the_minimum_isolation_refuses_sessions_and_advertises_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = FakeProxy()
    missing = IsolationProbe(Isolation.UNSHARE, {Isolation.BWRAP: "bubblewrap (bwrap) is not installed"})
    seams = GatewaySeams(runtimes=FakeRuntimeFactory(), agents=FakeAgentRunner(proxy), proxy=proxy, isolation=missing)
    settings = GatewaySettings(state_dir=tmp_path, metrics_port=-1, dependency_probes=False)
    with caplog.at_level(logging.ERROR, logger="gateway.app"):
        running = await start_server(settings, seams=seams)
    assert "bubblewrap (bwrap) is not installed" in caplog.text
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.GatewayServiceStub(channel)
            capacity = await stub.GetCapacity(pb.GetCapacityRequest())
            assert capacity.available == 0
            spec = session_pb2.SessionSpec(
                session_id="s",
                task_id="t",
                attempt=1,
                task=task_pb2.Task(task_id="t", harness=task_pb2.HarnessSpec(name="command")),
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.StartSession(pb.StartSessionRequest(spec=spec))
        assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "minimum isolation 'bwrap'" in str(info.value.details())
        assert "bubblewrap (bwrap) is not installed" in str(info.value.details())
    finally:
        await running.stop(None)


async def test_an_explicit_weaker_minimum_runs_on_such_a_host(tmp_path: Path) -> None:
    proxy = FakeProxy()
    missing = IsolationProbe(Isolation.UNSHARE, {Isolation.BWRAP: "bubblewrap (bwrap) is not installed"})
    seams = GatewaySeams(runtimes=FakeRuntimeFactory(), agents=FakeAgentRunner(proxy), proxy=proxy, isolation=missing)
    settings = GatewaySettings(state_dir=tmp_path, metrics_port=-1, min_isolation="unshare")
    app = await GatewayApp.open(settings, seams=seams)
    try:
        assert app.pipeline.capacity().available == settings.max_sessions
    finally:
        await app.close()
