"""OpenHands (PyPI ``openhands-sdk`` + ``openhands-tools``): the SDK's agent, run by a program Polar ships.

OpenHands has no one-shot CLI in the SDK; ``gateway/harnesses/programs/openhands_agent.py`` builds the SDK's
own ``Agent`` with its terminal, file-editor and task-tracker tools over a local workspace (no remote runtime,
no browser) and runs one conversation. The adapter writes that program and its JSON configuration below the
session's HOME and starts it with the ``openhands`` environment's interpreter. The model is reached through
LiteLLM as ``openai/<model>`` at the proxy's Chat Completions endpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from gateway.harnesses.base import (
    HarnessContext,
    HarnessLaunch,
    base_environment,
    finish_environment,
    require,
    string_list,
    with_suffix,
)
from gateway.harnesses.pyvenv import venv_python
from polar_checks.harnesses import HARNESS_OPTIONS, check_options
from polar_core.errors import InvalidArgument

__all__ = ["TOOLS", "OpenHandsAdapter"]

VENV = "openhands"
TOOLS = ("terminal", "file_editor", "task_tracker")
_PROGRAM = ".polar/openhands_agent.py"
_CONFIG = ".polar/openhands.json"


def program_source() -> str:
    """The agent program's source (shipped in ``gateway.harnesses.programs``)."""
    return (Path(__file__).parent / "programs" / "openhands_agent.py").read_text()


class OpenHandsAdapter:
    """Runs ``python ~/.polar/openhands_agent.py ~/.polar/openhands.json`` from the ``openhands`` environment.

    Options:
        tools: Which of the SDK's tools to give the agent (default all of ``terminal``, ``file_editor``,
            ``task_tracker``).
        max_iterations: The conversation's ``max_iteration_per_run`` (default 100).
        context_window: The LLM's ``max_input_tokens`` (default 131072; known, so no model-metadata lookup).
        max_output_tokens: The LLM's ``max_output_tokens`` (default 8192).
    """

    name = "openhands"
    option_names = HARNESS_OPTIONS["openhands"]
    artifacts = "the conversation's events (JSON) under $HOME/.openhands/conversations."

    def _config(self, ctx: HarnessContext) -> dict[str, object]:
        tools = string_list(self.name, "tools", ctx.option("tools")) or list(TOOLS)
        unknown = sorted(set(tools) - set(TOOLS))
        if unknown:
            raise InvalidArgument(
                f"openhands option tools: unknown tool(s) {', '.join(unknown)}; known: {', '.join(TOOLS)}",
                details={"harness": self.name},
            )
        return {
            "instruction": ctx.instruction,
            "model": ctx.model,
            "base_url": with_suffix(require(self.name, ctx.endpoints.openai_base_url, "OpenAI"), "/v1"),
            "api_key": ctx.endpoints.token,
            "workspace": str(ctx.workspace),
            "persistence_dir": str(ctx.home / ".openhands" / "conversations"),
            "tools": tools,
            "max_iterations": int(ctx.option("max_iterations", 100)),
            "max_input_tokens": int(ctx.option("context_window", 131072)),
            "max_output_tokens": int(ctx.option("max_output_tokens", 8192)),
        }

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        config = self._config(ctx)
        env = base_environment(ctx, self.name)
        env.update(
            {
                "OPENHANDS_SUPPRESS_BANNER": "1",
                # LiteLLM: the bundled model-cost map instead of fetching it; no telemetry.
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_TELEMETRY": "False",
                # No Hugging Face Hub look-ups for tokenizers.
                "HF_HUB_OFFLINE": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        if string_list(self.name, "extra_args", ctx.option("extra_args")):
            raise InvalidArgument(
                "openhands takes no extra_args (its program reads only its configuration file)",
                details={"harness": self.name},
            )
        argv = [venv_python(ctx, VENV), str(ctx.home / _PROGRAM), str(ctx.home / _CONFIG)]
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={_PROGRAM: program_source(), _CONFIG: json.dumps(config, indent=2) + "\n"},
            log_paths=(ctx.home / ".openhands",),
        )
