"""OpenHands (the openhands-sdk agent) and Hermes Agent against the real model proxy, each in a network-less sandbox.

Each runs from its own pinned environment (``.harnesses/py/<name>``, ``scripts/setup_harnesses.sh``) in a local
runtime (bubblewrap, loopback only) that reaches the proxy only through the Unix-socket tunnel. Skipped when the
environment or bubblewrap is missing. Both start slowly (LiteLLM's import alone is ~9 s of CPU for OpenHands;
Hermes probes its environment before the first call), so every case is slow-marked.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from integration_tests.support.harnesses import (
    HARNESS_DIR,
    MODEL,
    SANDBOX_ROOT,
    HarnessRun,
    assert_tool_loop_mask,
    run_harness,
    tool_call_turn,
)
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import ReconstructionStrategy
from reconstructor import ReconstructionOptions, reconstruct_session

ANSWER = "The answer is 42."
# Harness name → its environment under .harnesses/py.
VENVS = {"openhands": "openhands", "hermes-agent": "hermes-agent"}


def _installed(harness: str) -> bool:
    return (HARNESS_DIR / "py" / VENVS[harness] / "bin" / "python").exists() and shutil.which("bwrap") is not None


def _case(harness: str) -> Any:
    return pytest.param(
        harness,
        id=harness,
        marks=[
            pytest.mark.slow,
            pytest.mark.timeout(360),  # the harness itself may take up to its 240 s deadline on loaded cores
            pytest.mark.skipif(not _installed(harness), reason=f"{harness} environment or bubblewrap not installed"),
        ],
    )


HARNESSES = [_case("openhands"), _case("hermes-agent")]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


Run = Callable[..., Awaitable[HarnessRun]]


@pytest.fixture
def run(tmp_path: Path, tokenizer: Any) -> Run:
    async def run(harness: str, turns: list[dict[str, Any]]) -> HarnessRun:
        return await run_harness(
            harness,
            turns,
            tmp=tmp_path,
            tokenizer=tokenizer,
            timeout_s=240,
            options=AUDIT_OPTIONS,
            home_files=AUDIT_FILES,
        )

    return run


# Loaded by the agent's interpreter (``PYTHONPATH`` relative to its working directory, the workspace): records
# every name look-up and connection that is not to the loopback, where the proxy's tunnel is.
AUDIT = """
import os, sys
_HOME = os.environ.get("HOME", "")
open(os.path.join(_HOME, "audit-loaded"), "w").close()
def _hook(event, args):
    if event == "socket.getaddrinfo":
        host = args[0]
    elif event == "socket.connect" and isinstance(args[1], tuple):
        host = args[1][0]
    else:
        return
    if str(host) not in ("127.0.0.1", "localhost", "::1"):
        with open(os.path.join(_HOME, "offline-violations.txt"), "a") as f:
            f.write(f"{event} {host}\\n")
sys.addaudithook(_hook)
"""
AUDIT_FILES = {".polar-audit/sitecustomize.py": AUDIT}
AUDIT_OPTIONS = {"env": {"PYTHONPATH": "../home/.polar-audit"}}


def _has_files(paths: Sequence[Path]) -> bool:
    return any(p.is_file() for log in paths for p in Path(log).rglob("*"))


def _no_network_errors(result: HarnessRun) -> None:
    """Nothing printed about the network, and the audit hook (which did load) saw no look-up beyond the loopback."""
    home = result.workspace.parent / "home"
    assert (home / "audit-loaded").exists(), result.describe()
    violations = home / "offline-violations.txt"
    assert not violations.exists(), violations.read_text()
    text = (result.stdout + result.stderr).lower()
    for needle in ("name or service not known", "temporary failure in name resolution", "connection refused"):
        assert needle not in text, result.describe()


@pytest.mark.parametrize("harness", HARNESSES)
async def test_plain_prompt(run: Run, harness: str) -> None:
    result = await run(harness, [{"text": ANSWER}])
    assert result.exit_code == 0, result.describe()
    assert ANSWER in result.stdout, result.describe()
    assert len(result.completions) == 1, result.describe()
    assert result.completions[0].model == MODEL
    _no_network_errors(result)


@pytest.mark.parametrize("harness", HARNESSES)
async def test_tool_call_loop(run: Run, tokenizer: Any, harness: str) -> None:
    command = "echo polar-was-here > out.txt && echo tool-output-marker"
    turns = [tool_call_turn(harness, command), {"text": "Done: wrote out.txt."}]
    result = await run(harness, turns)
    assert result.exit_code == 0, result.describe()
    assert (result.workspace / "out.txt").read_text().strip() == "polar-was-here", result.describe()
    assert "+polar-was-here" in result.patch
    assert len(result.completions) == 2, result.describe()
    assert "Done: wrote out.txt." in result.stdout, result.describe()
    # The shell tool's output went back to the model as a tool message.
    tool_messages = [m for m in result.completions[1].request["messages"] if m.get("role") == "tool"]
    assert len(tool_messages) == 1, result.describe()
    # The harness left its own transcript where the adapter says.
    assert _has_files(result.host_log_paths), result.launch.log_paths
    _no_network_errors(result)

    built = reconstruct_session(result.completions, ReconstructionOptions(strategy=ReconstructionStrategy.PREFIX_MERGE))
    assert len(built.traces) == 1, built.stats
    masked = assert_tool_loop_mask(built.traces[0], *result.completions)
    assert "tool-output-marker" in tokenizer.decode(masked)


@pytest.mark.slow
@pytest.mark.skipif(not _installed("openhands"), reason="openhands environment or bubblewrap not installed")
async def test_openhands_tool_results_are_plain_text_with_the_sandbox_path(tmp_path: Path, tokenizer: Any) -> None:
    """What OpenHands' terminal shows the model: no terminal escape sequences (its pty's bash runs on a dumb terminal,
    so no bracketed-paste codes and no colours from colour-aware programs) and the workspace as the sandbox names it,
    not the host's real path (the session directory is reached through a symbolic link here)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    command = (
        "git -c color.ui=auto log --oneline -1; ls --color=auto; grep --color=auto hello main.py; "
        "tput setaf 1; echo colour-marker; pwd"
    )
    result = await run_harness(
        "openhands", [tool_call_turn("openhands", command), {"text": ANSWER}], tmp=tmp_path / "link",
        tokenizer=tokenizer, timeout_s=240,
    )  # fmt: skip
    assert result.exit_code == 0, result.describe()
    assert len(result.completions) == 2, result.describe()
    (tool,) = [m for m in result.completions[1].request["messages"] if m.get("role") == "tool"]
    text = json.dumps(tool["content"]) if not isinstance(tool["content"], str) else tool["content"]
    assert "colour-marker" in text, text
    assert "polar: initial workspace" in text, text  # git's output arrived, uncoloured
    assert "\x1b" not in text, repr(text)
    sandbox_workspace = str(SANDBOX_ROOT / "workspace")
    assert f"[Current working directory: {sandbox_workspace}]" in text, text
    assert f"\n{sandbox_workspace}\n" in text, text  # what `pwd` printed
    prompt = json.dumps(result.completions[1].request)
    assert "\\u001b" not in prompt
    assert str(tmp_path / "real") not in prompt
