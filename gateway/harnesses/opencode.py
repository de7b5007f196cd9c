"""opencode (``opencode-ai``, bin ``opencode``): OpenAI Chat Completions through ``@ai-sdk/openai-compatible``.

Run as ``opencode run --auto``; the proxy is a custom provider in ``~/.config/opencode/opencode.json``. opencode
bundles that provider package, so nothing is installed at run time; its models.dev catalogue fetch, auto-update,
sharing, LSP downloads and plugin installs are switched off.
"""

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

__all__ = ["OpencodeAdapter"]

_PROVIDER = "polar"


class OpencodeAdapter:
    """Runs ``opencode run --model polar/M --auto INSTRUCTION`` with a provider ``polar`` naming the proxy.

    Options:
        agent: opencode's ``--agent`` (default: its ``build`` agent, which has the shell and edit tools).
        context_window: ``limit.context`` of the model entry (default 128000).
        max_tokens: ``limit.output`` of the model entry (default 16384).
        auto: Pass ``--auto`` so tool permissions are granted without asking (default true; headless opencode
            otherwise refuses every tool that would ask).
    """

    name = "opencode"
    option_names = HARNESS_OPTIONS["opencode"]
    artifacts = "sessions and messages under $HOME/.local/share/opencode (SQLite) and its logs in .../log."

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        limit = {
            "context": int(ctx.option("context_window", 128_000)),
            "output": int(ctx.option("max_tokens", 16_384)),
        }
        config = {
            "$schema": "https://opencode.ai/config.json",
            "model": f"{_PROVIDER}/{ctx.model}",
            "small_model": f"{_PROVIDER}/{ctx.model}",
            "share": "disabled",
            "autoupdate": False,
            "provider": {
                _PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Polar",
                    "options": {
                        "baseURL": with_suffix(require(self.name, ctx.endpoints.openai_base_url, "OpenAI"), "/v1"),
                        "apiKey": ctx.endpoints.token,
                    },
                    "models": {ctx.model: {"name": ctx.model, "tool_call": True, "limit": limit}},
                }
            },
            "enabled_providers": [_PROVIDER],
            "lsp": False,
            "formatter": False,
        }
        env = base_environment(ctx, self.name)
        env.update(
            {
                "XDG_CONFIG_HOME": str(ctx.home / ".config"),
                "XDG_DATA_HOME": str(ctx.home / ".local" / "share"),
                "XDG_CACHE_HOME": str(ctx.home / ".cache"),
                "XDG_STATE_HOME": str(ctx.home / ".local" / "state"),
                "OPENCODE_DISABLE_AUTOUPDATE": "1",
                "OPENCODE_DISABLE_MODELS_FETCH": "1",
                "OPENCODE_DISABLE_SHARE": "1",
                "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
                "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
                "OPENCODE_DISABLE_CLAUDE_CODE": "1",
                "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
            }
        )
        argv = ["opencode", "run", "--model", f"{_PROVIDER}/{ctx.model}", "--pure", "--title", "polar"]
        if ctx.option("auto", True):
            argv.append("--auto")
        if ctx.option("agent") is not None:
            argv += ["--agent", str(ctx.option("agent"))]
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        argv += ["--", ctx.instruction]
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={".config/opencode/opencode.json": json.dumps(config, indent=2) + "\n"},
            log_paths=(ctx.home / ".local" / "share" / "opencode",),
        )
