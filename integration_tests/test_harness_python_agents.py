"""The Python agents (mini-swe-agent, aider, the OpenAI Agents SDK) against the real proxy, in a network-less sandbox.

Each agent runs from its own pinned virtual environment (``scripts/setup_harnesses.sh``: ``.harnesses/py/<name>``)
in a local runtime (bubblewrap, loopback only) that reaches the proxy only through the Unix-socket tunnel. A
``sitecustomize`` on ``PYTHONPATH`` installs an audit hook that logs every name lookup and socket connection the
agent's Python makes, so "stays offline" is checked directly (no update check, analytics, model-price or tokenizer
download tried), not inferred from the absence of an error message. Skipped per agent when its venv is missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from integration_tests.support.harnesses import (
    HARNESS_DIR,
    MODEL,
    SANDBOX_PORT,
    SANDBOX_ROOT,
    HarnessRun,
    assert_tool_loop_mask,
    clis_installed,
    final_turn,
    run_harness,
    tool_call_turn,
)
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import ReconstructionStrategy
from reconstructor import ReconstructionOptions, reconstruct_session

ANSWER = "The answer is 42."
DONE = "Done: wrote out.txt."
SESSION = "s1"
_AUDIT_DIR = ".polar-audit"
# Logs the audit events that reach for the network; JSON lines, one per event.
_SITECUSTOMIZE = """\
import json, os, sys

_log = os.path.join(os.path.dirname(os.path.abspath(__file__)), "net.jsonl")

def _hook(event, args):
    if event == "socket.getaddrinfo":
        record = {"event": event, "host": str(args[0]), "port": str(args[1])}
    elif event == "socket.connect":
        address = args[1]
        record = {"event": event, "address": list(address) if isinstance(address, tuple) else str(address)}
    else:
        return
    with open(_log, "a") as out:
        out.write(json.dumps(record) + "\\n")

sys.addaudithook(_hook)
"""

pytestmark = pytest.mark.skipif(
    not clis_installed(), reason="harness CLIs (setup_harnesses.sh) or bubblewrap not installed"
)


def _venv(name: str) -> Any:
    installed = (HARNESS_DIR / "py" / name / "bin" / "python").exists()
    return pytest.mark.skipif(not installed, reason=f"{name} venv not installed (scripts/setup_harnesses.sh)")


MINI = pytest.param("mini-swe-agent", {}, marks=[_venv("mini-swe-agent"), pytest.mark.slow], id="mini-swe-agent")
AIDER = pytest.param("aider", {}, marks=[_venv("aider"), pytest.mark.slow], id="aider")
AGENTS = pytest.param("openai-agents", {}, marks=_venv("openai-agents"), id="openai-agents-responses")
AGENTS_CHAT = pytest.param(
    "openai-agents", {"api": "chat_completions"}, marks=_venv("openai-agents"), id="openai-agents-chat"
)
PROTOCOLS = {"openai-agents": "openai_responses"}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


async def _run(
    tmp: Path,
    tokenizer: Any,
    harness: str,
    turns: list[dict[str, Any]],
    options: dict[str, Any],
    instruction: str = "Say the answer.",
) -> tuple[HarnessRun, list[dict[str, Any]]]:
    """Run once with the audit hook; return the run and the network events its Python made."""
    audit = (tmp / "sessions" / SESSION).absolute() / "home" / _AUDIT_DIR
    env = {"PYTHONPATH": str(SANDBOX_ROOT / "home" / _AUDIT_DIR), **options.pop("env", {})}
    run = await run_harness(
        harness,
        turns,
        tmp=tmp,
        tokenizer=tokenizer,
        session_id=SESSION,
        instruction=instruction,
        options={**options, "env": env},
        home_files={f"{_AUDIT_DIR}/sitecustomize.py": _SITECUSTOMIZE},
        timeout_s=150,
    )
    return run, _events(audit / "net.jsonl")


def _events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _all_exist(paths: Any) -> bool:
    return all(Path(p).exists() for p in paths)


# The proxy as the agent reaches it, and the runtime's tunnel forwarder (a Python process too) behind it.
_LOOKUPS = {("127.0.0.1", str(SANDBOX_PORT)), ("localhost", str(SANDBOX_PORT))}
_CONNECTIONS = (["127.0.0.1", SANDBOX_PORT], "/run/polar/proxy.sock")


def _assert_only_the_proxy(run: HarnessRun, events: list[dict[str, Any]]) -> None:
    """Every lookup and connection went to the tunnel's loopback port: nothing else was even tried."""
    assert ["127.0.0.1", SANDBOX_PORT] in [e.get("address") for e in events], f"hook not loaded?\n{run.describe()}"
    for event in events:
        if event["event"] == "socket.getaddrinfo":
            assert (event["host"], event["port"]) in _LOOKUPS, event
        else:
            assert event["address"] in _CONNECTIONS, event


