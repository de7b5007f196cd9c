"""Qwen Code's shell tool hands the model a command's whole output, with the real ``qwen`` CLI.

The scripted model ``cat``\\ s 20,480 known bytes through ``run_shell_command`` (its pty path used to cut them at
~8 KB, its plain child_process path to drop them under load, see ``gateway/harnesses/qwen_shell_drain.py``), then
prints ``NODE_OPTIONS``; the next recorded prompts must hold the 20,480 bytes whole and show that the adapter's
preload did not leak into the command's environment. ``bench/qwen_shell_output`` counts the same over many runs
under load. Skipped when the CLIs are not installed (``scripts/setup_harnesses.sh``) or bubblewrap is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from integration_tests.support.harnesses import clis_installed, final_turn, run_harness, tool_call_turn
from integration_tests.support.qwen_output import Outcome, classify, file_name, known_bytes, tool_result_text
from polar_core.model_fixtures import build_tiny_tokenizer

pytestmark = [
    pytest.mark.skipif(not clis_installed(), reason="harness CLIs (setup_harnesses.sh) or bubblewrap not installed"),
    pytest.mark.slow,
]

SIZE = 20_480


async def test_shell_output_of_20_kb_reaches_the_next_prompt_whole(tmp_path: Path) -> None:
    expected = known_bytes(SIZE)
    turns = [
        tool_call_turn("qwen-code", f"cat ~/{file_name(SIZE)}"),
        tool_call_turn("qwen-code", 'echo "NODE_OPTIONS=[${NODE_OPTIONS-unset}]"'),
        final_turn("qwen-code", "Done."),
    ]
    run = await run_harness(
        "qwen-code",
        turns,
        tmp=tmp_path,
        tokenizer=build_tiny_tokenizer(),
        timeout_s=300,
        home_files={file_name(SIZE): expected},
    )
    assert run.exit_code == 0, run.describe()
    assert len(run.completions) == 3, run.describe()

    result = tool_result_text(run.completions[1].request)
    assert classify(result, expected) is Outcome.WHOLE, result[:300] + " ... " + result[-300:]
    # Exactly once, and the model was not told it was cut.
    assert result.count(expected) == 1
    assert "truncated" not in result.lower()

    assert "Output: NODE_OPTIONS=[unset]\n" in tool_result_text(run.completions[2].request)
