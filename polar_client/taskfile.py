"""Reading ``TASK.yaml`` (see ``contracts.md``) into a ``polar.common.v1.Task``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format, struct_pb2
from polar.common.v1 import reconstruction_pb2, task_pb2

from polar_checks.harnesses import check_harness
from polar_client.formats import select_mapping
from polar_core.convert import RUNTIME_KIND_VALUES
from polar_core.errors import InvalidArgument
from polar_core.git_trees import TreeCache, check_revision, is_git_repository
from polar_core.task_paths import resolve_task_paths

__all__ = ["load_task", "task_from_mapping"]

_SCALARS = ("task_id", "instruction", "num_samples", "timeout_seconds", "priority", "early_stop_min_usable_sessions")
_STALE_POLICIES = {"keep": task_pb2.STALE_POLICY_KEEP, "resample": task_pb2.STALE_POLICY_RESAMPLE}


def _struct(values: Mapping[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(dict(values))
    return out


def _named(section: Mapping[str, Any], key: str) -> tuple[str, dict[str, Any]]:
    options = dict(section)
    return str(options.pop(key, "")), options


def _with_base_commit(section: Mapping[str, Any]) -> dict[str, Any]:
    """``section`` with its ``base_commit`` checked (and a sha YAML read as a number turned back into text)."""
    out = dict(section)
    value = out.get("base_commit")
    if value is None:
        out.pop("base_commit", None)
        return out
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise InvalidArgument("base_commit must be a commit sha or a ref name")
    out["base_commit"] = check_revision(value)
    return out


def _check_local_base_commit(data: Mapping[str, Any]) -> None:
    """When the task's git repository is on this host, its ``base_commit`` must name one of its commits."""
    for section in (data.get("evaluator"), data.get("metadata")):
        if not isinstance(section, Mapping) or not isinstance(section.get("repo"), str):
            continue
        repo = Path(section["repo"])
        if section.get("base_commit") is not None and is_git_repository(repo):
            TreeCache().resolve(repo, str(section["base_commit"]))


def _staleness(task: task_pb2.Task, data: Mapping[str, Any]) -> None:
    """Set ``max_policy_lag`` (an integer >= 0) and ``stale_policy`` (``keep`` or ``resample``) when given."""
    lag = data.get("max_policy_lag")
    if lag is not None:
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
            raise InvalidArgument(f"max_policy_lag must be an integer >= 0, not {lag!r}")
        task.max_policy_lag = lag
    policy = data.get("stale_policy")
    if policy is not None:
        if policy not in _STALE_POLICIES:
            raise InvalidArgument(f"stale_policy must be one of {', '.join(_STALE_POLICIES)}, not {policy!r}")
        task.stale_policy = _STALE_POLICIES[policy]


def task_from_mapping(data: Mapping[str, Any]) -> task_pb2.Task:
    """Build a Task from the parsed YAML mapping.

    ``harness``, ``backend`` and ``evaluator`` take a name (``strategy`` for the evaluator) plus free-form
    options; ``runtime`` takes ``kind``, ``image`` and options; ``builder`` takes ``strategy``
    (``per-request``, ``prefix-merge``, ``exact``) and ``end_of_turn_token_ids``; ``callback`` takes
    ``http_url`` or ``grpc_target`` and ``max_attempts``; ``max_policy_lag`` (an integer >= 0) and
    ``stale_policy`` (``keep`` or ``resample``) bound staleness (unset: the rollout server's defaults).
    ``evaluator.base_commit`` (or ``metadata.base_commit``) must be a hex sha or a plain ref name.

    ``harness`` options are checked against the adapter's option names
    (:func:`polar_checks.harnesses.check_harness`).

    Raises:
        InvalidArgument: Unknown keys (a harness option's field is named ``harness.<key>``) or malformed values.
    """
    known = {*_SCALARS, "harness", "runtime", "backend", "builder", "evaluator", "metadata", "callback"}
    known |= {"max_policy_lag", "stale_policy"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InvalidArgument(f"unknown task field(s): {', '.join(unknown)}")
    task = task_pb2.Task()
    _staleness(task, data)
    try:
        for key in _SCALARS:
            if key in data and data[key] is not None:
                setattr(task, key, type(getattr(task, key))(data[key]))
        if "harness" in data:
            name, options = _named(data["harness"], "name")
            check_harness(name, options)  # an option the adapter does not know fails here, with the field named
            task.harness.CopyFrom(task_pb2.HarnessSpec(name=name, options=_struct(options)))
        if "runtime" in data:
            kind, options = _named(data["runtime"], "kind")
            image = str(options.pop("image", ""))
            if kind and kind not in RUNTIME_KIND_VALUES:
                raise InvalidArgument(f"runtime.kind must be one of {', '.join(RUNTIME_KIND_VALUES)}")
            task.runtime.CopyFrom(
                task_pb2.RuntimeSpec(kind=RUNTIME_KIND_VALUES.get(kind, 0), image=image, options=_struct(options))  # type: ignore[arg-type]
            )
        if "backend" in data:
            name, options = _named(data["backend"], "name")
            task.backend.CopyFrom(task_pb2.BackendSpec(name=name, options=_struct(options)))
        if "builder" in data:
            strategy, options = _named(data["builder"], "strategy")
            eot = [int(t) for t in options.pop("end_of_turn_token_ids", [])]
            value = 0
            if strategy:
                value = reconstruction_pb2.ReconstructionStrategy.Value(
                    "RECONSTRUCTION_STRATEGY_" + strategy.upper().replace("-", "_")
                )
            task.builder.CopyFrom(
                task_pb2.BuilderSpec(strategy=value, end_of_turn_token_ids=eot, options=_struct(options))  # type: ignore[arg-type]
            )
        if "evaluator" in data:
            strategy, options = _named(data["evaluator"], "strategy")
            options = _with_base_commit(options)
            task.evaluator.CopyFrom(task_pb2.EvaluatorSpec(strategy=strategy, options=_struct(options)))
        if "metadata" in data:
            task.metadata.CopyFrom(_struct(_with_base_commit(data["metadata"] or {})))
        if "callback" in data:
            json_format.ParseDict(data["callback"], task.callback)
    except (TypeError, ValueError, AttributeError, json_format.ParseError) as exc:
        raise InvalidArgument(f"malformed task: {exc}") from None
    return task


def load_task(path: Path | str, **format_opts: Any) -> task_pb2.Task:
    """Read a ``TASK.yaml`` file; paths in it (``evaluator.repo``, ...) are made absolute against its folder.

    A Harbor task directory (:mod:`polar_client.formats.harbor`) is converted instead (its image built;
    ``format_opts`` such as ``build_missing_images`` go to the format's ``task_mappings``).

    A ``base_commit`` of a git repository found on this host must name one of its commits (checked here, so a
    typo fails at submission rather than at every session's admission).

    A path in another format (:mod:`polar_client.formats`: SWE-bench records, ...) is read by that format;
    ``FILE#TASK_ID`` names one task of a file holding many.

    Raises:
        InvalidArgument: The file is unreadable or malformed, or its ``base_commit`` names no commit.
    """
    foreign = select_mapping(path, **format_opts)
    if foreign is not None:
        return task_from_mapping(foreign)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidArgument(f"cannot read task file {path}: {exc}") from None
    if not isinstance(data, Mapping):
        raise InvalidArgument(f"{path}: a task file must be a mapping")
    resolved = resolve_task_paths(data, Path(path).parent.resolve())
    task = task_from_mapping(resolved)
    _check_local_base_commit(resolved)
    return task