@pytest.mark.parametrize(("harness", "options"), [MINI, AIDER, AGENTS, AGENTS_CHAT])
async def test_plain_prompt(tmp_path: Path, tokenizer: Any, harness: str, options: dict[str, Any]) -> None:
    # An instruction that looks like an option reaches the model as the task, not the CLI's parser.
    turns = [final_turn(harness, ANSWER)]
    run, events = await _run(tmp_path, tokenizer, harness, turns, dict(options), instruction="--help")
    assert run.exit_code == 0, run.describe()
    user = [m for m in run.completions[0].request["messages"] if m["role"] == "user"] if run.completions else []
    assert user, run.describe()
    assert "--help" in json.dumps(user[-1]["content"]), user[-1]
    assert ANSWER in run.stdout, run.describe()
    assert len(run.completions) == 1, run.describe()
    call = run.completions[0]
    assert call.model == MODEL
    expected = "openai_chat" if options.get("api") == "chat_completions" else PROTOCOLS.get(harness, "openai_chat")
    assert call.protocol == expected
    assert run.patch == "", run.patch
    _assert_only_the_proxy(run, events)


@pytest.mark.parametrize(("harness", "options"), [MINI, AGENTS])
async def test_tool_call_loop(tmp_path: Path, tokenizer: Any, harness: str, options: dict[str, Any]) -> None:
    turns = [tool_call_turn(harness, "echo polar-was-here | tee out.txt"), final_turn(harness, DONE)]
    run, events = await _run(tmp_path, tokenizer, harness, turns, dict(options))
    assert run.exit_code == 0, run.describe()
    assert (run.workspace / "out.txt").read_text() == "polar-was-here\n", run.describe()
    assert "+polar-was-here" in run.patch
    assert len(run.completions) == 2, run.describe()
    assert DONE in run.stdout, run.describe()
    assert _all_exist(run.host_log_paths), run.launch.log_paths
    _assert_only_the_proxy(run, events)

    built = reconstruct_session(run.completions, ReconstructionOptions(strategy=ReconstructionStrategy.PREFIX_MERGE))
    assert len(built.traces) == 1, built.stats
    masked = assert_tool_loop_mask(built.traces[0], *run.completions)
    # The masked span is the tool result the harness sent back: it holds the command's output.
    assert "polar-was-here" in tokenizer.decode(masked)


@pytest.mark.slow
@_venv("aider")
async def test_aider_edit_and_test_loop(tmp_path: Path, tokenizer: Any) -> None:
    """aider's loop: the model's whole-file edit writes out.txt, aider runs the test command and sends its failing
    output back, the model answers. aider re-renders the edited file's contents before the newest message, so
    the second prompt does not extend the first: prefix-merge keeps the calls apart (one trace per call)."""
    edit = {"text": "I will create it.\n\nout.txt\n```\npolar-was-here\n```\n"}
    options = {"test_cmd": "cat out.txt; exit 1"}
    run, events = await _run(tmp_path, tokenizer, "aider", [edit, {"text": DONE}], options)
    assert run.exit_code == 0, run.describe()
    assert (run.workspace / "out.txt").read_text() == "polar-was-here\n", run.describe()
    assert "+polar-was-here" in run.patch
    assert ".aider" not in run.patch, run.patch
    assert len(run.completions) == 2, run.describe()
    assert DONE in run.stdout, run.describe()
    _assert_only_the_proxy(run, events)

    last = run.completions[1].request["messages"][-1]
    assert last["role"] == "user"
    assert "cat out.txt; exit 1" in last["content"]
    assert "polar-was-here" in last["content"]
    built = reconstruct_session(run.completions, ReconstructionOptions(strategy=ReconstructionStrategy.PREFIX_MERGE))
    assert len(built.traces) == 2, built.stats
    assert built.stats.splits_by_reason == {"prefix_mismatch": 1}


@_venv("openai-agents")
async def test_through_the_gateway(tmp_path: Path, tokenizer: Any) -> None:
    """The gateway's own wiring for a Python agent: the venv found from its harness bin dir, the admission check
    of the venv's interpreter, the harness tree (npm CLIs and venvs) visible read-only in the local runtime."""
    from integration_tests.test_gateway_clis import check_tool_loop, run_session

    outcome = await run_session(tmp_path, tokenizer, "openai-agents")
    check_tool_loop(outcome, tokenizer)
    assert outcome.completions[0].protocol == "openai_responses"


@pytest.mark.slow
@_venv("openai-agents")
def test_polar_run_with_a_python_agent(tmp_path: Path) -> None:
    """``polar run --harness openai-agents`` end to end: the example task fixed through the agent's shell tool."""
    from integration_tests.support.polar_cli import PAGINATE, run_polar, write_script

    fix = "sed -i 's|return total // per_page|return -(-total // per_page)|' pagination.py"
    script = write_script(tmp_path / "fix.jsonl", [tool_call_turn("openai-agents", fix), {"text": "Fixed it."}])
    out = tmp_path / "run"
    proc = run_polar(
        "run", str(PAGINATE / "task.yaml"), "--out", str(out), "--backend", "scripted", "--backend-option",
        f"script={script}", "--model", "tiny", "--samples", "1", "--harness", "openai-agents", "--harness-dir",
        str(HARNESS_DIR), cwd=tmp_path, timeout_s=150,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = [json.loads(line) for line in (out / "sessions.jsonl").read_text().splitlines()]
    assert row["status"] == "resolved", row
    assert row["calls"] == 2
