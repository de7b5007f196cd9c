"""SubmitTask's policy check: a submitted task (its serialised ``Task``) against the operator's policy.

:class:`TaskCheck` turns the stored ``Task`` bytes back into the task file's shape and runs
:class:`runtimes.sandbox_policy.TaskAdmission` over it, so a task that names a host path outside the task roots,
or whose runtime table widens what the fleet allows, is refused before anything is recorded; so is a SWE-bench instance
the ``swebench`` strategy could not grade (:func:`polar_checks.swebench.check_grading`: a missing field,
an unknown log parser).
So is an unknown harness name or an option key its adapter does not know
(:func:`polar_checks.harnesses.check_harness`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from polar.common.v1 import task_pb2

from polar_checks.harnesses import check_harness
from polar_checks.swebench import check_grading
from polar_core.convert import RUNTIME_KINDS, struct_to_dict
from polar_core.errors import InvalidArgument
from rollout_server.settings import RolloutSettings
from runtimes.sandbox_policy import TaskAdmission

__all__ = ["TaskCheck", "task_mapping"]


def _decode(spec: bytes) -> task_pb2.Task:
    try:
        return task_pb2.Task.FromString(spec)
    except DecodeError:
        raise InvalidArgument("the task is not a polar.common.v1.Task") from None


def task_mapping(spec: bytes) -> dict[str, Any]:
    """The parts of a serialised ``Task`` the policy reads, in the task file's shape.

    Raises:
        InvalidArgument: The bytes are not a ``Task``.
    """
    task = _decode(spec)
    runtime: dict[str, Any] = struct_to_dict(task.runtime.options)
    if task.runtime.kind in RUNTIME_KINDS:
        runtime["kind"] = RUNTIME_KINDS[task.runtime.kind]
    if task.runtime.image:
        runtime["image"] = task.runtime.image
    return {
        "runtime": runtime,
        "evaluator": {"strategy": task.evaluator.strategy, **struct_to_dict(task.evaluator.options)},
        "metadata": struct_to_dict(task.metadata),
    }


class TaskCheck:
    """Checks submitted tasks against the rollout server's policy settings.

    Args:
        admission: The whole-task check.
    """

    def __init__(self, admission: TaskAdmission) -> None:
        self._admission = admission

    @classmethod
    def from_settings(cls, settings: RolloutSettings, *, cwd: Path | None = None) -> TaskCheck:
        """The check of ``settings`` (task roots default to the working directory)."""
        roots = tuple(Path(p).absolute() for p in settings.task_roots) or ((cwd or Path.cwd()).absolute(),)
        return cls(
            TaskAdmission.of(
                task_roots=roots,
                network=settings.runtime_network,
                min_isolation=settings.min_isolation,
                read_only_roots=tuple(Path(p) for p in settings.read_only_roots),
                images=tuple(settings.allowed_images),
            )
        )

    def __call__(self, spec: bytes) -> None:
        """Check one serialised task.

        Raises:
            InvalidArgument: The task breaks the policy, or names a harness or harness option no adapter knows
                (the message and ``details["field"]`` name the field).
        """
        mapping = task_mapping(spec)
        self._admission.check(mapping)
        if mapping["evaluator"]["strategy"] == "swebench":  # an instance the evaluator could not grade
            check_grading(mapping["evaluator"].get("instance"))
        harness = _decode(spec).harness
        if harness.name or harness.options:
            check_harness(harness.name, struct_to_dict(harness.options))
