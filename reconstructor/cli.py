"""``polar reconstruct IN.jsonl OUT.{jsonl,parquet} --strategy S [--end-of-turn-id N | --tokenizer DIR]``.

Completions in, traces out, with the statistics printed (and optionally written as JSON). A
``sessions.jsonl`` as written by ``polar run`` supplies each session's task id, reward and status.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from polar_core.errors import InvalidArgument
from polar_core.export import write_parquet
from polar_core.record_delta import expand_rows
from polar_core.records import (
    ReconstructionStats,
    ReconstructionStrategy,
    TerminalStatus,
    read_jsonl,
    write_jsonl,
)
from reconstructor.core import ReconstructionOptions, SessionOutcome, reconstruct
from reconstructor.eot import end_of_turn_ids_from_tokenizer
from reconstructor.trace_weights import WeightingMode

__all__ = ["add_parser", "load_outcomes", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``reconstruct`` subcommand to the ``polar`` parser (``func`` returns the exit code)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "reconstruct", help="turn completions.jsonl into traces (jsonl or parquet)"
    )
    _configure(parser)
    return parser


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", type=Path, help="completions.jsonl")
    parser.add_argument("output", type=Path, help="traces file: .jsonl, or .parquet")
    parser.add_argument(
        "--strategy",
        choices=[s.value for s in ReconstructionStrategy],
        default=ReconstructionStrategy.PREFIX_MERGE.value,
        help="reconstruction strategy (default prefix-merge)",
    )
    eot = parser.add_mutually_exclusive_group()
    eot.add_argument(
        "--end-of-turn-id", type=int, action="append", dest="end_of_turn_ids", help="end-of-turn token ID (repeatable)"
    )
    eot.add_argument("--tokenizer", type=Path, help="tokenizer directory naming the end-of-turn token")
    parser.add_argument("--sessions", type=Path, help="sessions.jsonl with session_id, task_id, status, reward")
    parser.add_argument("--weighting", choices=[w.value for w in WeightingMode], default=WeightingMode.SESSION.value)
    parser.add_argument(
        "--split-on-policy-version",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="never merge calls of different policy versions into one trace (default; --no-... opts out)",
    )
    parser.add_argument(
        "--prefer-exact-context",
        action="store_true",
        help="prefix-merge: among qualifying chains prefer a context-exact merge (not Polar's rule; off by default)",
    )
    parser.add_argument("--stats", type=Path, help="also write the statistics to this JSON file")
    parser.set_defaults(func=run)


def load_outcomes(path: Path) -> dict[str, SessionOutcome]:
    """Read each session's task id, reward and status from a ``sessions.jsonl``."""
    outcomes: dict[str, SessionOutcome] = {}
    for row in read_jsonl(path):
        try:
            outcomes[str(row["session_id"])] = SessionOutcome(
                task_id=str(row.get("task_id", "")),
                reward=float(row.get("reward", 0.0)),
                status=TerminalStatus(row.get("status", TerminalStatus.UNRESOLVED.value)),
            )
        except (KeyError, ValueError) as exc:
            raise InvalidArgument(f"{path}: bad session row {row!r}: {exc}") from None
    return outcomes


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; print a summary; return the exit code."""
    eot: tuple[int, ...] = tuple(args.end_of_turn_ids or ())
    if args.tokenizer is not None:
        eot = end_of_turn_ids_from_tokenizer(args.tokenizer)
    options = ReconstructionOptions(
        strategy=ReconstructionStrategy(args.strategy),
        end_of_turn_ids=eot,
        weighting=WeightingMode(args.weighting),
        split_on_policy_version=args.split_on_policy_version,
        prefer_exact_context=args.prefer_exact_context,
    )
    outcomes = load_outcomes(args.sessions) if args.sessions else {}
    records = list(expand_rows(read_jsonl(args.input)))  # the run's file, or a proxy's (with delta lines)
    result = reconstruct(records, options, outcomes)
    if args.output.suffix == ".parquet":
        write_parquet(result.traces, args.output)
    else:
        write_jsonl(args.output, (t.to_dict() for t in result.traces))
    if args.stats:
        args.stats.write_text(json.dumps(result.stats.to_dict(), indent=2) + "\n", encoding="utf-8")
    print(_summary(result.stats, options.strategy, args.output))
    return 0


def _summary(stats: ReconstructionStats, strategy: ReconstructionStrategy, output: Path) -> str:
    splits = ", ".join(f"{k}={v}" for k, v in sorted(stats.splits_by_reason.items())) or "none"
    share = stats.mismatched_context_tokens / stats.trainable_tokens if stats.trainable_tokens else 0.0
    return "\n".join(
        [
            f"{strategy.value}: {stats.calls} calls -> {stats.chains} traces ({stats.merges} merges) in {output}",
            f"splits: {splits}",
            f"tokens: {stats.total_tokens} total, {stats.trainable_tokens} trainable, "
            f"{stats.mismatched_context_tokens} with inexact context ({share:.1%}) in "
            f"{stats.mismatched_context_calls} calls",
        ]
    )
