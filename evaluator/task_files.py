"""Read the evaluator part of a task file, resolving its paths relative to the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from evaluator.errors import InvalidOptions
from evaluator.models import EvaluatorSpec

__all__ = ["evaluator_spec_from_task", "load_task_file"]

# Options that name files next to the task file; a remote evaluator cannot resolve them, so the reader does.
_PATH_OPTIONS = ("repo", "test_patch")


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
    options = {k: v for k, v in table.items() if k != "strategy"}
    for key in _PATH_OPTIONS:
        value = options.get(key)
        if isinstance(value, str) and value and "\n" not in value:
            candidate = (task_dir / value).resolve()
            if key == "repo" or candidate.is_file():
                options[key] = str(candidate)
    return EvaluatorSpec(strategy=table["strategy"], options=options)
