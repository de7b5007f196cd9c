"""Cline CLI (``cline``, bin ``cline``): OpenAI Chat Completions through its ``openai-compatible`` provider.

Run headless as ``cline -P openai-compatible -m M --auto-approve true -c WS INSTRUCTION`` (a prompt on the
command line runs one task in act mode and exits). The provider, its base URL and key are in
``~/.cline/data/settings/providers.json`` (what ``cline auth -p openai-compatible -b URL -k KEY`` writes);
``global-settings.json`` opts out of telemetry and auto-update.
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

__all__ = ["ClineAdapter"]

_PROVIDER = "openai-compatible"


class ClineAdapter:
    """Runs the Cline CLI once in act mode against the proxy's Chat Completions endpoint.

    Options:
        auto_approve: ``--auto-approve`` (default true; headless Cline otherwise waits for approval).
        retries: ``--retries``, consecutive mistakes before it gives up (Cline's default 6).
        compaction: ``--compaction``: ``agentic`` (Cline's default), ``basic`` or ``off`` (default ``off``:
            compaction is an extra model call that rewrites the history, which breaks prefix merging).
        json: ``--json``: print messages as JSON lines instead of styled text (default false).
    """

    name = "cline"
    option_names = HARNESS_OPTIONS["cline"]
    artifacts = "sessions, logs and settings under $HOME/.cline/data."

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        providers = {
            "version": 1,
            "lastUsedProvider": _PROVIDER,
            "modes": {},
            "providers": {
                _PROVIDER: {
                    "settings": {
                        "provider": _PROVIDER,
                        "apiKey": ctx.endpoints.token,
                        "model": ctx.model,
                        "baseUrl": with_suffix(require(self.name, ctx.endpoints.openai_base_url, "OpenAI"), "/v1"),
                    },
                    # Without a timestamp Cline treats the entry as invalid and falls back to its own provider.
                    "updatedAt": "2026-01-01T00:00:00.000Z",
                    "tokenSource": "manual",
                }
            },
        }
        settings = {"telemetryOptOut": True, "autoUpdateEnabled": False}
        data = ctx.home / ".cline" / "data"
        env = base_environment(ctx, self.name)
        env.update({"CLINE_DIR": str(ctx.home / ".cline"), "CLINE_NO_AUTO_UPDATE": "1", "CLINE_NO_INTERACTIVE": "1"})
        auto = "true" if ctx.option("auto_approve", True) else "false"
        argv = ["cline", "-P", _PROVIDER, "-m", ctx.model, "--auto-approve", auto, "-c", str(ctx.workspace)]
        argv += ["--compaction", str(ctx.option("compaction", "off"))]
        if ctx.option("retries") is not None:
            argv += ["--retries", str(int(ctx.option("retries")))]
        if ctx.option("json", False):
            argv.append("--json")
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        argv += ["--", ctx.instruction]
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={
                ".cline/data/settings/providers.json": json.dumps(providers, indent=2) + "\n",
                ".cline/data/settings/global-settings.json": json.dumps(settings, indent=2) + "\n",
            },
            log_paths=(data,),
        )
