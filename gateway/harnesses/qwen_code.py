"""Qwen Code (``@qwen-code/qwen-code``, bin ``qwen``): OpenAI Chat Completions, run as ``qwen -p``."""

from __future__ import annotations

import json

from gateway.harnesses.base import (
    HarnessContext,
    HarnessLaunch,
    base_environment,
    check_options,
    finish_environment,
    require,
    string_list,
    with_suffix,
)

__all__ = ["QwenCodeAdapter"]

_OPTIONS = ("yolo", "max_session_turns")


class QwenCodeAdapter:
    """Runs ``qwen -p INSTRUCTION`` against the proxy's Chat Completions endpoint.

    Options:
        yolo: Pass ``--yolo`` so write and shell tools run without approval (default true; without it the
            headless CLI has no write or shell tools).
        max_session_turns: ``model.maxSessionTurns`` in settings.json.
    """

    name = "qwen-code"
    option_names = frozenset(_OPTIONS)
    artifacts = "chat logs and debug output under $HOME/.qwen."

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        settings: dict[str, object] = {
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False},
            # Otherwise it makes an extra "memory extraction" completion after the answer.
            "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
            "security": {"auth": {"selectedType": "openai"}},
            # Headless Qwen Code otherwise runs shell commands through child_process and takes their output at
            # the child's "exit" event, before Node has necessarily read the pipes (it waits for "close" only
            # when streaming): on a loaded machine the tool result then says "Output: (empty)". Its node-pty
            # path collects every byte until the pty closes (and falls back to child_process without a pty).
            "tools": {"shell": {"enableInteractiveShell": True}},
        }
        if ctx.option("max_session_turns") is not None:
            settings["model"] = {"maxSessionTurns": int(ctx.option("max_session_turns"))}
        env = base_environment(ctx, self.name)
        env.update(
            {
                "OPENAI_BASE_URL": with_suffix(require(self.name, ctx.endpoints.openai_base_url, "OpenAI"), "/v1"),
                "OPENAI_API_KEY": ctx.endpoints.token,
                "OPENAI_MODEL": ctx.model,
                "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
            }
        )
        argv = ["qwen", "-p", ctx.instruction]
        if ctx.option("yolo", True):
            argv.append("--yolo")
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={".qwen/settings.json": json.dumps(settings, indent=2) + "\n"},
            log_paths=(ctx.home / ".qwen",),
        )
