"""Paths inside a task file are relative to the file; the services that read them never see that file.

Every reader of ``TASK.yaml`` (``polar run``, ``polar submit`` and the trainer client, the evaluator's helpers)
makes them absolute here, before the task leaves the machine it was read on: ``evaluator.repo`` and
``metadata.repo`` always, ``evaluator.test_patch`` only when it names an existing file (it may also be the
text of a diff).

The services that read those paths on their own host (gateway, evaluator, and the rollout server when it checks a
submission) refuse, with :func:`check_task_paths`, any that does not lie under the operator's ``task_roots``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from polar_core.errors import InvalidArgument

__all__ = ["absolute_path", "check_task_paths", "host_paths", "resolve_task_paths"]

_EVALUATOR_PATHS = ("repo", "repo_path", "test_patch", "tests_dir")  # tests_dir: the harbor strategy's


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


def host_paths(task: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """The host paths a task names, as ``(field, path)``: ``metadata.repo``, ``evaluator.repo``,
    ``evaluator.repo_path``, ``evaluator.tests_dir`` and ``evaluator.test_patch`` when it is one line (more lines
    are the diff's text).

    ``task`` has the task file's shape; the evaluator's options may sit in ``evaluator`` or ``evaluator.options``.
    """
    metadata = task.get("metadata")
    if isinstance(metadata, Mapping) and _is_path(metadata.get("repo")):
        yield "metadata.repo", metadata["repo"]
    evaluator = task.get("evaluator")
    if not isinstance(evaluator, Mapping):
        return
    tables = [evaluator]
    if isinstance(evaluator.get("options"), Mapping):
        tables.append(evaluator["options"])
    for table in tables:
        for key in _EVALUATOR_PATHS:
            if _is_path(table.get(key)):
                yield f"evaluator.{key}", table[key]


def check_task_paths(task: Mapping[str, Any], roots: Sequence[Path]) -> None:
    """Refuse a task whose host paths (:func:`host_paths`) do not resolve, after symlinks, under ``roots``.

    Raises:
        InvalidArgument: A relative path, or one outside every root (the message names the field).
    """
    real_roots = [Path(os.path.realpath(root)) for root in roots]
    for field, value in host_paths(task):
        path = Path(value)
        real = Path(os.path.realpath(path))
        if not path.is_absolute() or not any(real == r or r in real.parents for r in real_roots):
            raise InvalidArgument(
                f"{field} {value!r} is not under the operator's task roots "
                f"({', '.join(map(str, roots)) or 'none configured'})",
                details={"field": field},
            )


def _is_path(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and "\n" not in value
