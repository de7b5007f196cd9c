"""The Python agents' adapters (mini-swe-agent, aider, openai-agents): files, environment and argv; no ports."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

import pytest

from gateway.harness_check import check_program
from gateway.harnesses import HarnessAdapter, HarnessContext, ProxyEndpoints, adapter_names, get_adapter
from polar_core.errors import FailedPrecondition, InvalidArgument

PYTHON_AGENTS = ("mini-swe-agent", "aider", "openai-agents")
ENDPOINTS = ProxyEndpoints(
    token="tok-123",
    anthropic_base_url="http://127.0.0.1:18080",
    openai_base_url="http://127.0.0.1:18080/v1",
    google_base_url="http://127.0.0.1:18080",
)


def make_ctx(**options: object) -> HarnessContext:
    return HarnessContext(
        home=PurePosixPath("/s/home"),
        workspace=PurePosixPath("/s/workspace"),
        tmp=PurePosixPath("/s/tmp"),
        instruction="--fix the bug",
        endpoints=ENDPOINTS,
        model="polar-model",
        options=options,
        bin_dir=PurePosixPath("/opt/harnesses/node_modules/.bin"),
    )


def _file(launch: Any, suffix: str) -> Any:
    (content,) = [v for k, v in launch.files.items() if k.endswith(suffix)]
    return json.loads(content)


def test_registered() -> None:
    for name in PYTHON_AGENTS:
        assert name in adapter_names()
        adapter = get_adapter(name)
        assert isinstance(adapter, HarnessAdapter)
        assert adapter.name == name
        assert adapter.artifacts


@pytest.mark.parametrize("name", PYTHON_AGENTS)
def test_common_launch(name: str) -> None:
    launch = get_adapter(name).prepare(make_ctx(env={"EXTRA": "1"}, extra_args=["--x"]))
    env = launch.env
    assert env["HOME"] == "/s/home"
    assert env["TMPDIR"] == "/s/tmp"
    assert env["EXTRA"] == "1"
    assert "--x" in launch.argv
    assert launch.cwd == PurePosixPath("/s/workspace")
    # The venv's interpreter, found beside the npm CLIs; its bin/ stays off PATH (the task's Python comes first).
    assert launch.argv[0] == f"/opt/harnesses/py/{name}/bin/python"
    assert "/opt/harnesses/py" not in env["PATH"]
    # The token reaches the agent through its environment or a file under HOME, never the command line.
    assert "tok-123" in json.dumps(dict(env)) + json.dumps({k: str(v) for k, v in launch.files.items()})
    assert not any("tok-123" in arg for arg in launch.argv)
    assert all(not PurePosixPath(p).is_absolute() and ".." not in PurePosixPath(p).parts for p in launch.files)
    assert launch.log_paths
    assert all(p.is_relative_to("/s/home") for p in launch.log_paths)
    # The instruction is the last argument, bound to its option or after "--", so one that looks like an option
    # is not taken for one.
    assert launch.argv[-1] in {"--task=--fix the bug", "--message=--fix the bug"} or launch.argv[-2:] == (
        "--",
        "--fix the bug",
    )


@pytest.mark.parametrize("name", PYTHON_AGENTS)
def test_unknown_option_is_rejected(name: str) -> None:
    with pytest.raises(InvalidArgument, match="unknown option"):
        get_adapter(name).prepare(make_ctx(typo_option=1))


@pytest.mark.parametrize("name", PYTHON_AGENTS)
def test_venv_option_and_fallback(name: str) -> None:
    launch = get_adapter(name).prepare(make_ctx(venv="/images/agent-venv"))
    assert launch.argv[0] == "/images/agent-venv/bin/python"
    with pytest.raises(InvalidArgument, match="absolute path"):
        get_adapter(name).prepare(make_ctx(venv="relative/venv"))
    # No harness tree known (a container image that brings the agent): the image's python3.
    bare = get_adapter(name).prepare(dataclasses.replace(make_ctx(), bin_dir=None))
    assert bare.argv[0] == "python3"


@pytest.mark.parametrize("name", PYTHON_AGENTS)
def test_missing_venv_is_refused_at_admission(name: str) -> None:
    launch = get_adapter(name).prepare(make_ctx())
    with pytest.raises(FailedPrecondition, match="needs the CLI"):
        check_program(name, launch, session_root=PurePosixPath("/s"))


@pytest.mark.parametrize("name", PYTHON_AGENTS)
def test_bare_openai_url_gets_v1(name: str) -> None:
    ctx = dataclasses.replace(make_ctx(), endpoints=dataclasses.replace(ENDPOINTS, openai_base_url="http://h:1"))
    launch = get_adapter(name).prepare(ctx)
    assert "http://h:1/v1" in " ".join(launch.argv) + json.dumps({k: str(v) for k, v in launch.files.items()})
    no_openai = dataclasses.replace(make_ctx(), endpoints=dataclasses.replace(ENDPOINTS, openai_base_url=""))
    with pytest.raises(InvalidArgument, match="OpenAI base URL"):
        get_adapter(name).prepare(no_openai)


def test_mini_swe_agent() -> None:
    launch = get_adapter("mini-swe-agent").prepare(make_ctx(step_limit=7))
    argv, env = launch.argv, launch.env
    assert argv[1:3] == ("-m", "minisweagent.run.mini")
    assert argv[argv.index("-c") + 1] == "mini.yaml"
    assert "-y" in argv
    assert "--exit-immediately" in argv
    assert argv[argv.index("-o") + 1] == "/s/home/.config/mini-swe-agent/trajectory.traj.json"
    config = _file(launch, "polar.yaml")
    assert config["model"]["model_name"] == "openai/polar-model"
    assert config["model"]["model_kwargs"]["api_base"] == "http://127.0.0.1:18080/v1"
    assert config["model"]["model_kwargs"]["api_key"] == "tok-123"
    assert config["agent"]["mode"] == "yolo"
    assert config["agent"]["step_limit"] == 7
    assert config["environment"]["cwd"] == "/s/workspace"
    registry = _file(launch, "model_registry.json")
    assert registry["openai/polar-model"]["input_cost_per_token"] == 0.0
    assert config["model"]["litellm_model_registry"] == "/s/home/.config/mini-swe-agent/model_registry.json"
    assert env["MSWEA_CONFIGURED"] == "true"
    assert env["MSWEA_GLOBAL_CONFIG_DIR"] == "/s/home/.config/mini-swe-agent"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["LITELLM_OFFLINE_MODE"] == "true"


@pytest.mark.parametrize("bad", [-1, True, "10", 1.5])
def test_mini_swe_agent_rejects_bad_numbers(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="step_limit"):
        get_adapter("mini-swe-agent").prepare(make_ctx(step_limit=bad))


def test_aider() -> None:
    launch = get_adapter("aider").prepare(make_ctx(test_cmd="pytest -q"))
    argv, env = launch.argv, launch.env
    assert argv[1:3] == ("-m", "aider")
    for flag in ("--yes-always", "--no-check-update", "--analytics-disable", "--no-show-release-notes",
                 "--no-detect-urls", "--no-auto-commits", "--no-gitignore"):  # fmt: skip
        assert flag in argv
    assert argv[argv.index("--model") + 1] == "openai/polar-model"
    assert argv[argv.index("--weak-model") + 1] == "openai/polar-model"
    assert argv[argv.index("--openai-api-base") + 1] == "http://127.0.0.1:18080/v1"
    assert argv[argv.index("--edit-format") + 1] == "whole"
    assert argv[argv.index("--map-tokens") + 1] == "0"
    assert argv[argv.index("--test-cmd") + 1] == "pytest -q"
    assert "--auto-test" in argv
    # Histories go under HOME, not into the workspace (where they would land in the patch).
    for flag in ("--chat-history-file", "--input-history-file", "--llm-history-file", "--model-metadata-file"):
        assert argv[argv.index(flag) + 1].startswith("/s/home/.aider/")
    metadata = _file(launch, "model.metadata.json")
    assert metadata["openai/polar-model"]["output_cost_per_token"] == 0.0
    assert metadata["openai/polar-model"]["max_input_tokens"] == 131072
    assert env["OPENAI_API_KEY"] == "tok-123"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert "--test-cmd" not in get_adapter("aider").prepare(make_ctx()).argv


@pytest.mark.parametrize(
    ("options", "field"),
    [({"edit_format": "nope"}, "edit_format"), ({"map_tokens": -1}, "map_tokens"), ({"test_cmd": ""}, "test_cmd")],
)
def test_aider_rejects_bad_options(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        get_adapter("aider").prepare(make_ctx(**options))


def test_openai_agents() -> None:
    launch = get_adapter("openai-agents").prepare(make_ctx(max_turns=9))
    argv, env = launch.argv, launch.env
    program = resources.files("gateway.harnesses.programs").joinpath("openai_agents_agent.py").read_text()
    assert launch.files[".polar-openai-agents/openai_agents_agent.py"] == program
    compile(program, "openai_agents_agent.py", "exec")  # the shipped program is valid Python
    home = "/s/home/.polar-openai-agents"
    assert argv[1:3] == (f"{home}/openai_agents_agent.py", f"{home}/config.json")
    config = _file(launch, "config.json")
    assert config == {
        "base_url": "http://127.0.0.1:18080/v1",
        "api": "responses",
        "model": "polar-model",
        "workspace": "/s/workspace",
        "max_turns": 9,
        "command_timeout": 120,
        "transcript": "/s/home/.polar-openai-agents/transcript.json",
    }
    assert env["OPENAI_API_KEY"] == "tok-123"
    assert env["OPENAI_AGENTS_DISABLE_TRACING"] == "1"
    chat = get_adapter("openai-agents").prepare(make_ctx(api="chat_completions"))
    assert _file(chat, "config.json")["api"] == "chat_completions"


@pytest.mark.parametrize(
    ("options", "field"),
    [({"api": "assistants"}, "api"), ({"max_turns": 0}, "max_turns"), ({"command_timeout": "x"}, "command_timeout")],
)
def test_openai_agents_rejects_bad_options(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        get_adapter("openai-agents").prepare(make_ctx(**options))
