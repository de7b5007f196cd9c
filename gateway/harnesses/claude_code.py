"""Claude Code (``@anthropic-ai/claude-code``, bin ``claude``): Anthropic Messages, run as ``claude -p``."""

from __future__ import annotations

import json

from gateway.harnesses.base import (
    HarnessContext,
    HarnessLaunch,
    base_environment,
    finish_environment,
    require,
    string_list,
    without_suffix,
)
from polar_checks.harnesses import HARNESS_OPTIONS, check_options

__all__ = ["ClaudeCodeAdapter"]

_DEFAULT_TOOLS = ("Bash", "Edit", "Read", "Write")


class ClaudeCodeAdapter:
    """Runs ``claude -p INSTRUCTION`` against the proxy's Anthropic endpoint.

    Options:
        allowed_tools: Tools it may use without asking (default ``Bash, Edit, Read, Write``).
        bare: Pass ``--bare`` (3 tools, no system reminders); default false.
        output_format: ``text`` (default), ``json`` or ``stream-json`` (the latter adds ``--verbose``).
        max_turns: ``--max-turns`` limit.
    """

    name = "claude-code"
    option_names = HARNESS_OPTIONS["claude-code"]
    artifacts = "session transcripts under $HOME/.claude/projects (JSONL)."

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        tools = string_list(self.name, "allowed_tools", ctx.option("allowed_tools", list(_DEFAULT_TOOLS)))
        output_format = str(ctx.option("output_format", "text"))
        config_dir = ctx.home / ".claude"
        env = base_environment(ctx, self.name)
        env.update(
            {
                # The SDK appends /v1/messages itself and keeps any other path prefix.
                "ANTHROPIC_BASE_URL": without_suffix(
                    require(self.name, ctx.endpoints.anthropic_base_url, "Anthropic"), "/v1"
                ),
                "ANTHROPIC_API_KEY": ctx.endpoints.token,
                "ANTHROPIC_MODEL": ctx.model,
                # Background calls (titles, summaries) must ask for the same model, not a Haiku we do not serve.
                "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
                "ANTHROPIC_DEFAULT_SONNET_MODEL": ctx.model,
                "ANTHROPIC_DEFAULT_OPUS_MODEL": ctx.model,
                "CLAUDE_CONFIG_DIR": str(config_dir),
                # Without this it still resolves and calls statsig/sentry/update hosts; telemetry flags alone
                # are not enough (harness-facts.md).
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_AUTOUPDATER": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_BUG_COMMAND": "1",
                "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
            }
        )
        argv = ["claude", "-p", ctx.instruction, "--model", ctx.model, "--output-format", output_format]
        if output_format == "stream-json":
            argv.append("--verbose")
        if tools:
            argv += ["--allowedTools", ",".join(tools)]
        if ctx.option("bare", False):
            argv.append("--bare")
        if ctx.option("max_turns") is not None:
            argv += ["--max-turns", str(int(ctx.option("max_turns")))]
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        settings = {"includeCoAuthoredBy": False, "cleanupPeriodDays": 1}
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={".claude/settings.json": json.dumps(settings, indent=2) + "\n"},
            log_paths=(config_dir / "projects",),
        )
