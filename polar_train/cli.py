"""``polar train CONFIG.yaml [--run-dir DIR] [--steps N] [--overwrite | --resume]``: the reference GRPO trainer."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``train`` subcommand to the ``polar`` parser (``func`` returns the exit code)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "train", help="train a policy with asynchronous GRPO through Polar (see docs/training.md)"
    )
    parser.add_argument("config", type=Path, help="the training config (YAML)")
    parser.add_argument("--run-dir", type=Path, default=None, help="replace the config's run_dir")
    parser.add_argument("--steps", type=int, default=None, help="replace the config's steps")
    parser.add_argument("--seed", type=int, default=None, help="replace the config's seed")
    parser.add_argument("--overwrite", action="store_true", help="replace a run directory that holds a run")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in the run directory: its stored policy (version and checkpoint) is served and "
        "trained from, and the steps metrics.jsonl holds are not run again",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``polar train``; print one line per step and the table at the end."""
    from polar_client.evaluation import read_reports
    from polar_core.errors import InvalidArgument
    from polar_run.run import prepare_out_dir
    from polar_train.config import load_config
    from polar_train.evaluation import EVAL_REPORT
    from polar_train.metrics import StepMetrics, first_and_last, format_table, read_metrics
    from polar_train.run import run_training

    config = load_config(args.config, run_dir=args.run_dir, steps=args.steps, seed=args.seed)
    if args.resume:
        if args.overwrite:
            raise InvalidArgument("--resume and --overwrite contradict each other: choose one")
        if not (config.run_dir / "state").is_dir():
            raise InvalidArgument(f"--resume: {config.run_dir} holds no run to resume (no state/ directory)")
    else:
        prepare_out_dir(config.run_dir, overwrite=args.overwrite)

    def line(row: StepMetrics) -> None:
        lag = row.policy_lag
        print(
            f"step {row.step}: v{row.version} reward {row.reward_mean:.3f} ± {row.reward_std:.3f}  "
            f"lag {lag['min']:.0f}/{lag['mean']:.1f}/{lag['max']:.0f}  stale {row.stale_traces}  "
            f"tokens {row.trainable_tokens}  wait {row.wait_seconds:.1f}s step {row.step_seconds:.2f}s "
            f"update {row.update_seconds:.2f}s",
            flush=True,
        )

    asyncio.run(run_training(config, resume=args.resume, on_step=line))
    rows = read_metrics(config.run_dir / "metrics.jsonl")
    print(format_table(rows))
    first, last = first_and_last(rows, config.steps_averaged)
    print(f"mean reward, first {config.steps_averaged} steps {first:.3f} -> last {config.steps_averaged} {last:.3f}")
    for report in read_reports(config.run_dir / EVAL_REPORT):
        print(
            f"eval round {report['round']}: v{report['policy_version']} mean reward {report['mean_reward']:.3f} "
            f"resolved {report['resolved_rate']:.2f} over {report['sessions']} sessions"
            + (f" ({report['mismatched_sessions']} mismatched, left out)" if report["mismatched_sessions"] else "")
        )
    written = "metrics.jsonl, reward_curve.png, checkpoints/" + (
        ", eval.jsonl, eval_sessions.jsonl" if config.eval_every else ""
    )
    print(f"run directory {config.run_dir}: {written}", file=sys.stderr)
    return 0
