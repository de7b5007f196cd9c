"""The trainer's evaluation lane: ``eval_tasks`` turned into :class:`polar_client.EvalTask` and an
:class:`polar_client.EvalLane` writing ``eval.jsonl`` and ``eval_sessions.jsonl`` to the run directory.

The lane itself (pinning, the version check, the report) lives in :mod:`polar_client.evaluation`, so a trainer
that is not this one uses the same code.
"""

from __future__ import annotations

from pathlib import Path

from polar.common.v1 import task_pb2

from polar_client.evaluation import EvalClient, EvalLane, EvalTask
from polar_train.config import TrainConfig
from polar_train.tasks import GroupTemplate, load_template

__all__ = ["EVAL_REPORT", "EVAL_SESSIONS", "build_eval_lane", "eval_task_dirs", "eval_tasks"]

EVAL_REPORT = "eval.jsonl"
EVAL_SESSIONS = "eval_sessions.jsonl"


def eval_task_dirs(config: TrainConfig) -> tuple[Path, ...]:
    """The directories of the eval task files (the embedded stack must admit them, as the template's)."""
    return tuple(sorted({entry.task.parent.resolve() for entry in config.eval_tasks if entry.task is not None}))


def eval_tasks(config: TrainConfig, template: GroupTemplate) -> list[EvalTask]:
    """The held-out tasks of ``config``, prepared like the training template (``{python}``, ``{task_dir}``).

    Eval tasks carry no staleness bound and keep stale sessions: the lane checks each session against its pinned
    version itself, and a resampled session would sample the fleet's current version, not the pinned one.

    Raises:
        InvalidArgument: A malformed eval task file.
        FailedPrecondition: Its harness is a CLI that is not installed.
    """
    tasks: list[EvalTask] = []
    templates: dict[Path, GroupTemplate] = {}
    for entry, name in zip(config.eval_tasks, config.eval_task_names(), strict=True):
        source = template
        if entry.task is not None:
            if entry.task not in templates:
                templates[entry.task] = load_template(entry.task, max_policy_lag=0, stale_policy="keep")
            source = templates[entry.task]
        assert entry.samples is not None  # TrainConfig checked it
        message = source.task(name, group_size=entry.samples, instruction=entry.instruction or None)
        message.ClearField("max_policy_lag")
        message.stale_policy = task_pb2.STALE_POLICY_KEEP
        tasks.append(EvalTask(message, entry.samples))
    return tasks


def build_eval_lane(config: TrainConfig, client: EvalClient, tasks: list[EvalTask]) -> EvalLane | None:
    """The run's evaluation lane over ``tasks`` (:func:`eval_tasks`; None when ``eval_every`` is 0)."""
    if not config.eval_every:
        return None
    return EvalLane(
        client,
        tasks,
        task_id_prefix=f"{config.run_dir.name}-seed{config.seed}",
        report_path=config.run_dir / EVAL_REPORT,
        sessions_path=config.run_dir / EVAL_SESSIONS,
        task_timeout_s=config.task_timeout_s,
    )
