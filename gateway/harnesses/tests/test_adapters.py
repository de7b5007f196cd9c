from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import PurePosixPath

import pytest

from gateway.harnesses import (
    PROVIDER_MODES,
    HarnessAdapter,
    HarnessContext,
    ProxyEndpoints,
    adapter_names,
    get_adapter,
    rebase_endpoints,
)
from polar_core.errors import InvalidArgument

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
        instruction="fix the bug",
        endpoints=ENDPOINTS,
        model="polar-model",
        options=options,
        bin_dir=PurePosixPath("/opt/harnesses/node_modules/.bin"),
    )


def test_registry_knows_every_harness() -> None:
    assert set(adapter_names()) >= {
        "claude-code",
        "codex",
        "qwen-code",
        "pi",
        "gemini-cli",
        "opencode",
        "cline",
        "continue",
        "command",
    }
    for name in adapter_names():
        adapter = get_adapter(name)
        assert isinstance(adapter, HarnessAdapter)
        assert adapter.name == name
        assert adapter.artifacts
    with pytest.raises(InvalidArgument):
        get_adapter("nope")


@pytest.mark.parametrize("name", ["claude-code", "codex", "qwen-code", "pi", "gemini-cli", "continue"])
def test_common_environment(name: str) -> None:
    launch = get_adapter(name).prepare(make_ctx(env={"EXTRA": "1"}, extra_args=["--x"]))
    env = launch.env
    assert env["HOME"] == "/s/home"
    assert env["TMPDIR"] == "/s/tmp"
    assert env["PATH"].startswith("/opt/harnesses/node_modules/.bin:")
    assert env["EXTRA"] == "1"
    assert "--x" in launch.argv
    assert launch.cwd == PurePosixPath("/s/workspace")
    assert "tok-123" in json.dumps(dict(env)) + json.dumps({k: str(v) for k, v in launch.files.items()})
    assert all(not PurePosixPath(p).is_absolute() and ".." not in PurePosixPath(p).parts for p in launch.files)
    assert launch.log_paths
    assert all(p.is_relative_to("/s/home") for p in launch.log_paths)


@pytest.mark.parametrize("name", ["claude-code", "codex", "qwen-code", "pi", "gemini-cli", "command"])
def test_unknown_option_is_rejected(name: str) -> None:
    with pytest.raises(InvalidArgument, match="unknown option"):
        get_adapter(name).prepare(make_ctx(argv=["x"], typo_option=1))


def test_claude_code() -> None:
    launch = get_adapter("claude-code").prepare(make_ctx())
    env = launch.env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080"
    assert env["ANTHROPIC_API_KEY"] == "tok-123"
    assert env["ANTHROPIC_MODEL"] == "polar-model"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["DISABLE_TELEMETRY"] == "1"
    assert env["CLAUDE_CONFIG_DIR"] == "/s/home/.claude"
    assert launch.argv[:3] == ("claude", "-p", "fix the bug")
    assert "--allowedTools" in launch.argv
    assert "Bash" in launch.argv[launch.argv.index("--allowedTools") + 1]


def test_claude_code_strips_v1_from_base_url() -> None:
    ctx = make_ctx()
    ctx = dataclasses.replace(ctx, endpoints=ProxyEndpoints("t", anthropic_base_url="http://h:1/p/v1/"))
    assert get_adapter("claude-code").prepare(ctx).env["ANTHROPIC_BASE_URL"] == "http://h:1/p"


def test_codex_config() -> None:
    launch = get_adapter("codex").prepare(make_ctx(context_window=32768))
    config = tomllib.loads(str(launch.files[".codex/config.toml"]))
    assert config["model"] == "polar-model"
    assert config["model_provider"] == "polar"
    provider = config["model_providers"]["polar"]
    assert provider["base_url"] == "http://127.0.0.1:18080/v1"
    assert provider["wire_api"] == "responses"
    assert launch.env[provider["env_key"]] == "tok-123"
    assert config["check_for_update_on_startup"] is False
    assert config["web_search"] == "disabled"
    assert config["analytics"]["enabled"] is False
    assert config["features"] == {"plugins": False, "apps": False}
    assert config["model_context_window"] == 32768
    assert launch.env["CODEX_HOME"] == "/s/home/.codex"
    assert launch.argv[:2] == ("codex", "exec")
    assert "--dangerously-bypass-approvals-and-sandbox" in launch.argv
    assert launch.argv[-2:] == ("--", "fix the bug")


def test_codex_sandbox_option() -> None:
    launch = get_adapter("codex").prepare(make_ctx(sandbox="workspace-write"))
    assert "--dangerously-bypass-approvals-and-sandbox" not in launch.argv
    assert launch.argv[launch.argv.index("--sandbox") + 1] == "workspace-write"
    with pytest.raises(InvalidArgument):
        get_adapter("codex").prepare(make_ctx(sandbox="bogus"))


