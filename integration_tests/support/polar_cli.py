"""``polar`` as a user runs it, and the scripted fix of ``examples/tasks/paginate`` that runs through it.

``integration_tests/test_polar_run.py`` and the tests and benches that run ``polar run`` or ``polar generate`` in a
subprocess share these: :func:`run_polar`, the scripted model's :data:`FIX_SCRIPT` (:func:`write_script`), the
``command`` harness's :data:`AGENT`, and :func:`command_task` (paginate with that agent).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "AGENT",
    "FIX_SCRIPT",
    "HARNESS_BIN",
    "PAGINATE",
    "REPO",
    "command_task",
    "read_jsonl",
    "run_polar",
    "write_script",
]

REPO = Path(__file__).resolve().parents[2]
HARNESS_BIN = REPO / ".harnesses" / "node_modules" / ".bin"
PAGINATE = REPO / "examples" / "tasks" / "paginate"
# The scripted model: call the shell tool to fix examples/tasks/paginate, then answer.
_FIX_COMMAND = "sed -i 's|return total // per_page|return -(-total // per_page)|' pagination.py"
FIX_SCRIPT = [
    {"text": "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": _FIX_COMMAND}}) + "\n</tool_call>"},
    {"text": "I fixed page_count: it now rounds up."},
]
# A minimal agent for the ``command`` harness: OpenAI chat completions with one shell tool, until an answer.
AGENT = """
import json, os, subprocess, urllib.request
tools = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
messages = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
for _ in range(4):
    body = {"model": os.environ["POLAR_MODEL"], "messages": messages, "tools": tools}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    message = json.loads(urllib.request.urlopen(request, timeout=120).read())["choices"][0]["message"]
    messages.append(message)
    if not message.get("tool_calls"):
        print(message.get("content"))
        break
    for call in message["tool_calls"]:
        command = json.loads(call["function"]["arguments"])["command"]
        done = subprocess.run(command, shell=True, capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr})
"""


def _polar_argv() -> list[str]:
    # What the installed ``polar`` script runs (``polar_run.cli:main``), from this checkout.
    return [sys.executable, "-m", "polar_run"]


def run_polar(*args: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``polar ARGS`` with stdout redirected (so progress is plain lines), as CI would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    return subprocess.run(
        [*_polar_argv(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def write_script(path: Path, turns: list[dict[str, Any]]) -> Path:
    """Write a scripted-backend script (JSON lines)."""
    path.write_text("".join(json.dumps(t) + "\n" for t in turns), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def command_task(tmp: Path) -> Path:
    """``examples/tasks/paginate`` copied under ``tmp`` with the ``command`` harness running :data:`AGENT`."""
    data = yaml.safe_load((PAGINATE / "task.yaml").read_text())
    # Beside the task file: task paths must lie under its directory (the operator's task roots).
    shutil.copytree(PAGINATE / "repo", tmp / "repo", dirs_exist_ok=True)
    data["evaluator"]["repo"] = "repo"
    data["harness"] = {"name": "command", "argv": ["python3", "-c", AGENT]}
    data["timeout_seconds"] = 60
    path = tmp / "task.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
