"""Paths inside a task file are relative to the file; the services that read them never see that file.

Every reader of ``TASK.yaml`` (``polar run``, ``polar submit`` and the trainer client, the evaluator's helpers)
makes them absolute here, before the task leaves the machine it was read on: ``evaluator.repo`` and
``metadata.repo`` always, ``evaluator.test_patch`` only when it names an existing file (it may also be the
text of a diff).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["absolute_path", "resolve_task_paths"]


def absolute_path(value: Any, base: Path, *, must_exist: bool = False) -> Any:
    """``value`` resolved against ``base`` when it is a relative path; anything else is returned unchanged.

    A value that is not a one-line string is not a path. With ``must_exist``, a path that names no existing
    file is left as it was.
    """
    if not isinstance(value, str) or not value or "\n" in value:
        return value
    candidate = (base / value).resolve()
    if must_exist and not candidate.exists():
        return value
    return str(candidate)


def resolve_task_paths(task: Mapping[str, Any], task_dir: Path) -> dict[str, Any]:
    """Return a copy of the parsed task with its file paths made absolute against ``task_dir``."""
    out = copy.deepcopy(dict(task))
    evaluator = out.get("evaluator")
    if isinstance(evaluator, Mapping):
        evaluator = dict(evaluator)
        if "repo" in evaluator:
            evaluator["repo"] = absolute_path(evaluator["repo"], task_dir)
        if "test_patch" in evaluator:
            evaluator["test_patch"] = absolute_path(evaluator["test_patch"], task_dir, must_exist=True)
        out["evaluator"] = evaluator
    metadata = out.get("metadata")
    if isinstance(metadata, Mapping) and "repo" in metadata:
        out["metadata"] = {**metadata, "repo": absolute_path(metadata["repo"], task_dir)}
    return out
