"""Gemini CLI (``@google/gemini-cli``, bin ``gemini``): Google generateContent (SSE), run as ``gemini -p``."""

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

__all__ = ["GeminiCliAdapter"]


class GeminiCliAdapter:
    """Runs ``gemini --skip-trust -p INSTRUCTION`` against the proxy's Google endpoint.

    Options:
        yolo: Pass ``--yolo`` so shell and write tools run without approval (default true).
    """

    name = "gemini-cli"
    option_names = HARNESS_OPTIONS["gemini-cli"]
    artifacts = "chat checkpoints and logs under $HOME/.gemini/tmp."

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        settings = {
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "security": {"auth": {"selectedType": "gemini-api-key"}},
        }
        env = base_environment(ctx, self.name)
        env.update(
            {
                # The SDK appends /v1beta itself.
                "GOOGLE_GEMINI_BASE_URL": without_suffix(
                    require(self.name, ctx.endpoints.google_base_url, "Google"), "/v1beta"
                ),
                "GEMINI_API_KEY": ctx.endpoints.token,
                "GEMINI_MODEL": ctx.model,
            }
        )
        argv = ["gemini", "--skip-trust", "--model", ctx.model, "-p", ctx.instruction]
        if ctx.option("yolo", True):
            argv.append("--yolo")
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={".gemini/settings.json": json.dumps(settings, indent=2) + "\n"},
            log_paths=(ctx.home / ".gemini" / "tmp",),
        )
