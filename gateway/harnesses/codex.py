"""Codex (``@openai/codex``, bin ``codex``): OpenAI Responses only, run as ``codex exec``."""

from __future__ import annotations

import json

from gateway.harnesses.base import (
    HarnessContext,
    HarnessLaunch,
    base_environment,
    finish_environment,
    require,
    string_list,
    with_suffix,
)
from polar_checks.harnesses import HARNESS_OPTIONS, check_options
from polar_core.errors import InvalidArgument

__all__ = ["CodexAdapter"]

_SANDBOXES = ("bypass", "read-only", "workspace-write", "danger-full-access")
_KEY_VAR = "POLAR_API_KEY"


def _toml(value: str) -> str:
    # A JSON string is a valid TOML basic string (same escapes for quotes, backslashes and control characters).
    return json.dumps(value)


class CodexAdapter:
    """Runs ``codex exec`` against the proxy's Responses endpoint, configured through ``$CODEX_HOME``.

    Options:
        sandbox: ``bypass`` (default: no Codex sandbox, the runtime isolates it; Codex's own sandbox needs
            helper binaries outside /tmp) or one of Codex's ``--sandbox`` modes.
        reasoning_effort: ``model_reasoning_effort`` in config.toml.
        context_window: ``model_context_window`` (silences the unknown-model warning's fallback).
    """

    name = "codex"
    option_names = HARNESS_OPTIONS["codex"]
    artifacts = "rollout transcripts under $CODEX_HOME/sessions (JSONL) and $CODEX_HOME/log."

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        sandbox = str(ctx.option("sandbox", "bypass"))
        if sandbox not in _SANDBOXES:
            raise InvalidArgument(f"codex option sandbox must be one of {', '.join(_SANDBOXES)}")
        base_url = with_suffix(require(self.name, ctx.endpoints.openai_base_url, "OpenAI"), "/v1")
        codex_home = ctx.home / ".codex"
        lines = [
            f"model = {_toml(ctx.model)}",
            'model_provider = "polar"',
            "check_for_update_on_startup = false",
            'web_search = "disabled"',
        ]
        if ctx.option("reasoning_effort") is not None:
            lines.append(f"model_reasoning_effort = {_toml(str(ctx.option('reasoning_effort')))}")
        if ctx.option("context_window") is not None:
            lines.append(f"model_context_window = {int(ctx.option('context_window'))}")
        lines += [
            "",
            "[model_providers.polar]",
            'name = "polar"',
            f"base_url = {_toml(base_url)}",
            f"env_key = {_toml(_KEY_VAR)}",
            'wire_api = "responses"',
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[features]",
            "plugins = false",
            "apps = false",
            "",
        ]
        env = base_environment(ctx, self.name)
        env.update({"CODEX_HOME": str(codex_home), _KEY_VAR: ctx.endpoints.token})
        argv = ["codex", "exec", "--skip-git-repo-check", "--color", "never", "--cd", str(ctx.workspace)]
        if sandbox == "bypass":
            argv.append("--dangerously-bypass-approvals-and-sandbox")
        else:
            argv += ["--sandbox", sandbox]
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        # ``--`` so an instruction starting with a dash is not read as a flag.
        argv += ["--", ctx.instruction]
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={".codex/config.toml": "\n".join(lines)},
            log_paths=(codex_home / "sessions", codex_home / "log"),
        )
