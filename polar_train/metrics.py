"""Per-step metrics: one JSON line per step in ``metrics.jsonl`` and the reward curve ``reward_curve.png``."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "StepMetrics",
    "append_metrics",
    "first_and_last",
    "format_table",
    "group_spread",
    "plot_reward_curve",
    "read_metrics",
]


@dataclasses.dataclass(frozen=True, slots=True)
class StepMetrics:
    """What one step did.

    Attributes:
        step: The step index (0-based).
        version: The version trained (the new weights become ``version + 1``).
        sampled_versions: The distinct policy versions the step's trainable tokens were sampled under.
        reward_mean: Mean session reward over the step's groups.
        reward_std: Standard deviation of the session rewards (population).
        group_reward_std: Mean within-group standard deviation (what gives GRPO its signal).
        sessions: Sessions by terminal status.
        policy_lag: ``min``/``mean``/``max`` lag of the traces that reached the loss.
        stale_traces: Traces dropped for being beyond the lag bound.
        stale_tokens: Their trainable tokens (none of them reached the loss).
        max_trained_lag: The largest lag of a token that reached the loss (never above the bound).
        trainable_tokens: Mask-1 tokens that reached the loss.
        wait_seconds: Seconds spent waiting for the step's results after the previous update.
        step_seconds: Seconds of the optimiser step.
        save_seconds: Seconds to write the checkpoint.
        update_seconds: Seconds of ``UpdatePolicy``.
        loss: The loss and its diagnostics (TIS weight, truncated fraction).
    """

    step: int
    version: int
    sampled_versions: list[int]
    reward_mean: float
    reward_std: float
    group_reward_std: float
    sessions: dict[str, int]
    policy_lag: dict[str, float]
    stale_traces: int
    stale_tokens: int
    max_trained_lag: int
    trainable_tokens: int
    wait_seconds: float
    step_seconds: float
    save_seconds: float
    update_seconds: float
    loss: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``metrics.jsonl``."""
        return dataclasses.asdict(self)


def append_metrics(path: Path, row: StepMetrics) -> None:
    """Append one step to ``metrics.jsonl`` (flushed, so a crashed run keeps its finished steps)."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(row.to_dict(), separators=(",", ":")) + "\n")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The per-step table: reward, its ratio to step 0's, spread, lag, tokens, seconds."""
    lines = [
        f"{'step':>4} {'ver':>3} {'reward':>7} {'ratio':>6} {'std':>6} {'grp_std':>7} {'lag':>9} {'stale':>5} "
        f"{'tokens':>6} {'wait_s':>6} {'step_s':>6} {'upd_s':>6}  sessions"
    ]
    base = rows[0]["reward_mean"] if rows else 0.0
    for r in rows:
        ratio = f"{r['reward_mean'] / base:6.2f}" if base else f"{'-':>6}"
        lag = r["policy_lag"]
        lags = f"{lag['min']:.0f}/{lag['mean']:.1f}/{lag['max']:.0f}"
        sessions = " ".join(f"{k}={v}" for k, v in r["sessions"].items())
        lines.append(
            f"{r['step']:>4} {r['version']:>3} {r['reward_mean']:7.3f} {ratio} {r['reward_std']:6.3f} "
            f"{r['group_reward_std']:7.3f} {lags:>9} {r['stale_traces']:>5} {r['trainable_tokens']:>6} "
            f"{r['wait_seconds']:6.1f} {r['step_seconds']:6.2f} {r['update_seconds']:6.2f}  {sessions}"
        )
    return "\n".join(lines)


def plot_reward_curve(rows: Sequence[dict[str, Any]], path: Path, *, title: str = "reward") -> None:
    """Write the reward curve (mean ± std per step) as a PNG with matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    means = [r["reward_mean"] for r in rows]
    stds = [r["reward_std"] for r in rows]
    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
    axes.plot(steps, means, marker="o", label="mean session reward")
    axes.fill_between(
        steps,
        [m - s for m, s in zip(means, stds, strict=True)],
        [m + s for m, s in zip(means, stds, strict=True)],
        alpha=0.2,
        label="± std",
    )
    axes.set_xlabel("step (policy version trained)")
    axes.set_ylabel("reward")
    axes.set_title(title)
    axes.legend(loc="best")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def group_spread(rewards_by_group: Sequence[Sequence[float]]) -> float:
    """Mean within-group population standard deviation (0.0 without groups)."""
    spreads = [statistics.pstdev(g) for g in rewards_by_group if g]
    return statistics.fmean(spreads) if spreads else 0.0


def first_and_last(rows: Sequence[dict[str, Any]], k: int) -> tuple[float, float]:
    """Mean reward of the first ``k`` and of the last ``k`` steps (the run's before/after comparison)."""
    means = [float(r["reward_mean"]) for r in rows]
    if not means:
        return 0.0, 0.0
    k = max(1, min(k, len(means)))
    return statistics.fmean(means[:k]), statistics.fmean(means[-k:])
