"""mini-swe-agent (PyPI ``mini-swe-agent``, ``mini``): one ``bash`` tool over LiteLLM's OpenAI Chat Completions.

mini-swe-agent keeps its whole state in an append-only message list (system, task, then each assistant turn
and its tool result), so a prefix-merged trace of a session is exact. The task ends when the model runs
``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (the lines after it are the submission); a reply without a tool
call is answered with a format-error message and the agent goes on.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.harnesses.base import (
    HarnessContext,
    HarnessLaunch,
    base_environment,
    finish_environment,
    require,
    string_list,
    with_suffix,
)
from gateway.harnesses.python_agents import LITELLM_OFFLINE_ENV, venv_python
from polar_checks.harnesses import HARNESS_OPTIONS, check_options
from polar_core.errors import InvalidArgument

__all__ = ["MiniSweAgentAdapter"]

_CONFIG_DIR = ".config/mini-swe-agent"


def _int_option(ctx: HarnessContext, key: str, default: int, harness: str) -> int:
    value = ctx.option(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(
            f"option {key!r} of harness {harness!r} must be a non-negative integer",
            details={"harness": harness, "field": key},
        )
    return value


def _registry(model: str) -> dict[str, Any]:
    # LiteLLM's entry for the model: known, so LiteLLM prints no "Provider List" banner on every call, and free.
    return {
        f"openai/{model}": {
            "litellm_provider": "openai",
            "mode": "chat",
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
        }
    }


class MiniSweAgentAdapter:
    """Runs ``python -m minisweagent.run.mini -y --exit-immediately -t INSTRUCTION`` against the proxy.

    The model is LiteLLM's ``openai/<model>`` with ``api_base`` the proxy's ``/v1`` (written to a config file
    under ``HOME`` that is merged over mini's own ``mini.yaml``), cost tracking off (the model has no price).

    Options:
        config: mini's builtin config (``mini.yaml``, default) or a path in the runtime that the Polar part is
            merged over.
        step_limit: ``agent.step_limit``, the most model calls (default 0: no limit but the session timeout).
        command_timeout: ``environment.timeout``, seconds one bash command may run (default 120).
        venv: The virtual environment to run from (default ``.harnesses/py/mini-swe-agent``).
    """

    name = "mini-swe-agent"
    option_names = HARNESS_OPTIONS["mini-swe-agent"]
    artifacts = "the trajectory (every message, JSON) at $HOME/.config/mini-swe-agent/trajectory.traj.json."

    def _config(self, ctx: HarnessContext) -> dict[str, Any]:
        base_url = with_suffix(require(self.name, ctx.endpoints.openai_base_url, "OpenAI"), "/v1")
        return {
            "agent": {
                "mode": "yolo",
                "confirm_exit": False,
                "step_limit": _int_option(ctx, "step_limit", 0, self.name),
                "cost_limit": 0,
            },
            "environment": {
                "environment_class": "local",
                "cwd": str(ctx.workspace),
                "timeout": _int_option(ctx, "command_timeout", 120, self.name),
            },
            "model": {
                "model_class": "litellm",
                "model_name": f"openai/{ctx.model}",
                "cost_tracking": "ignore_errors",
                "litellm_model_registry": str(ctx.home / _CONFIG_DIR / "model_registry.json"),
                "model_kwargs": {"api_base": base_url, "api_key": ctx.endpoints.token, "drop_params": True},
            },
        }

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        base_config = ctx.option("config", "mini.yaml")
        if not isinstance(base_config, str) or not base_config:
            raise InvalidArgument(
                f"option 'config' of harness {self.name!r} must be a config name or path",
                details={"harness": self.name, "field": "config"},
            )
        config_dir = ctx.home / _CONFIG_DIR
        env = base_environment(ctx, self.name)
        env.update(LITELLM_OFFLINE_ENV)
        env.update(
            {
                # Skip the first-run questionnaire and the banner; keep mini's .env and trajectory under HOME.
                "MSWEA_CONFIGURED": "true",
                "MSWEA_SILENT_STARTUP": "1",
                "MSWEA_GLOBAL_CONFIG_DIR": str(config_dir),
                "MSWEA_COST_TRACKING": "ignore_errors",
            }
        )
        python = venv_python(ctx, self.name, "mini-swe-agent", "python3")
        argv = [python, "-m", "minisweagent.run.mini", "-c", base_config, "-c", str(config_dir / "polar.yaml")]
        trajectory = config_dir / "trajectory.traj.json"
        # The command line's output path wins over any config file's (mini's -o has a default).
        argv += ["-y", "--exit-immediately", "-o", str(trajectory)]
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        # One argument, so an instruction that looks like an option ("--help") is still the task.
        argv.append(f"--task={ctx.instruction}")
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            # JSON is YAML: mini reads this with yaml.safe_load.
            files={
                f"{_CONFIG_DIR}/polar.yaml": json.dumps(self._config(ctx), indent=2) + "\n",
                f"{_CONFIG_DIR}/model_registry.json": json.dumps(_registry(ctx.model), indent=2) + "\n",
            },
            log_paths=(trajectory,),
        )
