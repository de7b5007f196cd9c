# mypy: allow-untyped-decorators
"""A coding agent on the OpenAI Agents SDK: one ``shell`` function tool, run to completion on one instruction.

Polar runs this file (copied into the session's ``HOME`` by :mod:`gateway.harnesses.openai_agents`) with the
Python of the ``openai-agents`` virtual environment, not inside Polar: it imports only the SDK and the standard
library. Usage::

    python openai_agents_agent.py CONFIG.json [--max-turns N] [--api API] [--temperature T] -- INSTRUCTION

``CONFIG.json`` holds ``base_url`` (the proxy's OpenAI ``/v1``), ``api`` (``chat_completions`` or
``responses``), ``model``, ``workspace``, ``max_turns``, ``command_timeout`` and ``transcript`` (where the run's
items are written as JSON); the flags override the config's values; the key is ``OPENAI_API_KEY``. The SDK's
tracing export (to OpenAI) is off. The final answer goes to stdout; the exit status is 0 when the agent
finished, 1 when it failed (the error on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agents import (  # type: ignore[import-not-found]  # the SDK lives in its own venv, not Polar's
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

INSTRUCTIONS = (
    "You are a coding agent working in a git repository, the current directory. Use the shell tool to inspect "
    "files, run commands and change files until the task is done. When you are finished, reply with a short "
    "summary of what you did, without calling a tool."
)
# The most characters of a command's output the model is shown: the last ones, after a line that says how
# many came before them (a silent cut would show the model a different command output than the shell's).
_OUTPUT_LIMIT = 20_000


def _clip(output: str) -> str:
    if len(output) <= _OUTPUT_LIMIT:
        return output
    notice = f"[output truncated: the first {len(output) - _OUTPUT_LIMIT} of {len(output)} characters are not shown]"
    return f"{notice}\n{output[-_OUTPUT_LIMIT:]}"


def _shell_tool(workspace: str, timeout_s: float) -> Any:
    @function_tool
    def shell(command: str) -> str:
        """Run a bash command in the repository and return its exit status and combined output.

        Args:
            command: The command line, run with `bash -c` in the repository's root.
        """
        try:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=workspace,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            partial = (exc.output or b"").decode("utf-8", "replace")
            return f"timed out after {timeout_s:g} s\n{_clip(partial)}"
        output = done.stdout.decode("utf-8", "replace")
        return f"exit code: {done.returncode}\n{_clip(output)}"

    return shell


def _model(config: dict[str, Any]) -> Any:
    # The client's default retries (2, on 408/409/429/5xx) ride out a proxy that is briefly overloaded.
    client = AsyncOpenAI(base_url=config["base_url"], api_key=os.environ["OPENAI_API_KEY"])
    if config["api"] == "responses":
        return OpenAIResponsesModel(model=config["model"], openai_client=client)
    return OpenAIChatCompletionsModel(model=config["model"], openai_client=client)


async def _run(config: dict[str, Any], instruction: str) -> Any:
    settings = ModelSettings(temperature=config["temperature"]) if config.get("temperature") is not None else None
    agent = Agent(
        name="polar-openai-agent",
        instructions=INSTRUCTIONS,
        model=_model(config),
        model_settings=settings or ModelSettings(),
        tools=[_shell_tool(config["workspace"], float(config["command_timeout"]))],
    )
    return await Runner.run(agent, instruction, max_turns=int(config["max_turns"]))


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="openai_agents_agent.py", description="Run one instruction to completion.")
    parser.add_argument("config", type=Path, help="the JSON config Polar wrote")
    parser.add_argument("instruction", help="the task, given to the agent as its input")
    parser.add_argument("--max-turns", type=int, help="the most model calls")
    parser.add_argument("--api", choices=("responses", "chat_completions"), help="which OpenAI API to speak")
    parser.add_argument("--temperature", type=float, help="the sampling temperature sent with each call")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Run the agent; see the module docstring for the arguments."""
    args = _arguments(argv)
    config = json.loads(args.config.read_text())
    for key in ("max_turns", "api", "temperature"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    set_tracing_disabled(True)
    try:
        result = asyncio.run(_run(config, args.instruction))
    except Exception as exc:  # the agent failed: say why on stderr and exit 1, which the gateway records
        print(f"openai-agents run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    transcript = Path(config["transcript"])
    transcript.parent.mkdir(parents=True, exist_ok=True)
    transcript.write_text(json.dumps(result.to_input_list(), indent=2, default=str) + "\n")
    print(result.final_output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
