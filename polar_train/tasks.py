"""The trainer's tasks: one group = one task with ``group_size`` samples, built from the config's template."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar.common.v1 import task_pb2

from polar_client import task_from_mapping
from polar_run.run_config import PreparedTask, RunOverrides, find_harness_root, prepare_task

__all__ = ["GroupTemplate", "load_template"]

_REPO = Path(__file__).resolve().parents[1]
_STALE = {"keep": task_pb2.STALE_POLICY_KEEP, "resample": task_pb2.STALE_POLICY_RESAMPLE}


def _substitute(value: Any, values: Mapping[str, str]) -> Any:
    """Replace ``{python}``/``{task_dir}`` in every string of a parsed YAML value."""
    if isinstance(value, str):
        for key, text in values.items():
            value = value.replace(key, text)
        return value
    if isinstance(value, list):
        return [_substitute(v, values) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, values) for k, v in value.items()}
    return value


def _readable(runtime: Any, directory: Path) -> dict[str, Any]:
    """The runtime table with ``directory`` readable inside a local sandbox (absent: a local runtime)."""
    table = dict(runtime or {"kind": "local"})
    if str(table.get("kind", "local")) == "local":
        paths = [str(p) for p in table.get("read_only_paths", [])]
        table["read_only_paths"] = paths if str(directory) in paths else [*paths, str(directory)]
    return table


@dataclasses.dataclass(frozen=True, slots=True)
class GroupTemplate:
    """The prepared task template and how to stamp one group's task out of it.

    Attributes:
        prepared: The template as ``polar run`` prepares it (paths resolved, backend and harness chosen).
        max_policy_lag: Set on every task (the rollout server's staleness bound).
        stale_policy: ``keep`` or ``resample``.
    """

    prepared: PreparedTask
    max_policy_lag: int
    stale_policy: str

    def task(self, task_id: str, *, group_size: int, instruction: str | None = None) -> task_pb2.Task:
        """The task of one group: the template with this id, ``group_size`` samples and, if given, this
        instruction."""
        data = dict(self.prepared.task, task_id=task_id, num_samples=group_size)
        if instruction is not None:
            data["instruction"] = instruction
        message = task_from_mapping(data)
        message.max_policy_lag = self.max_policy_lag
        message.stale_policy = _STALE[self.stale_policy]
        return message


def load_template(path: Path, *, max_policy_lag: int, stale_policy: str) -> GroupTemplate:
    """Read the task template at ``path``, substitute ``{python}`` and ``{task_dir}``, and prepare it.

    The local sandboxes of the agent and of the evaluator may read the template's directory (the agent and
    evaluator scripts live there).

    Raises:
        InvalidArgument: A malformed template.
        FailedPrecondition: Its harness is a CLI that is not installed.
    """
    import yaml

    task_dir = path.parent.resolve()
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    data = _substitute(raw, {"{python}": sys.executable, "{task_dir}": str(task_dir)})
    data["runtime"] = _readable(data.get("runtime"), task_dir)
    if isinstance(data.get("evaluator"), dict):  # the evaluator's sandbox is configured under its options
        data["evaluator"]["runtime"] = _readable(data["evaluator"].get("runtime"), task_dir)
    roots = [Path.cwd() / ".harnesses", _REPO / ".harnesses"]
    prepared = prepare_task(path, RunOverrides(harness_root=find_harness_root(roots)), data=data)
    return GroupTemplate(prepared, max_policy_lag, stale_policy)
