"""The reference asynchronous GRPO trainer over Polar (``polar train``; see ``docs/training.md``).

It submits groups of sessions with :mod:`polar_client`, consumes their results from ``WatchTask`` as they
finish, builds tensors from the traces, steps with group-relative advantages and truncated importance
sampling, saves a checkpoint and moves the fleet with ``UpdatePolicy``, while the next groups keep sampling
within ``max_policy_lag``.
"""

from __future__ import annotations

from polar_train.batch import Batch, LagBoundViolated, SessionSample, build_batch, check_lag_bound, trace_lag
from polar_train.config import TrainConfig, load_config
from polar_train.loop import PolicyUpdater, RolloutUpdater, Trainer
from polar_train.loss import StepSettings, advantages, policy_loss, train_on_batch
from polar_train.metrics import StepMetrics, format_table, plot_reward_curve, read_metrics
from polar_train.run import UpdaterFactory, run_training

__all__ = [
    "Batch",
    "LagBoundViolated",
    "PolicyUpdater",
    "RolloutUpdater",
    "SessionSample",
    "StepMetrics",
    "StepSettings",
    "TrainConfig",
    "Trainer",
    "UpdaterFactory",
    "advantages",
    "build_batch",
    "check_lag_bound",
    "format_table",
    "load_config",
    "plot_reward_curve",
    "policy_loss",
    "read_metrics",
    "run_training",
    "trace_lag",
    "train_on_batch",
]
