"""opencode, Cline and the Continue CLI, real and pinned, against the real model proxy (scripted backend), offline.

Each runs in a local runtime (bubblewrap, loopback only) that reaches the proxy only through the Unix-socket
tunnel: (a) a plain prompt prints the scripted answer with one completion recorded; (b) a tool loop: the
script calls the harness's shell tool to write ``out.txt``, then answers; the file is in the patch and the
prefix-merged trace masks the tool output. Skipped when the CLIs (``scripts/setup_harnesses.sh``) or
bubblewrap are missing.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from integration_tests.support.harnesses import (
    BIN_DIR,
    MODEL,
    assert_tool_loop_mask,
    run_harness,
    tool_call_turn,
)
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import ReconstructionStrategy
from reconstructor import ReconstructionOptions, reconstruct_session

ANSWER = "The answer is 42."
HARNESSES = {"opencode": "opencode", "cline": "cline", "continue": "cn"}  # harness name -> bin
# opencode needs ~20-40 s on two busy cores before its first request (a 185 MB Bun binary, a git snapshot).
CASES = [pytest.param("opencode", marks=pytest.mark.slow), "cline", "continue"]

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or not all((BIN_DIR / b).exists() for b in HARNESSES.values()),
    reason="opencode/cline/cn (setup_harnesses.sh) or bubblewrap not installed",
)


def _exists(path: object) -> bool:
    return Path(str(path)).exists()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.mark.parametrize("harness", CASES)
async def test_plain_prompt(tmp_path: Path, tokenizer: Any, harness: str) -> None:
    result = await run_harness(harness, [{"text": ANSWER}], tmp=tmp_path, tokenizer=tokenizer)
    assert result.exit_code == 0, result.describe()
    assert ANSWER in result.stdout, result.describe()
    assert len(result.completions) == 1, result.describe()  # no title/summary side calls
    assert result.completions[0].model == MODEL
    assert "api.openai.com" not in result.stderr
    assert "ENOTFOUND" not in result.stderr


@pytest.mark.parametrize("harness", CASES)
async def test_tool_call_loop(tmp_path: Path, tokenizer: Any, harness: str) -> None:
    turns = [tool_call_turn(harness, "echo polar-was-here > out.txt"), {"text": "Done: wrote out.txt."}]
    result = await run_harness(harness, turns, tmp=tmp_path, tokenizer=tokenizer)
    assert result.exit_code == 0, result.describe()
    assert (result.workspace / "out.txt").read_text().strip() == "polar-was-here", result.describe()
    assert "+polar-was-here" in result.patch
    assert len(result.completions) == 2, result.describe()
    assert "Done: wrote out.txt." in result.stdout, result.describe()
    assert any(map(_exists, result.launch.log_paths)), result.launch.log_paths

    built = reconstruct_session(result.completions, ReconstructionOptions(strategy=ReconstructionStrategy.PREFIX_MERGE))
    assert len(built.traces) == 1, built.stats
    masked = assert_tool_loop_mask(built.traces[0], *result.completions)
    assert masked
