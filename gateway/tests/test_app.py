"""GatewayApp's wiring: the pipeline's config comes from the settings, and the app closes what it opened."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gateway.app import GatewayApp, GatewaySeams, pipeline_config
from gateway.models import PipelineConfig
from gateway.settings import GatewaySettings
from gateway.testing import FakeAgentRunner, FakeProxy, FakeRuntimeFactory


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
