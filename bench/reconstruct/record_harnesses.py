"""Record one real session of each agent CLI against the model proxy (scripted backend, tiny tokenizer).

Each CLI runs exactly as in ``integration_tests/test_harness_clis.py``, through the same
:func:`integration_tests.support.harnesses.run_harness`: a ``ProxyApp`` with a ``ScriptedBackend`` on the tiny
tokenizer, the gRPC service, ``OpenSession``, a ``UnixSocketBridge`` and the local bubblewrap runtime. The
script makes four calls of the harness's own shell tool (each writing a different file), then a final text
answer. The session's completions (``ListCompletions``) are written as
``<out>/<cli>.jsonl`` for ``python -m bench.reconstruct --sessions``.

Run: ``.venv/bin/python -m bench.reconstruct.record_harnesses --out bench/reconstruct/data [--only CLI]``.
Needs the CLIs (``scripts/setup_harnesses.sh``) and bubblewrap.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from integration_tests.support.harnesses import SHELL_TOOLS, HarnessRun, final_turn, run_harness, tool_call_turn
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import write_jsonl

REPO = Path(__file__).resolve().parents[2]
TOOL_CALLS = 4


def script(harness: str) -> list[dict[str, Any]]:
    """Four shell-tool calls, each writing a different file, then a final text answer."""
    turns = [tool_call_turn(harness, f"echo polar-step-{i} > out{i}.txt") for i in range(1, TOOL_CALLS + 1)]
    turns.append(final_turn(harness, f"Done: wrote out1.txt to out{TOOL_CALLS}.txt."))  # mini-swe-agent: its submit
    return turns


async def record(harness: str, tmp: Path, tokenizer: Any) -> HarnessRun:
    """Run one session of ``harness``; raise when the shell tool did not write every file."""
    run = await run_harness(
        harness,
        script(harness),
        tmp=tmp,
        tokenizer=tokenizer,
        session_id=harness,
        instruction=f"Write out1.txt to out{TOOL_CALLS}.txt with the shell, one command each, then say done.",
        timeout_s=180,
    )
    written = sorted(p.name for p in run.workspace.glob("out*.txt"))
    if len(written) != TOOL_CALLS:
        raise RuntimeError(f"expected {TOOL_CALLS} files written by the shell tool, got {written}")
    return run


async def main_async(out: Path, harnesses: Sequence[str]) -> int:
    tokenizer = build_tiny_tokenizer()
    failed = 0
    for harness in harnesses:
        with tempfile.TemporaryDirectory(prefix=f"rec-{harness}-") as tmp:
            try:
                run = await record(harness, Path(tmp), tokenizer)
            except Exception as exc:  # report it and go on with the next CLI
                print(f"{harness}: FAILED ({exc!r})", file=sys.stderr)
                failed += 1
                continue
        completions, expected = run.completions, TOOL_CALLS + 1
        if run.exit_code != 0 or len(completions) != expected:
            print(f"{harness}: FAILED {len(completions)}/{expected} calls\n{run.describe(1500)}", file=sys.stderr)
            failed += 1
            continue
        path = out / f"{harness}.jsonl"
        write_jsonl(path, (c.to_dict() for c in completions))
        print(f"{harness}: {len(completions)} calls -> {path} ({path.stat().st_size:,} bytes)")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reconstruct.record_harnesses")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "reconstruct" / "data")
    parser.add_argument("--only", choices=list(SHELL_TOOLS), action="append", help="record only these CLIs")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sys.exit(asyncio.run(main_async(args.out, args.only or list(SHELL_TOOLS))))


if __name__ == "__main__":
    main()
