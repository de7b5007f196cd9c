"""The opencode and Cline adapters: what they write below HOME, their environment and argv."""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from gateway.harnesses import HarnessContext, ProxyEndpoints, get_adapter

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
