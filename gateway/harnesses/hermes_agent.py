"""Hermes Agent (NousResearch, PyPI ``hermes-agent``): OpenAI Chat Completions, run as ``hermes -z``.

``hermes -z PROMPT`` is Hermes's one-shot mode: no banner, no update check, tool approvals bypassed, only the
final answer on stdout. The endpoint is Hermes's ``custom`` provider, configured in ``$HERMES_HOME/config.yaml``
(``model.provider: custom``, ``model.base_url``, ``model.api_key``); Hermes reads endpoint URLs from that file only.
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
from gateway.harnesses.pyvenv import venv_python
from polar_checks.harnesses import HARNESS_OPTIONS, check_options

__all__ = ["HermesAgentAdapter"]

VENV = "hermes-agent"
DEFAULT_CONTEXT_WINDOW = 131072


class HermesAgentAdapter:
    """Runs ``python -m hermes_cli.main --oneshot=INSTRUCTION --provider custom --model M`` from its own environment.

    Options:
        toolsets: Hermes toolsets to enable (a list, e.g. ``["terminal", "file"]``; default: Hermes's own
            ``cli`` platform set).
        max_turns: ``agent.max_turns`` (model calls per run; Hermes's default is 90).
        context_window: ``model.context_length`` (default 131072; Hermes would otherwise ask the endpoint's and
            OpenRouter's model lists).
    """

    name = "hermes-agent"
    option_names = HARNESS_OPTIONS["hermes-agent"]
    artifacts = "the session database, logs and trajectories under $HOME/.hermes."

    def _config(self, ctx: HarnessContext) -> dict[str, object]:
        model: dict[str, object] = {
            "default": ctx.model,
            "provider": "custom",
            "base_url": with_suffix(require(self.name, ctx.endpoints.openai_base_url, "OpenAI"), "/v1"),
            "api_key": ctx.endpoints.token,
            # Given, Hermes does not probe the endpoint's and OpenRouter's model lists for it.
            "context_length": int(ctx.option("context_window", DEFAULT_CONTEXT_WINDOW)),
        }
        agent: dict[str, object] = {}
        if ctx.option("max_turns") is not None:
            agent["max_turns"] = int(ctx.option("max_turns"))
        config: dict[str, object] = {
            "model": model,
            "terminal": {"backend": "local", "cwd": str(ctx.workspace)},
            # Otherwise a missing optional package is pip-installed at run time (from PyPI).
            "security": {"allow_lazy_installs": False},
        }
        if agent:
            config["agent"] = agent
        return config

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        toolsets = string_list(self.name, "toolsets", ctx.option("toolsets"))
        hermes_home = ctx.home / ".hermes"
        env = base_environment(ctx, self.name)
        env["HERMES_HOME"] = str(hermes_home)
        python = venv_python(ctx, VENV, fallback="")
        argv = [python, "-m", "hermes_cli.main"] if python else ["hermes"]
        # ``--oneshot=`` so an instruction starting with a dash is not read as a flag.
        argv += [f"--oneshot={ctx.instruction}", "--provider", "custom", "--model", ctx.model]
        if toolsets:
            argv += ["--toolsets", ",".join(toolsets)]
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        # JSON is YAML: config.yaml needs no YAML writer.
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={".hermes/config.yaml": json.dumps(self._config(ctx), indent=2) + "\n"},
            log_paths=(hermes_home,),
        )