def test_codex_model_name_is_toml_escaped() -> None:
    ctx = dataclasses.replace(make_ctx(), model='we"ird\\name')
    config = tomllib.loads(str(get_adapter("codex").prepare(ctx).files[".codex/config.toml"]))
    assert config["model"] == 'we"ird\\name'


def test_qwen_code() -> None:
    launch = get_adapter("qwen-code").prepare(make_ctx())
    settings = json.loads(str(launch.files[".qwen/settings.json"]))
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["memory"] == {"enableManagedAutoMemory": False, "enableManagedAutoDream": False}
    assert settings["security"]["auth"]["selectedType"] == "openai"
    # No pty (node-pty drops unread output at exit); test_qwen_code.py checks the preload that makes it whole.
    assert settings["tools"]["shell"]["enableInteractiveShell"] is False
    assert launch.env["OPENAI_BASE_URL"] == "http://127.0.0.1:18080/v1"
    assert launch.env["OPENAI_API_KEY"] == "tok-123"
    assert launch.env["OPENAI_MODEL"] == "polar-model"
    assert launch.argv == ("qwen", "-p", "fix the bug", "--yolo")
    assert "--yolo" not in get_adapter("qwen-code").prepare(make_ctx(yolo=False)).argv


def test_gemini_cli() -> None:
    launch = get_adapter("gemini-cli").prepare(make_ctx())
    settings = json.loads(str(launch.files[".gemini/settings.json"]))
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert launch.env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:18080"
    assert launch.env["GEMINI_API_KEY"] == "tok-123"
    assert launch.env["GEMINI_MODEL"] == "polar-model"
    assert "--skip-trust" in launch.argv
    assert "--yolo" in launch.argv


@pytest.mark.parametrize(
    ("mode", "base_url"),
    [
        ("openai-completions", "http://127.0.0.1:18080/v1"),
        ("openai-responses", "http://127.0.0.1:18080/v1"),
        ("anthropic-messages", "http://127.0.0.1:18080"),
        ("google-generative-ai", "http://127.0.0.1:18080/v1beta"),
    ],
)
def test_pi_provider_modes(mode: str, base_url: str) -> None:
    assert mode in PROVIDER_MODES
    launch = get_adapter("pi").prepare(make_ctx(provider_mode=mode))
    models = json.loads(str(launch.files[".pi/agent/models.json"]))
    provider = models["providers"]["polar"]
    assert provider["api"] == mode
    assert provider["baseUrl"] == base_url
    assert provider["apiKey"] == "tok-123"
    assert provider["models"][0]["id"] == "polar-model"
    assert launch.env["PI_OFFLINE"] == "1"
    assert launch.argv[:5] == ("pi", "--provider", "polar", "--model", "polar-model")
    assert launch.argv[-2:] == ("-p", "fix the bug")


def test_pi_rejects_unknown_mode() -> None:
    with pytest.raises(InvalidArgument, match="provider_mode"):
        get_adapter("pi").prepare(make_ctx(provider_mode="bedrock"))


def test_command_adapter() -> None:
    launch = get_adapter("command").prepare(
        make_ctx(argv=["my-agent", "--task", "{instruction}", "--cwd={workspace}"], files={"a.txt": "x"})
    )
    assert launch.argv == ("my-agent", "--task", "fix the bug", "--cwd=/s/workspace")
    env = launch.env
    assert env["POLAR_SESSION_TOKEN"] == "tok-123"
    assert env["POLAR_OPENAI_BASE_URL"] == "http://127.0.0.1:18080/v1"
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:18080/v1"
    assert env["OPENAI_API_KEY"] == "tok-123"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080"
    assert env["GEMINI_API_KEY"] == "tok-123"
    assert env["POLAR_INSTRUCTION"] == "fix the bug"
    assert launch.files == {"a.txt": "x"}
    with pytest.raises(InvalidArgument):
        get_adapter("command").prepare(make_ctx())
    # A custom program knows which session and sample it is (the sandbox's paths no longer say it).
    ctx = dataclasses.replace(make_ctx(argv=["a"]), session_id="t-0003", sample_index=3)
    env = get_adapter("command").prepare(ctx).env
    assert (env["POLAR_SESSION_ID"], env["POLAR_SAMPLE_INDEX"]) == ("t-0003", "3")


def test_missing_endpoint_is_an_error() -> None:
    ctx = dataclasses.replace(make_ctx(), endpoints=ProxyEndpoints("t", openai_base_url="http://h/v1"))
    with pytest.raises(InvalidArgument, match="Anthropic"):
        get_adapter("claude-code").prepare(ctx)
    assert get_adapter("codex").prepare(ctx).files


def test_rebase_endpoints() -> None:
    rebased = rebase_endpoints(
        ProxyEndpoints("t", "http://0.0.0.0:5000", "http://proxy:5000/v1", ""), "http://127.0.0.1:18080"
    )
    assert rebased == ProxyEndpoints("t", "http://127.0.0.1:18080", "http://127.0.0.1:18080/v1", "")
