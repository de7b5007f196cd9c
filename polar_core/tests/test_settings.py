from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pydantic
import pytest
from pydantic_settings import SettingsConfigDict

from polar_core.errors import InvalidArgument
from polar_core.settings import ServiceSettings, TelemetrySettings


class _DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="POLAR_DEMO_", frozen=True, extra="forbid")
    toml_table: ClassVar[str] = "demo"
    workers: int = 1


def test_defaults_when_nothing_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLAR_DEMO_WORKERS", raising=False)
    s = _DemoSettings.load()
    assert (s.host, s.port, s.workers) == ("127.0.0.1", 0, 1)


def test_precedence_flags_over_env_over_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "polar.toml"
    cfg.write_text('host = "0.0.0.0"\n[demo]\nworkers = 3\nport = 7000\n[other]\nworkers = 9\n')
    s = _DemoSettings.load(cfg)
    assert (s.host, s.port, s.workers) == ("0.0.0.0", 7000, 3)
    monkeypatch.setenv("POLAR_DEMO_WORKERS", "5")
    assert _DemoSettings.load(cfg).workers == 5
    assert _DemoSettings.load(cfg, workers=8, port=None).workers == 8
    assert _DemoSettings.load(cfg, workers=8).port == 7000


def test_settings_are_frozen_and_validated(tmp_path: Path) -> None:
    s = _DemoSettings.load()
    with pytest.raises(pydantic.ValidationError):
        s.workers = 2  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        _DemoSettings.load(port=70000)
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[demo]\nunknown_field = 1\n")
    with pytest.raises(pydantic.ValidationError):
        _DemoSettings.load(cfg)


def test_unreadable_toml_is_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "broken.toml"
    cfg.write_text("[demo\n")
    with pytest.raises(InvalidArgument, match="cannot read settings file"):
        _DemoSettings.load(cfg)


def test_tracing_is_off_unless_otel_variables_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(var, raising=False)
    assert not TelemetrySettings().export_enabled
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    assert TelemetrySettings().export_enabled
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not TelemetrySettings().export_enabled
