"""The harness matrix: every registered harness on one scripted tool loop, one row each.

Each harness runs as in ``integration_tests/test_harness_clis.py`` (:func:`integration_tests.support.harnesses.
run_harness`: the real CLI in a network-less bubblewrap sandbox, the real proxy with a scripted backend on the
tiny tokenizer, reached through the Unix-socket tunnel), with its adapter's default options, on the script of
``bench/reconstruct/record_harnesses.py``: four calls of the harness's own shell tool, then a text answer.
Printed per harness: the first call's prompt tokens, the tools it sent, the calls made, the trainer units
(traces) per reconstruction strategy, the prefix-merged calls whose merged context differs from their prompt
("inexact"), and the session's wall time. ``command`` is skipped (it is whatever the task runs), and so is any
harness whose program is not installed or whose shell tool the support module does not know.

Run: ``.venv/bin/python -m bench.harness_matrix [--only NAME ...] [--json OUT]``. Needs
``scripts/setup_harnesses.sh`` and bubblewrap.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from bench.reconstruct.record_harnesses import script
from gateway.harnesses import HarnessContext, ProxyEndpoints, adapter_names, get_adapter
from integration_tests.support.harnesses import BIN_DIR, SHELL_TOOLS, HarnessRun, run_harness
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import CompletionRecord, ReconstructionStrategy
from reconstructor import ReconstructionOptions, reconstruct_session

_STRATEGIES = (ReconstructionStrategy.PER_REQUEST, ReconstructionStrategy.PREFIX_MERGE, ReconstructionStrategy.EXACT)


@dataclasses.dataclass(frozen=True)
class Row:
    """One harness's figures (``error`` set when the run failed)."""

    harness: str
    prompt_tokens: int = 0
    tools: int = 0
    calls: int = 0
    units: tuple[int, int, int] = (0, 0, 0)
    inexact: int = 0
    wall_s: float = 0.0
    error: str = ""


def _program_installed(name: str) -> bool:
    """Whether the program the adapter launches is on its PATH (a dry run of the pure adapter)."""
    url = "http://127.0.0.1:1"
    ctx = HarnessContext(
        home=PurePosixPath("/h"), workspace=PurePosixPath("/w"), tmp=PurePosixPath("/t"), instruction="i",
        endpoints=ProxyEndpoints(token="t", anthropic_base_url=url, openai_base_url=url + "/v1", google_base_url=url),
        model="m", bin_dir=PurePosixPath(BIN_DIR),
    )  # fmt: skip
    launch = get_adapter(name).prepare(ctx)
    return shutil.which(launch.argv[0], path=launch.env.get("PATH")) is not None


def _tools(request: Mapping[str, Any]) -> int:
    """How many tools a request offered, whatever its protocol (Google nests them in functionDeclarations)."""
    count = 0
    for tool in request.get("tools") or []:
        declarations = tool.get("functionDeclarations") or tool.get("function_declarations")
        count += len(declarations) if isinstance(declarations, list) else 1
    return count


def row_of(harness: str, run: HarnessRun) -> Row:
    """The figures of one run."""
    completions: list[CompletionRecord] = run.completions
    if run.exit_code != 0 or not completions:
        return Row(harness, calls=len(completions), wall_s=run.duration_s, error=f"exit {run.exit_code}")
    units = []
    inexact = 0
    for strategy in _STRATEGIES:
        built = reconstruct_session(completions, ReconstructionOptions(strategy=strategy))
        units.append(len(built.traces))
        if strategy is ReconstructionStrategy.PREFIX_MERGE:
            inexact = built.stats.mismatched_context_calls
    return Row(
        harness,
        prompt_tokens=len(completions[0].prompt_token_ids),
        tools=_tools(completions[0].request),
        calls=len(completions),
        units=(units[0], units[1], units[2]),
        inexact=inexact,
        wall_s=run.duration_s,
    )


async def measure(names: Sequence[str]) -> list[Row]:
    """Run each harness once, one after another (they share two cores here)."""
    tokenizer = build_tiny_tokenizer()
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"matrix-{name}-") as tmp:
            run = await run_harness(name, script(name), tmp=Path(tmp), tokenizer=tokenizer, timeout_s=300)
            rows.append(row_of(name, run))
        print(f"  {name}: done", file=sys.stderr)
    return rows


def render(rows: Sequence[Row]) -> str:
    """The table as Markdown."""
    head = (
        "| harness | first-call prompt tokens | tools sent | calls | units per-request / prefix-merge / exact "
        "| inexact calls | session wall s |\n|---|---:|---:|---:|---|---:|---:|"
    )
    lines = [head]
    for r in rows:
        if r.error:
            lines.append(f"| {r.harness} | failed: {r.error} | | {r.calls} | | | {r.wall_s:.1f} |")
            continue
        units = " / ".join(map(str, r.units))
        lines.append(
            f"| {r.harness} | {r.prompt_tokens} | {r.tools} | {r.calls} | {units} | {r.inexact} | {r.wall_s:.1f} |"
        )
    return "\n".join(lines)


def _selected(only: Sequence[str]) -> list[str]:
    names = []
    for name in only or adapter_names():
        if name == "command" or name not in SHELL_TOOLS:
            print(f"  {name}: skipped (no scripted shell tool)", file=sys.stderr)
        elif not _program_installed(name):
            print(f"  {name}: skipped (not installed)", file=sys.stderr)
        else:
            names.append(name)
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, run the matrix, print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.harness_matrix", description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="harness names (default: every registered one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    if shutil.which("bwrap") is None:
        print("bubblewrap (bwrap) is needed", file=sys.stderr)
        return 2
    rows = asyncio.run(measure(_selected(args.only)))
    print(render(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=2) + "\n")
    return 0 if all(not r.error for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
