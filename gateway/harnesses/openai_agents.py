"""The OpenAI Agents SDK (PyPI ``openai-agents``) as a harness: Polar's small agent program on the SDK.

The SDK is a library, not a CLI, so Polar ships the agent: ``gateway/harnesses/programs/openai_agents_agent.py``
(one ``Agent`` with a ``shell`` function tool, run by ``Runner.run`` to a final answer). The adapter copies it
into the session's ``HOME`` with a JSON config and starts it with the ``openai-agents`` venv's Python. It speaks
the SDK's default Responses API or, with option ``api: chat_completions``, Chat Completions.
"""

from __future__ import annotations

import json
from importlib import resources

from gateway.harnesses.base import (
    HarnessContext,
    HarnessLaunch,
    base_environment,
    finish_environment,
    require,
    string_list,
    with_suffix,
)
from gateway.harnesses.python_agents import venv_python
from polar_checks.harnesses import HARNESS_OPTIONS, check_options
from polar_core.errors import InvalidArgument

__all__ = ["OPENAI_AGENTS_APIS", "OpenAIAgentsAdapter"]

OPENAI_AGENTS_APIS = ("responses", "chat_completions")
_DIR = ".polar-openai-agents"
_PROGRAM = "openai_agents_agent.py"


def _program_source() -> str:
    # Packaged with Polar (gateway.harnesses.programs); read, not imported: it needs the SDK's venv.
    return resources.files("gateway.harnesses.programs").joinpath(_PROGRAM).read_text(encoding="utf-8")


def _positive(ctx: HarnessContext, key: str, default: int) -> int:
    value = ctx.option(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgument(
            f"option {key!r} of harness 'openai-agents' must be a positive integer",
            details={"harness": "openai-agents", "field": key},
        )
    return value


class OpenAIAgentsAdapter:
    """Runs ``python openai_agents_agent.py CONFIG [EXTRA_ARGS] -- INSTRUCTION`` from the ``openai-agents`` venv.

    ``extra_args`` may be the program's flags (``--temperature T``, ``--max-turns N``, ``--api API``).

    Options:
        api: ``responses`` (default, the SDK's default model class) or ``chat_completions``.
        max_turns: ``Runner.run(max_turns=...)``, the most model calls (default 50).
        command_timeout: Seconds one shell command may run (default 120).
        venv: The virtual environment to run from (default ``.harnesses/py/openai-agents``).
    """

    name = "openai-agents"
    option_names = HARNESS_OPTIONS["openai-agents"]
    artifacts = "the run's items (the SDK's input list, JSON) at $HOME/.polar-openai-agents/transcript.json."

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        api = ctx.option("api", "responses")
        if api not in OPENAI_AGENTS_APIS:
            raise InvalidArgument(
                f"option 'api' of harness {self.name!r} must be one of {', '.join(OPENAI_AGENTS_APIS)}, not {api!r}",
                details={"harness": self.name, "field": "api"},
            )
        home_dir = ctx.home / _DIR
        config = {
            "base_url": with_suffix(require(self.name, ctx.endpoints.openai_base_url, "OpenAI"), "/v1"),
            "api": api,
            "model": ctx.model,
            "workspace": str(ctx.workspace),
            "max_turns": _positive(ctx, "max_turns", 50),
            "command_timeout": _positive(ctx, "command_timeout", 120),
            "transcript": str(home_dir / "transcript.json"),
        }
        env = base_environment(ctx, self.name)
        env.update({"OPENAI_API_KEY": ctx.endpoints.token, "OPENAI_AGENTS_DISABLE_TRACING": "1"})
        python = venv_python(ctx, self.name, "openai-agents", "python3")
        argv = [python, str(home_dir / _PROGRAM), str(home_dir / "config.json")]
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        argv += ["--", ctx.instruction]
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={
                f"{_DIR}/{_PROGRAM}": _program_source(),
                f"{_DIR}/config.json": json.dumps(config, indent=2) + "\n",
            },
            log_paths=(home_dir / "transcript.json",),
        )
