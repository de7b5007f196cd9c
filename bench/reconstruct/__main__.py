"""Benchmark reconstruction.

1. Prefix comparison: a 200-call append-only session whose prompts grow to 8k, 16k and 32k tokens (cost
   should grow linearly with the prompt tokens). The one-time list → int32 array conversion, the chain
   building (the comparison phase, vectorised), and the whole ``reconstruct_session`` are timed separately,
   against the same rule on Python lists with an element-by-element loop and with C-level slice equality,
   all in the same run.
2. Trainer units: traces and trained tokens of per-request, prefix-merge and exact, on recorded sessions
   (``--sessions completions.jsonl``) or, without them, on synthetic harness-shaped sessions (labelled so).
3. Export: traces.jsonl versus Parquet.

Run: ``.venv/bin/python -m bench.reconstruct [--sizes 8192,16384,32768] [--calls 200] [--repeat 5]
[--sessions completions.jsonl [--end-of-turn-id N | --tokenizer DIR]]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from bench.reconstruct.naive import loop_starts_with, naive_prefix_merge, slice_starts_with
from polar_core.export import write_parquet
from polar_core.record_delta import expand_rows
from polar_core.records import CompletionRecord, ReconstructionStrategy, read_jsonl, write_jsonl
from reconstructor import ReconstructionOptions, ReconstructionResult, reconstruct, reconstruct_session
from reconstructor.chains import prepare
from reconstructor.core import build_chains
from reconstructor.eot import detect_end_of_turn_ids, end_of_turn_ids_from_tokenizer
from reconstructor.synthetic import IM_END, SyntheticSpec, growing_session, synthetic_session

T = TypeVar("T")

HARNESS_SHAPES: dict[str, SyntheticSpec] = {
    # A coding agent: long system prompt, tool outputs, subagents, a compaction, few re-tokenised turns.
    "coding agent (subagents, compaction)": SyntheticSpec(
        turns=60,
        system_tokens=2000,
        response_tokens=200,
        tool_tokens=800,
        retokenize_prob=0.05,
        truncate_prob=0.02,
        compaction_every=40,
        subagents=3,
        subagent_turns=12,
    ),
    # A text-in/text-out harness whose template re-tokenises a third of the turns, with forked branches.
    "text harness (re-tokenising, forks)": SyntheticSpec(
        turns=30,
        system_tokens=1000,
        response_tokens=120,
        tool_tokens=400,
        retokenize_prob=0.3,
        forks=2,
        subagent_turns=6,
    ),
    # Best-of-n tool turns: some turns are sampled 2-3 times with identical prompts.
    "parallel samples (identical prompts)": SyntheticSpec(
        turns=30, system_tokens=1000, response_tokens=120, tool_tokens=400, parallel_prob=0.2
    ),
}


def _best_of(fn: Callable[[], T], repeat: int, *, min_seconds: float = 0.3) -> tuple[float, T]:
    """Return the fastest of at least ``repeat`` timed runs (more, up to 200, until ``min_seconds`` passed)."""
    out = fn()  # one untimed warm-up run
    best, spent, runs = float("inf"), 0.0, 0
    while runs < max(repeat, 1) or (spent < min_seconds and runs < 200):
        start = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - start
        best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
    return best, out


def _as_loaded(records: Sequence[CompletionRecord]) -> list[CompletionRecord]:
    """Round-trip through JSON, so that token IDs are distinct int objects as when read from completions.jsonl."""
    return [CompletionRecord.from_dict(json.loads(json.dumps(r.to_dict()))) for r in records]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
            + " |"
        )

    rule = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def bench_prefix(sizes: Sequence[int], calls: int, repeat: int) -> None:
    """Part 1: the comparison phase at several prompt sizes, numpy versus Python lists."""
    options = ReconstructionOptions(strategy=ReconstructionStrategy.PREFIX_MERGE, end_of_turn_ids=(IM_END,))
    rows: list[list[str]] = []
    ratios: list[list[str]] = []
    for size in sizes:
        records = _as_loaded(growing_session(random.Random(size), f"g{size}", calls=calls, max_prompt_tokens=size))
        prompt_tokens = sum(len(r.prompt_token_ids) for r in records)
        convert_s, prepared = _best_of(functools.partial(prepare, records), repeat)
        build_s, builder = _best_of(functools.partial(build_chains, prepared, options, (IM_END,)), repeat)
        e2e_s, result = _best_of(functools.partial(reconstruct_session, records, options), repeat)
        loop_s, naive = _best_of(functools.partial(naive_prefix_merge, records, IM_END, loop_starts_with), repeat)
        slice_s, by_slice = _best_of(functools.partial(naive_prefix_merge, records, IM_END, slice_starts_with), repeat)
        # All implementations must agree before any timing is reported.
        assert naive.groups == by_slice.groups == [t.call_ids for t in result.traces], "implementations disagree"
        assert naive.tokens == [t.response_token_ids for t in result.traces], "implementations disagree"
        assert naive.compared_tokens == builder.compared_tokens, (naive.compared_tokens, builder.compared_tokens)
        compared = builder.compared_tokens
        rows.append(
            [
                f"{size // 1024}k",
                f"{max(len(r.prompt_token_ids) for r in records):,}",
                f"{prompt_tokens / 1e6:.2f} M",
                f"{compared / 1e6:.2f} M",
                f"{convert_s * 1e3:.1f}",
                f"{build_s * 1e3:.2f}",
                f"{e2e_s * 1e3:.1f}",
                f"{loop_s * 1e3:.1f}",
                f"{slice_s * 1e3:.1f}",
                f"{compared / build_s / 1e6:,.0f}",
                f"{compared / loop_s / 1e6:,.0f}",
                f"{compared / slice_s / 1e6:,.0f}",
                f"{build_s / prompt_tokens * 1e9:.2f}",
                f"{e2e_s / prompt_tokens * 1e9:.1f}",
            ]
        )
        ratios.append(
            [
                f"{size // 1024}k",
                f"{loop_s / build_s:,.0f}×",
                f"{slice_s / build_s:,.1f}×",
                f"{loop_s / (convert_s + build_s):.2f}×",
                f"{loop_s / e2e_s:.2f}×",
                f"{slice_s / e2e_s:.2f}×",
            ]
        )
    print(f"## Prefix comparison: {calls}-call append-only session (prefix-merge), best of {repeat}+ runs\n")
    print(
        "convert = list → int32 arrays, once per record; compare = chain building on the arrays (all prefix\n"
        "comparisons); end-to-end = reconstruct_session (convert + compare + traces); py loop / list slice =\n"
        "the same rule on Python lists (bench/reconstruct/naive.py). Token IDs are distinct int objects, as\n"
        "after reading completions.jsonl.\n"
    )
    header = [
        "max prompt",
        "longest",
        "prompt tokens",
        "compared",
        "convert ms",
        "compare ms",
        "end-to-end ms",
        "py loop ms",
        "list slice ms",
        "compare Mtok/s",
        "py loop Mtok/s",
        "list slice Mtok/s",
        "compare ns/prompt token",
        "end-to-end ns/prompt token",
    ]
    print(_table(header, rows))
    print()
    ratio_header = [
        "max prompt",
        "py loop / compare",
        "list slice / compare",
        "py loop / (convert + compare)",
        "py loop / end-to-end",
        "list slice / end-to-end",
    ]
    print(_table(ratio_header, ratios))
    print()


def _strategy_table(records: Sequence[CompletionRecord], eot: tuple[int, ...], repeat: int) -> str:
    base: ReconstructionResult | None = None
    rows: list[list[str]] = []
    variants = [(s.value, ReconstructionOptions(strategy=s, end_of_turn_ids=eot)) for s in ReconstructionStrategy]
    variants.insert(
        2, ("prefix-merge, prefer exact", ReconstructionOptions(end_of_turn_ids=eot, prefer_exact_context=True))
    )
    for label, options in variants:
        seconds, result = _best_of(functools.partial(reconstruct, records, options), repeat, min_seconds=0.0)
        base = base or result
        st = result.stats
        rows.append(
            [
                label,
                f"{st.chains:,}",
                f"{st.chains / base.stats.chains:.3f}",
                f"{st.total_tokens:,}",
                f"{st.total_tokens / base.stats.total_tokens:.3f}",
                f"{st.trainable_tokens:,}",
                f"{sum(1 for t in result.traces if t.exact_context)}/{len(result.traces)}",
                f"{st.mismatched_context_calls:,}",
                f"{st.mismatched_context_tokens / max(st.trainable_tokens, 1):.1%}",
                ", ".join(f"{k} {v}" for k, v in sorted(st.splits_by_reason.items())) or "-",
                f"{seconds * 1e3:.1f}",
            ]
        )
    header = [
        "strategy",
        "trainer units",
        "× per-request",
        "trained tokens",
        "× per-request",
        "trainable",
        "exact traces",
        "inexact calls",
        "inexact tokens",
        "splits",
        "ms",
    ]
    return _table(header, rows)


def bench_units(sessions: Path | None, eot: tuple[int, ...], synthetic_sessions: int, repeat: int) -> None:
    """Part 2: trainer units and trained tokens per strategy."""
    if sessions is not None:
        records = list(expand_rows(read_jsonl(sessions)))
        eot = eot or detect_end_of_turn_ids(records)
        count = len({r.session_id for r in records})
        print(f"## Trainer units on recorded sessions: {sessions} ({count} sessions, {len(records)} calls)\n")
        print(_strategy_table(records, eot, repeat))
        print()
        return
    print("## Trainer units on SYNTHETIC harness-shaped sessions (no recorded sessions given)\n")
    print("'trained tokens' = prompt + response tokens the trainer processes; 'trainable' = mask-1 tokens.\n")
    for label, spec in HARNESS_SHAPES.items():
        rng = random.Random(0)
        records = [r for s in range(synthetic_sessions) for r in synthetic_session(rng, spec, f"{label[:4]}{s}")]
        print(f"### synthetic: {label}, {synthetic_sessions} sessions, {len(records)} calls\n")
        print(_strategy_table(_as_loaded(records), (IM_END,), repeat))
        print()


def bench_export(repeat: int) -> None:
    """Part 3: writing prefix-merge traces as JSON lines and as Parquet."""
    spec = HARNESS_SHAPES["coding agent (subagents, compaction)"]
    rng = random.Random(0)
    records = [r for s in range(8) for r in synthetic_session(rng, spec, f"e{s}")]
    traces = reconstruct(records, ReconstructionOptions(end_of_turn_ids=(IM_END,))).traces
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, parquet = Path(tmp) / "traces.jsonl", Path(tmp) / "traces.parquet"
        js, _ = _best_of(lambda: write_jsonl(jsonl, (t.to_dict() for t in traces)), repeat)
        pq_s, _ = _best_of(lambda: write_parquet(traces, parquet), repeat)
        jb, pb = jsonl.stat().st_size, parquet.stat().st_size
    print(f"## Export of {len(traces)} prefix-merge traces\n")
    rows = [
        ["traces.jsonl", f"{js * 1e3:.1f}", f"{jb / 1e6:.2f}", "1.000"],
        ["traces.parquet (zstd)", f"{pq_s * 1e3:.1f}", f"{pb / 1e6:.2f}", f"{pb / jb:.3f}"],
    ]
    print(_table(["format", "write ms", "MB", "size ratio"], rows))
    print()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print markdown tables."""
    parser = argparse.ArgumentParser(prog="python -m bench.reconstruct")
    parser.add_argument("--sizes", default="8192,16384,32768", help="largest prompt of each prefix workload")
    parser.add_argument("--calls", type=int, default=200, help="calls of each prefix workload")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sessions", type=Path, help="completions.jsonl of recorded sessions for part 2")
    eot_group = parser.add_mutually_exclusive_group()
    eot_group.add_argument("--end-of-turn-id", type=int, action="append", dest="end_of_turn_ids")
    eot_group.add_argument("--tokenizer", type=Path, help="tokenizer directory naming the end-of-turn token")
    parser.add_argument("--synthetic-sessions", type=int, default=8, help="sessions per synthetic harness shape")
    parser.add_argument("--skip", choices=["prefix", "units", "export"], action="append", default=[])
    args = parser.parse_args(argv)

    eot: tuple[int, ...] = tuple(args.end_of_turn_ids or ())
    if args.tokenizer is not None:
        eot = end_of_turn_ids_from_tokenizer(args.tokenizer)
    print(f"# bench.reconstruct on {platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}\n")
    if "prefix" not in args.skip:
        bench_prefix([int(s) for s in args.sizes.split(",")], args.calls, args.repeat)
    if "units" not in args.skip:
        bench_units(args.sessions, eot, args.synthetic_sessions, max(args.repeat // 2, 1))
    if "export" not in args.skip:
        bench_export(max(args.repeat // 2, 1))


if __name__ == "__main__":
    main()
