"""The config file and the run directory's metrics: table, JSONL and the reward curve."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_core.errors import InvalidArgument
from polar_train.config import load_config
from polar_train.metrics import StepMetrics, append_metrics, format_table, plot_reward_curve, read_metrics

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train" / "tiny.yaml"


def test_the_example_config_loads_with_paths_relative_to_it() -> None:
    config = load_config(EXAMPLE, steps=3)
    assert config.steps == 3
    assert config.model == "tiny"
    assert config.task == EXAMPLE.parent / "lowercase" / "task.yaml"
    assert config.task.is_file()
    assert config.submit_next == "before_update"
    assert len(config.instructions) == 2


def test_submitting_ahead_needs_a_lag_bound_of_at_least_one(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: tiny\ntask: t.yaml\nrun_dir: r\nmax_policy_lag: 0\nsubmit_next: before_update\n")
    with pytest.raises(InvalidArgument, match="max_policy_lag >= 1"):
        load_config(path)
    path.write_text("model: tiny\ntask: t.yaml\nrun_dir: r\nmax_policy_lag: 0\nsubmit_next: after_update\n")
    assert load_config(path).max_policy_lag == 0
    path.write_text("model: tiny\ntask: t.yaml\nrun_dir: r\nlearning_rate: -1\n")
    with pytest.raises(InvalidArgument, match="learning_rate"):
        load_config(path)


def _row(step: int, reward: float) -> StepMetrics:
    return StepMetrics(
        step=step,
        version=step,
        sampled_versions=[max(step - 1, 0), step],
        reward_mean=reward,
        reward_std=0.1,
        group_reward_std=0.05,
        sessions={"resolved": 3, "unresolved": 13},
        policy_lag={"min": 0.0, "mean": 0.5, "max": 1.0},
        stale_traces=0,
        stale_tokens=0,
        max_trained_lag=1,
        trainable_tokens=400,
        wait_seconds=30.0,
        step_seconds=0.5,
        save_seconds=0.1,
        update_seconds=0.2,
        loss={"loss": 0.01},
    )


def test_metrics_round_trip_and_render(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    for step, reward in enumerate([0.5, 0.6, 0.75]):
        append_metrics(path, _row(step, reward))
    rows = read_metrics(path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    table = format_table(rows).splitlines()
    assert "ratio" in table[0]
    assert "1.50" in table[3]  # 0.75 / 0.5
    assert "resolved=3 unresolved=13" in table[1]
    plot_reward_curve(rows, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
