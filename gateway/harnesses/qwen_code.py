"""Qwen Code (``@qwen-code/qwen-code``, bin ``qwen``): OpenAI Chat Completions, run as ``qwen -p``."""

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
from gateway.harnesses.qwen_shell_drain import PRELOAD_NAME, PRELOAD_SOURCE
from polar_checks.harnesses import HARNESS_OPTIONS, check_options

__all__ = ["QwenCodeAdapter"]

# Loaded into the CLI with NODE_OPTIONS: it holds a shell command's "exit" until its output is read.
_PRELOAD = f".polar/{PRELOAD_NAME}"


class QwenCodeAdapter:
    """Runs ``qwen -p INSTRUCTION`` against the proxy's Chat Completions endpoint.

    Options:
        yolo: Pass ``--yolo`` so write and shell tools run without approval (default true; without it the
            headless CLI has no write or shell tools).
        max_session_turns: ``model.maxSessionTurns`` in settings.json.
    """

    name = "qwen-code"
    option_names = HARNESS_OPTIONS["qwen-code"]
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
            # Shell commands through child_process (its headless default, stated): node-pty on Linux drops the
            # output it has not read when the command exits, cutting results at ~8 KB. child_process's own race
            # (the result settled at "exit", before the pipes were read) is closed by the preload below.
            "tools": {"shell": {"enableInteractiveShell": False}},
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
        env = finish_environment(env, ctx, self.name)
        # After the task's env option, so a task's own NODE_OPTIONS is kept (the preload removes only itself).
        preload = f"--require={json.dumps(str(ctx.home / _PRELOAD), ensure_ascii=False)}"
        env["NODE_OPTIONS"] = f"{preload} {env['NODE_OPTIONS']}" if env.get("NODE_OPTIONS") else preload
        return HarnessLaunch(
            argv=tuple(argv),
            env=env,
            cwd=ctx.workspace,
            files={".qwen/settings.json": json.dumps(settings, indent=2) + "\n", _PRELOAD: PRELOAD_SOURCE},
            log_paths=(ctx.home / ".qwen",),
        )
