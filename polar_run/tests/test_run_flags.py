"""``polar run --metrics`` and ``--jaeger-url``: parsing, what reaches the run, and the settings each embedded
service gets (no ports; the real run is ``integration_tests/test_dashboard_http.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar_core.errors import InvalidArgument
from polar_run import cli, commands
from polar_run.embedded import (
    METRICS_OFFSETS,
    StackOptions,
    _gateway_settings,
    _proxy_settings,
    _rollout_settings,
)
from polar_run.run import RunOptions

_PORTS = {"proxy": 1, "reconstructor": 2, "evaluator": 3, "gateway": 4, "proxy_metrics": 5}


def _run(monkeypatch: pytest.MonkeyPatch, *argv: str) -> RunOptions:
    """Parse ``polar run task.yaml ARGV`` and return the options the run would get (nothing starts)."""
    seen: list[RunOptions] = []

    def capture(options: RunOptions, *, verbose: bool = False) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr("polar_run.run.run_command", capture)
    monkeypatch.setattr(commands, "_overrides", lambda args: None)  # no harness lookup on this machine
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "task.yaml", *argv])
    assert exit_.value.code == 0
    return seen[0]


def test_defaults_serve_only_the_proxys_metrics_and_no_jaeger_link(monkeypatch: pytest.MonkeyPatch) -> None:
    options = _run(monkeypatch)
    assert (options.metrics, options.jaeger_url) == (None, "")


def test_metrics_alone_means_free_ports_and_a_port_means_that_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(monkeypatch, "--metrics").metrics == 0
    assert _run(monkeypatch, "--metrics", "9464").metrics == 9464
    assert _run(monkeypatch, "--metrics=19464").metrics == 19464


def test_jaeger_url_reaches_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    options = _run(monkeypatch, "--jaeger-url", "http://127.0.0.1:16686", "--metrics")
    assert options.jaeger_url == "http://127.0.0.1:16686"
    assert options.metrics == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--metrics", "65532"],  # no room for the four ports after it
        ["--metrics", "-1"],
        ["--metrics", "lots"],
        ["--jaeger-url", "jaeger:16686"],  # not a link a page can follow
        ["--jaeger-url", "javascript:alert(1)"],
    ],
)
def test_bad_values_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "task.yaml", *argv])
    assert exit_.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_a_jaeger_link_without_the_dashboard_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands, "_overrides", lambda args: None)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "task.yaml", "--no-dashboard", "--jaeger-url", "http://j:16686"])
    assert exit_.value.code == 2
    assert "--jaeger-url" in capsys.readouterr().err


def _ports(options: StackOptions, tmp: Path) -> dict[str, Any]:
    return {
        "proxy": _proxy_settings(options, tmp, "t").metrics_port,
        "gateway": _gateway_settings(options, tmp, "t", _PORTS).metrics_port,
        "rollout": _rollout_settings(options, tmp, "t", _PORTS, "").metrics_port,
        "reconstructor": options.metrics_port("reconstructor"),
        "evaluator": options.metrics_port("evaluator"),
    }


def test_each_embedded_service_gets_its_metrics_port(tmp_path: Path) -> None:
    off = StackOptions(state_dir=tmp_path)
    assert set(_ports(off, tmp_path).values()) == {-1}
    with_dashboard = StackOptions(state_dir=tmp_path, dashboard=True)
    assert _ports(with_dashboard, tmp_path) == {  # the dashboard reads the proxy's
        "proxy": 0,
        "gateway": -1,
        "rollout": -1,
        "reconstructor": -1,
        "evaluator": -1,
    }
    assert set(_ports(StackOptions(state_dir=tmp_path, metrics=0), tmp_path).values()) == {0}
    fixed = _ports(StackOptions(state_dir=tmp_path, metrics=9464), tmp_path)
    assert fixed == {"gateway": 9464, "proxy": 9465, "rollout": 9466, "reconstructor": 9467, "evaluator": 9468}
    assert {name: 9464 + offset for name, offset in METRICS_OFFSETS.items()} == fixed
    with pytest.raises(InvalidArgument):
        StackOptions(state_dir=tmp_path, metrics=65533)


def test_jaeger_url_is_the_dashboards_link_setting(tmp_path: Path) -> None:
    options = StackOptions(state_dir=tmp_path, dashboard=True, jaeger_url="http://127.0.0.1:16686")
    settings = _rollout_settings(options, tmp_path, "t", _PORTS, "key")
    assert settings.dashboard_jaeger_url == "http://127.0.0.1:16686"
    assert settings.dashboard_proxy_metrics_urls == ["http://127.0.0.1:5/metrics"]
