"""The OpenHands and Hermes Agent adapters: files, environment and argv (pure; no program is started)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
from pathlib import Path, PurePosixPath

import pytest
import yaml

from gateway.harnesses import HarnessAdapter, HarnessContext, ProxyEndpoints, adapter_names, get_adapter
from gateway.harnesses.openhands import program_source
from gateway.harnesses.pyvenv import harness_root
from polar_core.errors import InvalidArgument

ENDPOINTS = ProxyEndpoints(
    token="tok-123",
    anthropic_base_url="http://127.0.0.1:18080",
    openai_base_url="http://127.0.0.1:18080",  # bare: the adapters add /v1
    google_base_url="http://127.0.0.1:18080",
)


def make_ctx(**options: object) -> HarnessContext:
    return HarnessContext(
        home=PurePosixPath("/s/home"),
        workspace=PurePosixPath("/s/workspace"),
        tmp=PurePosixPath("/s/tmp"),
        instruction="-fix the bug",
        endpoints=ENDPOINTS,
        model="polar-model",
        options=options,
        bin_dir=PurePosixPath("/opt/h/node_modules/.bin"),
    )


@pytest.mark.parametrize("name", ["openhands", "hermes-agent"])
def test_registered_and_common_environment(name: str) -> None:
    assert name in adapter_names()
    adapter = get_adapter(name)
    assert isinstance(adapter, HarnessAdapter)
    assert adapter.name == name
    assert adapter.artifacts
    launch = adapter.prepare(make_ctx(env={"EXTRA": "1"}))
    env = launch.env
    assert (env["HOME"], env["TMPDIR"], env["EXTRA"], env["DO_NOT_TRACK"]) == ("/s/home", "/s/tmp", "1", "1")
    # The agent's own environment is run by path and kept off PATH (the workspace's commands get the system python).
    assert launch.argv[0] == f"/opt/h/py/{name}/bin/python"
    assert "/opt/h/py" not in env["PATH"]
    assert launch.cwd == PurePosixPath("/s/workspace")
    assert all(not PurePosixPath(p).is_absolute() and ".." not in PurePosixPath(p).parts for p in launch.files)
    assert all(p.is_relative_to("/s/home") for p in launch.log_paths)


@pytest.mark.parametrize("name", ["openhands", "hermes-agent"])
def test_unknown_option_is_rejected(name: str) -> None:
    with pytest.raises(InvalidArgument, match="unknown option"):
        get_adapter(name).prepare(make_ctx(typo_option=1))


def test_harness_root() -> None:
    assert harness_root(PurePosixPath("/r/.harnesses/node_modules/.bin")) == PurePosixPath("/r/.harnesses")
    assert harness_root(PurePosixPath("/opt/clis/bin")) == PurePosixPath("/opt/clis")


def test_openhands_launch() -> None:
    launch = get_adapter("openhands").prepare(make_ctx())
    assert launch.argv[1:] == ("/s/home/.polar/openhands_agent.py", "/s/home/.polar/openhands.json")
    assert launch.files[".polar/openhands_agent.py"] == program_source()
    config = json.loads(str(launch.files[".polar/openhands.json"]))
    assert config == {
        "instruction": "-fix the bug",
        "model": "polar-model",
        "base_url": "http://127.0.0.1:18080/v1",
        "api_key": "tok-123",
        "workspace": "/s/workspace",
        "persistence_dir": "/s/home/.openhands/conversations",
        "tools": ["terminal", "file_editor", "task_tracker"],
        "max_iterations": 100,
        "max_input_tokens": 131072,
        "max_output_tokens": 8192,
    }
    env = launch.env
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["OPENHANDS_SUPPRESS_BANNER"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"
    # The token travels in the configuration file below the session's HOME, not on the command line.
    assert "tok-123" not in " ".join(launch.argv)


def test_openhands_options() -> None:
    launch = get_adapter("openhands").prepare(
        make_ctx(tools=["terminal"], max_iterations=7, context_window=4096, max_output_tokens=256)
    )
    config = json.loads(str(launch.files[".polar/openhands.json"]))
    assert (config["tools"], config["max_iterations"], config["max_input_tokens"], config["max_output_tokens"]) == (
        ["terminal"],
        7,
        4096,
        256,
    )
    with pytest.raises(InvalidArgument, match="browser"):
        get_adapter("openhands").prepare(make_ctx(tools=["terminal", "browser"]))
    with pytest.raises(InvalidArgument, match="extra_args"):
        get_adapter("openhands").prepare(make_ctx(extra_args=["--x"]))


def test_openhands_program_imports_nothing_from_polar() -> None:
    """The program runs on the agent's interpreter, where Polar is not installed."""
    tree = ast.parse(program_source())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    roots = {m.split(".")[0] for m in modules}
    stdlib = {"__future__", "json", "shlex", "shutil", "sys", "pathlib", "typing"}
    assert roots <= stdlib | {"openhands", "pydantic"}, roots


