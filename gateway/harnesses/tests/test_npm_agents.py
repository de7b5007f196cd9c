"""The opencode, Cline and Continue CLI adapters: what they write below HOME, their environment and argv."""

from __future__ import annotations

import json
from pathlib import PurePosixPath

import pytest

from gateway.harnesses import HarnessContext, ProxyEndpoints, get_adapter
from polar_core.errors import InvalidArgument

_ENDPOINTS = ProxyEndpoints(
    token="tok", anthropic_base_url="http://p:1", openai_base_url="http://p:1", google_base_url="http://p:1"
)


def _context(**options: object) -> HarnessContext:
    root = PurePosixPath("/s")
    return HarnessContext(
        home=root / "home", workspace=root / "ws", tmp=root / "tmp", instruction="Fix it.", endpoints=_ENDPOINTS,
        model="m1", options=options,
    )  # fmt: skip


def test_opencode_names_the_proxy_and_switches_off_fetches_and_sharing() -> None:
    launch = get_adapter("opencode").prepare(_context(max_tokens=64, env={"X": "1"}))
    config = json.loads(str(launch.files[".config/opencode/opencode.json"]))
    provider = config["provider"]["polar"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://p:1/v1", "apiKey": "tok"}
    assert provider["models"]["m1"]["limit"]["output"] == 64
    assert (config["model"], config["share"], config["autoupdate"]) == ("polar/m1", "disabled", False)
    assert config["enabled_providers"] == ["polar"]
    for key in ("OPENCODE_DISABLE_AUTOUPDATE", "OPENCODE_DISABLE_MODELS_FETCH", "OPENCODE_DISABLE_LSP_DOWNLOAD"):
        assert launch.env[key] == "1"
    assert launch.env["XDG_CONFIG_HOME"] == "/s/home/.config"
    assert launch.env["X"] == "1"
    assert launch.argv[:2] == ("opencode", "run")
    assert "--auto" in launch.argv
    assert launch.argv[-2:] == ("--", "Fix it.")


def test_cline_writes_a_provider_entry_it_accepts_and_opts_out_of_telemetry() -> None:
    launch = get_adapter("cline").prepare(_context(retries=2))
    providers = json.loads(str(launch.files[".cline/data/settings/providers.json"]))
    entry = providers["providers"]["openai-compatible"]
    assert entry["settings"] == {
        "provider": "openai-compatible", "apiKey": "tok", "model": "m1", "baseUrl": "http://p:1/v1",
    }  # fmt: skip
    assert entry["updatedAt"]  # without it Cline drops the entry and uses its own cloud provider
    assert providers["lastUsedProvider"] == "openai-compatible"
    settings = json.loads(str(launch.files[".cline/data/settings/global-settings.json"]))
    assert settings == {"telemetryOptOut": True, "autoUpdateEnabled": False}
    assert launch.env["CLINE_NO_AUTO_UPDATE"] == "1"
    argv = list(launch.argv)
    assert argv[argv.index("-P") + 1] == "openai-compatible"
    assert argv[argv.index("--retries") + 1] == "2"
    assert argv[argv.index("--compaction") + 1] == "off"
    assert argv[-2:] == ["--", "Fix it."]


def test_continue_names_the_proxy_in_a_local_config_and_switches_off_telemetry_and_updates() -> None:
    launch = get_adapter("continue").prepare(_context(max_tokens=64, format="json", env={"X": "1"}))
    config = json.loads(str(launch.files[".continue/config.yaml"]))  # JSON is YAML; Continue parses it as such
    (model,) = config["models"]
    assert (model["provider"], model["model"], model["apiBase"], model["apiKey"]) == (
        "openai", "m1", "http://p:1/v1", "tok",
    )  # fmt: skip
    assert "chat" in model["roles"]
    assert "tool_use" in model["capabilities"]
    assert model["defaultCompletionOptions"] == {"contextLength": 128_000, "maxTokens": 64}
    shared = json.loads(str(launch.files[".continue/index/globalContext.json"]))
    assert shared == {"autoUpdateCli": False, "sharedConfig": {"allowAnonymousTelemetry": False}}
    assert launch.env["CONTINUE_GLOBAL_DIR"] == "/s/home/.continue"
    assert launch.env["CONTINUE_METRICS_ENABLED"] == launch.env["CONTINUE_CLI_ENABLE_TELEMETRY"] == "0"
    assert launch.env["X"] == "1"
    argv = list(launch.argv)
    assert argv[:2] == ["cn", "-p"]
    assert argv[argv.index("--config") + 1] == "/s/home/.continue/config.yaml"  # a file: no hub, no sign-in
    assert argv[argv.index("--format") + 1] == "json"
    assert "--auto" in argv
    assert argv[-2:] == ["--", "Fix it."]


def test_continue_without_auto_asks_and_refuses_unknown_options_and_formats() -> None:
    adapter = get_adapter("continue")
    assert "--auto" not in adapter.prepare(_context(auto=False)).argv
    with pytest.raises(InvalidArgument, match="model_name"):
        adapter.prepare(_context(model_name="x"))
    with pytest.raises(InvalidArgument, match=r"harness\.format") as caught:
        adapter.prepare(_context(format="yaml"))
    assert caught.value.details["field"] == "harness.format"


def test_continue_preloads_the_vendor_block_and_refuses_verbose() -> None:
    adapter = get_adapter("continue")
    launch = adapter.prepare(_context())
    assert launch.env["NODE_OPTIONS"] == '--require "/s/home/.polar/continue-offline.cjs"'
    assert "continue.dev" in str(launch.files[".polar/continue-offline.cjs"])
    # A task's own NODE_OPTIONS comes after the preload, not instead of it.
    both = adapter.prepare(_context(env={"NODE_OPTIONS": "--max-old-space-size=512"})).env["NODE_OPTIONS"]
    assert both == '--require "/s/home/.polar/continue-offline.cjs" --max-old-space-size=512'
    assert "--readonly" in adapter.prepare(_context(extra_args=["--readonly"])).argv
    for verbose in ("--verbose", "--verbose=true"):
        with pytest.raises(InvalidArgument, match="session token") as caught:
            adapter.prepare(_context(extra_args=[verbose]))
        assert caught.value.details["field"] == "harness.extra_args"
