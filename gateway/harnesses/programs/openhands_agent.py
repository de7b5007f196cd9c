"""Run the OpenHands SDK's own agent once on a task: Polar's OpenHands harness program.

Started by ``gateway.harnesses.openhands`` with the interpreter of the ``openhands`` environment
(``.harnesses/py/openhands``, Python 3.12: ``openhands-sdk`` and ``openhands-tools``), never with Polar's: it
imports nothing from Polar. It reads one JSON file (written by the adapter below the session's HOME)::

    {"instruction": ..., "model": ..., "base_url": ".../v1", "api_key": ..., "workspace": ...,
     "persistence_dir": ..., "tools": ["terminal", "file_editor", "task_tracker"], "max_iterations": 100,
     "max_input_tokens": ..., "max_output_tokens": ...}

builds the SDK's ``Agent`` (an OpenAI-compatible ``LLM`` through LiteLLM, the SDK's terminal/file-editor/task
tools from ``openhands-tools``; no browser, no condenser) over a ``LocalWorkspace``, sends the instruction, runs
the conversation to its end, prints the agent's final answer and exits 0 when the conversation finished (1 when
it errored or got stuck, 2 on a bad configuration file).

The terminal the model's commands run in is made plain, so its results reach the model as text: the SDK starts
``bash -i`` on a pty with ``TERM=xterm-256color`` (forced, after the environment it is given), so readline wraps
every prompt in bracketed-paste escapes (``ESC[?2004h``/``ESC[?2004l``) and colour-aware programs (git, grep, ls,
pytest) colour their output. The terminal's shell is therefore a small script written next to this program that
sets ``TERM=dumb`` (and ``NO_COLOR=1``) and then runs bash. Its ``PWD`` is the workspace as configured (the path
inside the sandbox): started with only a working directory, bash reports the kernel's resolved path, which is the
host's where the sandbox reaches its session directory through a symbolic link.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn

# The SDK's tools by their registered names (``TerminalTool.name``, ...), which the configuration uses.
TOOLS = ("terminal", "file_editor", "task_tracker")
# The terminal runs commands in a plain subprocess (no tmux server in the sandbox).
TOOL_PARAMS: dict[str, dict[str, Any]] = {"terminal": {"terminal_type": "subprocess"}}
# The terminal's shell: bash on a dumb terminal (see the module docstring).
SHELL_NAME = "openhands-terminal-shell"
SHELL_SCRIPT = """\
#!/bin/sh
# Polar: the agent's terminal is a dumb one, so no escape sequences reach the model (see openhands_agent.py).
TERM=dumb NO_COLOR=1
export TERM NO_COLOR
exec {bash} --noediting "$@"
"""


def load_config(path: str) -> dict[str, Any]:
    """The configuration file as a mapping; exits 2 when it is unreadable or lacks a required key."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        _fail(f"cannot read {path}: {exc}")
    missing = [k for k in ("instruction", "model", "base_url", "api_key", "workspace") if k not in config]
    unknown = [t for t in config.get("tools", []) if t not in TOOLS]
    if missing or unknown:
        _fail(f"missing keys {missing}, unknown tools {unknown}")
    return dict(config)


def _fail(message: str) -> NoReturn:
    print(f"openhands_agent: bad configuration: {message}", file=sys.stderr)
    sys.exit(2)


def build_llm(config: dict[str, Any]) -> Any:
    """The SDK's LLM for an OpenAI-compatible endpoint (``openai/<model>`` routes LiteLLM to Chat Completions)."""
    from openhands.sdk import LLM  # type: ignore[import-not-found]
    from pydantic import SecretStr

    return LLM(
        usage_id="agent",
        model=f"openai/{config['model']}",
        base_url=config["base_url"],
        api_key=SecretStr(config["api_key"]),
        # Known limits mean no model-metadata lookup; the proxy, not the SDK, retries.
        max_input_tokens=int(config.get("max_input_tokens", 131072)),
        max_output_tokens=int(config.get("max_output_tokens", 8192)),
        num_retries=int(config.get("num_retries", 0)),
        # Priced (at zero), LiteLLM looks the model up in no cost map.
        input_cost_per_token=0.0,
        output_cost_per_token=0.0,
        native_tool_calling=True,
        caching_prompt=False,
        stream=False,
    )


def terminal_shell(directory: Path) -> str:
    """Write the terminal's shell script (bash on a dumb terminal) into ``directory``; its path."""
    bash = shutil.which("bash")
    if bash is None:
        _fail("no bash on PATH for the terminal tool")
    script = directory / SHELL_NAME
    script.write_text(SHELL_SCRIPT.format(bash=shlex.quote(bash)))
    script.chmod(0o755)
    return str(script)


def tool_params(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The parameters of tool ``name``: the terminal gets the plain shell and the workspace as its ``PWD``."""
    params = dict(TOOL_PARAMS.get(name, {}))
    if name == "terminal":
        params["shell_path"] = terminal_shell(Path(__file__).resolve().parent)
        params["env"] = {"PWD": str(config["workspace"])}
    return params


def build_agent(config: dict[str, Any]) -> Any:
    """The SDK's ``Agent`` with the configured tools (registering each tool by importing its module)."""
    # Importing a tool's module registers it.
    import openhands.tools.file_editor  # type: ignore[import-not-found]
    import openhands.tools.task_tracker  # type: ignore[import-not-found]
    import openhands.tools.terminal  # type: ignore[import-not-found]  # noqa: F401
    from openhands.sdk import Agent  # type: ignore[import-not-found]
    from openhands.sdk.tool import Tool  # type: ignore[import-not-found]

    names = config.get("tools") or list(TOOLS)
    tools = [Tool(name=n, params=tool_params(config, n)) for n in names]
    return Agent(llm=build_llm(config), tools=tools)


def run(config: dict[str, Any]) -> int:
    """Run the conversation to its end; print the final answer; 0 when it finished."""
    from openhands.sdk import Conversation  # type: ignore[import-not-found]
    from openhands.sdk.conversation.response_utils import (  # type: ignore[import-not-found]
        get_agent_final_response,
    )
    from openhands.sdk.conversation.state import ConversationExecutionStatus  # type: ignore[import-not-found]

    conversation = Conversation(
        agent=build_agent(config),
        workspace=config["workspace"],
        persistence_dir=config.get("persistence_dir"),
        max_iteration_per_run=int(config.get("max_iterations", 100)),
        visualizer=None,
        delete_on_close=False,
    )
    try:
        conversation.send_message(config["instruction"])
        conversation.run()
        print(get_agent_final_response(conversation.state.events))
        status = conversation.state.execution_status
    finally:
        conversation.close()
    if status != ConversationExecutionStatus.FINISHED:
        print(f"openhands_agent: conversation ended {status.value}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    """``openhands_agent.py CONFIG.json``."""
    if len(argv) != 2:
        _fail("usage: openhands_agent.py CONFIG.json")
    return run(load_config(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