def test_openhands_terminal_is_a_dumb_one_in_the_configured_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The terminal tool's shell sets TERM=dumb and runs bash without readline; its PWD is the workspace as given."""
    from gateway.harnesses.programs import openhands_agent

    monkeypatch.setattr(openhands_agent, "__file__", str(tmp_path / "openhands_agent.py"))
    params = openhands_agent.tool_params({"workspace": "/polar/session/workspace"}, "terminal")
    assert params["terminal_type"] == "subprocess"
    assert params["env"] == {"PWD": "/polar/session/workspace"}
    script = Path(params["shell_path"])
    assert script.parent == tmp_path
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert "TERM=dumb" in text
    assert "--noediting" in text
    assert openhands_agent.tool_params({"workspace": "/w"}, "file_editor") == {}


def test_hermes_launch() -> None:
    launch = get_adapter("hermes-agent").prepare(make_ctx())
    # ``--oneshot=`` keeps an instruction that starts with a dash from being read as a flag.
    assert launch.argv[1:] == (
        "-m",
        "hermes_cli.main",
        "--oneshot=-fix the bug",
        "--provider",
        "custom",
        "--model",
        "polar-model",
    )
    assert launch.env["HERMES_HOME"] == "/s/home/.hermes"
    config = yaml.safe_load(str(launch.files[".hermes/config.yaml"]))
    assert config["model"] == {
        "default": "polar-model",
        "provider": "custom",
        "base_url": "http://127.0.0.1:18080/v1",
        "api_key": "tok-123",
        "context_length": 131072,
    }
    assert config["security"] == {"allow_lazy_installs": False}
    assert config["terminal"] == {"backend": "local", "cwd": "/s/workspace"}
    assert "agent" not in config


def test_hermes_options() -> None:
    launch = get_adapter("hermes-agent").prepare(
        make_ctx(toolsets=["terminal", "file"], max_turns=5, context_window=8192, extra_args=["--skills", "x"])
    )
    assert launch.argv[-4:] == ("--toolsets", "terminal,file", "--skills", "x")
    config = yaml.safe_load(str(launch.files[".hermes/config.yaml"]))
    assert config["agent"] == {"max_turns": 5}
    assert config["model"]["context_length"] == 8192
    with pytest.raises(InvalidArgument, match="toolsets"):
        get_adapter("hermes-agent").prepare(make_ctx(toolsets="terminal"))


def test_without_a_harness_directory_the_programs_come_from_path() -> None:
    """A container image that brings its own programs: no bin_dir, so names on PATH."""
    ctx = dataclasses.replace(make_ctx(), bin_dir=None)
    assert get_adapter("hermes-agent").prepare(ctx).argv[0] == "hermes"
    assert get_adapter("openhands").prepare(ctx).argv[0] == "python3"


@pytest.mark.parametrize("name", ["openhands", "hermes-agent"])
def test_missing_openai_endpoint_is_an_error(name: str) -> None:
    ctx = dataclasses.replace(make_ctx(), endpoints=dataclasses.replace(ENDPOINTS, openai_base_url=""))
    with pytest.raises(InvalidArgument, match="OpenAI"):
        get_adapter(name).prepare(ctx)
