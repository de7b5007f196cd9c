"""Task files in other formats: a dispatcher from a path to task mappings in Polar's task-file shape.

Polar's own ``TASK.yaml`` is read by :mod:`polar_client.taskfile`; everything else goes through here. Each
format is a module with two functions:

* ``detect(path: Path) -> bool``: whether the path is in this format (cheap: a file's first record, a
  directory's marker files);
* ``task_mappings(path: Path, **opts) -> list[dict]``: every task it holds, each a mapping that
  :func:`polar_client.task_from_mapping` accepts (``task_id`` set, paths absolute).

:data:`FORMATS` lists the modules in the order they are tried; adding a format is one line there.

A file holding many tasks names one with a ``#`` selector: ``verified.jsonl#astropy__astropy-12907`` (the
``task_id`` of the task, for SWE-bench the ``instance_id``). ``polar generate`` takes the whole file.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from polar_core.errors import InvalidArgument

__all__ = ["FORMATS", "find_format", "load_mappings", "select_mapping", "split_selector"]

FORMATS: tuple[str, ...] = ("polar_client.formats.swebench", "polar_client.formats.harbor")
"""The format modules, tried in order (each exposes ``detect`` and ``task_mappings``)."""


def split_selector(path: Path | str) -> tuple[Path, str]:
    """``(file, task_id)`` of ``FILE#TASK_ID`` (``task_id`` empty without a selector, or when the whole exists)."""
    text = str(path)
    if "#" not in text or Path(text).exists():
        return Path(text), ""
    file, _, task_id = text.rpartition("#")
    return Path(file), task_id


def find_format(path: Path) -> ModuleType | None:
    """The format module that claims ``path`` (without a selector), or ``None`` (a Polar task file, say)."""
    for name in FORMATS:
        module = importlib.import_module(name)
        if module.detect(path):
            return module
    return None


def load_mappings(path: Path | str, **opts: Any) -> list[dict[str, Any]] | None:
    """Every task of a file or directory in a foreign format, or ``None`` when no format claims it.

    Raises:
        InvalidArgument: The path is claimed but malformed (the message names the record and field).
    """
    module = find_format(Path(path))
    if module is None:
        return None
    mappings: list[dict[str, Any]] = module.task_mappings(Path(path), **opts)
    if not mappings:
        raise InvalidArgument(f"{path} holds no tasks", details={"path": str(path)})
    return mappings


def select_mapping(path: Path | str, **opts: Any) -> dict[str, Any] | None:
    """The one task ``path`` names (``FILE`` holding one task, or ``FILE#TASK_ID``), or ``None`` (not foreign).

    Raises:
        InvalidArgument: Malformed, no task with that id, or several tasks and no selector.
    """
    file, task_id = split_selector(path)
    mappings = load_mappings(file, **opts)
    if mappings is None:
        if task_id:
            raise InvalidArgument(f"{file} does not exist", details={"path": str(file)})
        return None
    if task_id:
        for mapping in mappings:
            if mapping.get("task_id") == task_id:
                return mapping
        raise InvalidArgument(f"{file} holds no task {task_id!r}", details={"task_id": task_id})
    if len(mappings) > 1:
        some = ", ".join(str(m.get("task_id")) for m in mappings[:3])
        raise InvalidArgument(
            f"{file} holds {len(mappings)} tasks ({some}, ...): name one as {file}#TASK_ID",
            details={"task_id": ""},
        )
    return mappings[0]
