"""Read the evaluator part of a task file, resolving its paths relative to the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from evaluator.errors import InvalidOptions
from evaluator.models import EvaluatorSpec
from polar_core.task_paths import resolve_task_paths

__all__ = ["evaluator_spec_from_task", "load_task_file"]


def load_task_file(path: Path) -> dict[str, Any]:
    """Parse a task file (YAML)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidOptions(f"cannot read task file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidOptions(f"task file {path} is not a mapping")
    return data


def evaluator_spec_from_task(task: dict[str, Any], task_dir: Path) -> EvaluatorSpec:
    """Build the :class:`EvaluatorSpec` of a parsed task, with ``repo``/``test_patch`` made absolute.

    ``test_patch`` is resolved only when it names an existing file (it may also be diff text).
    """
    table = task.get("evaluator") or {"strategy": "session_completed"}
    if not isinstance(table, dict) or not isinstance(table.get("strategy"), str):
        raise InvalidOptions("the task's evaluator needs a 'strategy'")
    options = resolve_task_paths({"evaluator": table}, task_dir)["evaluator"]
    options.pop("strategy")
    return EvaluatorSpec(strategy=table["strategy"], options=options)
