"""The five real agent CLIs against the real model proxy (scripted backend), each in a network-less sandbox.

Every CLI runs in a local runtime (bubblewrap, loopback only) that reaches the proxy only through the
Unix-socket tunnel, so any attempt to reach the internet fails. Skipped when the CLIs are not installed
(``scripts/setup_harnesses.sh``) or bubblewrap is missing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from integration_tests.support.harnesses import (
    MODEL,
    HarnessRun,
    assert_tool_loop_mask,
    clis_installed,
    run_harness,
    tool_call_turn,
)
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import ReconstructionStrategy
from reconstructor import ReconstructionOptions, reconstruct_session

ANSWER = "The answer is 42."

pytestmark = pytest.mark.skipif(
    not clis_installed(), reason="harness CLIs (setup_harnesses.sh) or bubblewrap not installed"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


Run = Callable[..., Awaitable[HarnessRun]]


@pytest.fixture
def run(tmp_path: Path, tokenizer: Any) -> Run:
    """Run a harness once against a proxy answering the given turns."""

    async def run(harness: str, turns: list[dict[str, Any]], options: dict[str, Any] | None = None) -> HarnessRun:
        return await run_harness(harness, turns, tmp=tmp_path, tokenizer=tokenizer, options=options)

    return run


def _existing_files(paths: Sequence[Path]) -> list[Path]:
    return [f for p in map(Path, paths) if p.exists() for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]


PLAIN_CASES = [
    ("claude-code", {}),
    ("codex", {}),
    ("qwen-code", {}),
    ("gemini-cli", {}),
    ("pi", {"provider_mode": "openai-completions"}),
    ("pi", {"provider_mode": "openai-responses"}),
    ("pi", {"provider_mode": "anthropic-messages"}),
    ("pi", {"provider_mode": "google-generative-ai"}),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("harness", "options"), PLAIN_CASES, ids=[f"{h}-{o.get('provider_mode', '')}" for h, o in PLAIN_CASES]
)
async def test_plain_prompt(run: Run, harness: str, options: dict[str, Any]) -> None:
    result = await run(harness, [{"text": ANSWER}], options)
    assert result.exit_code == 0, result.describe()
    assert ANSWER in result.stdout, result.describe()
    assert len(result.completions) == 1, result.describe()
    assert result.completions[0].model == MODEL


# Qwen Code starts slowest (~7 s before its first request); its loop can pass 20 s on two busy cores.
TOOL_CASES = ["claude-code", "codex", pytest.param("qwen-code", marks=pytest.mark.slow), "gemini-cli", "pi"]


@pytest.mark.parametrize("harness", TOOL_CASES)
async def test_tool_call_loop(run: Run, harness: str) -> None:
    turns = [tool_call_turn(harness, "echo polar-was-here > out.txt"), {"text": "Done: wrote out.txt."}]
    result = await run(harness, turns)
    assert result.exit_code == 0, result.describe()
    assert (result.workspace / "out.txt").read_text().strip() == "polar-was-here", result.describe()
    assert "+polar-was-here" in result.patch
    assert len(result.completions) == 2, result.describe()
    assert "Done: wrote out.txt." in result.stdout, result.describe()
    # The harness left its own transcript where the adapter says.
    assert _existing_files(result.host_log_paths), result.launch.log_paths

    built = reconstruct_session(result.completions, ReconstructionOptions(strategy=ReconstructionStrategy.PREFIX_MERGE))
    assert len(built.traces) == 1, built.stats
    assert_tool_loop_mask(built.traces[0], *result.completions)


@pytest.mark.parametrize("harness", ["pi", "claude-code"])
async def test_two_sessions_send_the_same_first_prompt(tmp_path: Path, tokenizer: Any, harness: str) -> None:
    """The sandbox shows every session its directory at the same path, so the agent's first prompt (which names
    its working directory) is the same token for token across sessions: a backend's prefix cache serves all of
    it, and no host path or session id reaches the trace."""
    runs = [
        await run_harness(harness, [{"text": ANSWER}], tmp=tmp_path / session, tokenizer=tokenizer, session_id=session)
        for session in ("first-session", "second-session")
    ]
    for run in runs:
        assert run.exit_code == 0, run.describe()
    first, second = (run.completions[0] for run in runs)
    assert first.prompt_token_ids == second.prompt_token_ids
    prompt = str(first.request)
    assert "first-session" not in prompt
    assert str(tmp_path) not in prompt
