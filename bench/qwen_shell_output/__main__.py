"""Qwen Code's shell results under load: how many reach the model whole, capped by its own rule, cut, or empty.

Each session runs the real ``qwen`` CLI as ``integration_tests/test_harness_clis.py`` does
(:func:`integration_tests.support.harnesses.run_harness`: a network-less bubblewrap sandbox, the real proxy with a
scripted backend on the tiny tokenizer). The scripted model ``cat``\\ s files of known bytes (10 B, 4 KB, 20 KB,
1 MB by default; :mod:`integration_tests.support.qwen_output`) through ``run_shell_command``, ``--repeats`` times
each in one session, then answers (with four repeats of the four sizes, ~150,000 prompt tokens by the last call,
Qwen Code ended the session after the 16th call, exit 0, without sending the last result; three repeats run
whole). Each result is read from the next call's recorded prompt and counted as
whole, capped (Qwen Code's own notice for results over 30,000 characters, with the whole result in the file it
names and a true preview), truncated or empty. ``--load N`` keeps N busy loops running meanwhile (default 2, the
machine's two cores).

``--variant`` picks the shell path: ``fixed`` (the adapter as shipped: child_process with the preload that waits
for the output), ``child_process`` (the preload made empty: Qwen Code's own headless path) or ``pty``
(``tools.shell.enableInteractiveShell: true``, the adapter's setting before). The other two only override files
of the adapter's launch (``home_files``), so the adapter itself is what ``fixed`` measures.

Run: ``.venv/bin/python -m bench.qwen_shell_output [--sessions 6] [--repeats 3] [--variant fixed ...]``.
Needs ``scripts/setup_harnesses.sh`` and bubblewrap.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from gateway.harnesses import HarnessContext, ProxyEndpoints, get_adapter
from gateway.harnesses.qwen_shell_drain import PRELOAD_NAME
from integration_tests.support.harnesses import BIN_DIR, clis_installed, final_turn, run_harness, tool_call_turn
from integration_tests.support.qwen_output import Outcome, classify, file_name, known_bytes, tool_result_text
from polar_core.model_fixtures import build_tiny_tokenizer

HARNESS = "qwen-code"
SIZES = (10, 4096, 20480, 1048576)
VARIANTS = ("fixed", "child_process", "pty")


def _adapter_settings() -> dict[str, Any]:
    """The settings.json the adapter writes (a dry run of the pure adapter)."""
    url = "http://127.0.0.1:1"
    ctx = HarnessContext(
        home=PurePosixPath("/h"), workspace=PurePosixPath("/w"), tmp=PurePosixPath("/t"), instruction="i",
        endpoints=ProxyEndpoints(token="t", openai_base_url=url + "/v1"), model="m", bin_dir=PurePosixPath(BIN_DIR),
    )  # fmt: skip
    settings: dict[str, Any] = json.loads(str(get_adapter(HARNESS).prepare(ctx).files[".qwen/settings.json"]))
    return settings


def variant_files(variant: str) -> dict[str, str]:
    """Files written over the adapter's own for ``variant`` (none for ``fixed``)."""
    if variant == "fixed":
        return {}
    files = {f".polar/{PRELOAD_NAME}": "// disabled by bench.qwen_shell_output\n"}
    if variant == "pty":
        settings = _adapter_settings()
        settings["tools"]["shell"]["enableInteractiveShell"] = True
        files[".qwen/settings.json"] = json.dumps(settings, indent=2) + "\n"
    return files


@contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes spinning a core each, stopped on exit."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


async def one_session(
    variant: str, sizes: Sequence[int], tokenizer: Any, tmp: Path
) -> tuple[list[tuple[int, Outcome]], str]:
    """Run one session that cats each of ``sizes`` in order; its outcomes, and an error ('' when it ran).

    Every call cats its own copy of the file: Qwen Code's loop detection ends a session that repeats a command.
    """
    names = [file_name(size, copy) for copy, size in enumerate(sizes, 1)]
    turns = [tool_call_turn(HARNESS, f"cat ~/{name}") for name in names] + [final_turn(HARNESS, "Done.")]
    home_files = {name: known_bytes(size) for name, size in zip(names, sizes, strict=True)} | variant_files(variant)
    run = await run_harness(HARNESS, turns, tmp=tmp, tokenizer=tokenizer, timeout_s=600, home_files=home_files)
    outcomes = []
    # Each result is in the prompt of the call after it; a session that ended early still counts what it showed.
    for i, size in enumerate(sizes[: len(run.completions) - 1]):
        text = tool_result_text(run.completions[i + 1].request)
        outcomes.append((size, classify(text, known_bytes(size))))
    error = ""
    if run.exit_code != 0 or len(run.completions) != len(sizes) + 1:
        error = f"exit {run.exit_code}, {len(run.completions)} calls: {run.stderr[-300:]}"
    return outcomes, error


async def measure(variant: str, sessions: int, repeats: int, sizes: Sequence[int]) -> dict[str, Any]:
    """Counts per size for ``variant`` over ``sessions`` sessions."""
    tokenizer = build_tiny_tokenizer()
    counts: dict[int, collections.Counter[str]] = {size: collections.Counter() for size in sizes}
    errors = []
    plan = [size for _ in range(repeats) for size in sizes]
    for n in range(sessions):
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"qwen-output-{variant}-") as tmp:
            outcomes, error = await one_session(variant, plan, tokenizer, Path(tmp))
        if error:
            errors.append(error)
        for size, outcome in outcomes:
            counts[size][outcome.value] += 1
        took = time.monotonic() - started
        print(f"  {variant} session {n + 1}/{sessions} ({took:.0f} s): {error or 'ok'}", file=sys.stderr)
    return {"variant": variant, "counts": {size: dict(c) for size, c in counts.items()}, "errors": errors}


def render(results: Sequence[Mapping[str, Any]]) -> str:
    """The counts as a Markdown table."""
    lines = [
        "| variant | output | whole | capped (its notice) | truncated | empty | runs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        for size, c in result["counts"].items():
            total = sum(c.values())
            cells = [str(c.get(o.value, 0)) for o in (Outcome.WHOLE, Outcome.CAPPED, Outcome.TRUNCATED, Outcome.EMPTY)]
            lines.append(f"| {result['variant']} | {size:,} B | " + " | ".join(cells) + f" | {total} |")
        if result["errors"]:
            lines.append(f"| {result['variant']} | failed sessions: {len(result['errors'])} | | | | | |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, run the sessions under load, print the table; 1 when any result was cut or empty."""
    parser = argparse.ArgumentParser(prog="python -m bench.qwen_shell_output", description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=6, help="sessions per variant (default 6)")
    parser.add_argument("--repeats", type=int, default=3, help="times each size is catted per session (default 3)")
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES), help="output sizes in bytes")
    parser.add_argument("--variant", nargs="*", choices=VARIANTS, default=["fixed"], help="shell paths to measure")
    parser.add_argument("--load", type=int, default=2, help="busy loops running meanwhile (default 2)")
    parser.add_argument("--json", type=Path, default=None, help="also write the counts as JSON here")
    args = parser.parse_args(argv)
    if shutil.which("bwrap") is None or not clis_installed():
        print("needs bubblewrap and the harness CLIs (scripts/setup_harnesses.sh)", file=sys.stderr)
        return 2
    with busy_loops(args.load):
        results = [asyncio.run(measure(v, args.sessions, args.repeats, args.sizes)) for v in args.variant]
    print(render(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    bad = any(c.get(o, 0) for r in results for c in r["counts"].values() for o in (Outcome.TRUNCATED, Outcome.EMPTY))
    return 1 if bad or any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
