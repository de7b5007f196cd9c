"""Whether the ``swebench`` evaluation strategy can grade an instance: checked where a task file is read (the
trainer's client) and again where a task is submitted (the rollout server), so a task that could never be graded
is refused before anything runs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from polar_core.errors import InvalidArgument

__all__ = ["EVAL_TYPES", "check_grading"]

EVAL_TYPES = ("pass_and_fail", "fail_only")
# What the evaluator gets: the grading fields, never the gold patch or the issue text.
_GRADING_FIELDS = (
    "instance_id", "repo", "version", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "eval_script",
    "log_parser", "eval_type",
)  # fmt: skip
_MARKERS = (">>>>> Start Test Output", ">>>>> End Test Output")


def _test_list(record: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = record[key]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"{where}: {key} must be a list of test names (or its JSON text)", details={"field": key})
    return list(value)


def _known_parsers() -> set[str] | None:
    """The log parsers of the installed ``swebench``, or ``None`` when it is not installed on this client."""
    try:
        from swebench.harness.log_parsers import PARSER_REGISTRY
    except ImportError:
        return None
    return set(PARSER_REGISTRY)


def check_grading(instance: Any, where: str = "evaluator.instance") -> dict[str, Any]:
    """The grading fields of an instance (what the ``swebench`` strategy gets), checked; also run at SubmitTask.

    ``log_parser`` is checked against the installed ``swebench`` when this host has it.

    Raises:
        InvalidArgument: A missing or malformed field (named in the message and ``details["field"]``).
    """
    if not isinstance(instance, Mapping):
        raise InvalidArgument(f"{where}: the SWE-bench instance must be a mapping", details={"field": "instance"})
    missing = [key for key in _GRADING_FIELDS if instance.get(key) is None]
    if missing:
        raise InvalidArgument(
            f"{where}: the SWE-bench instance lacks {', '.join(missing)}", details={"field": missing[0]}
        )
    out = {key: instance[key] for key in _GRADING_FIELDS}
    out["FAIL_TO_PASS"] = _test_list(instance, "FAIL_TO_PASS", where)
    out["PASS_TO_PASS"] = _test_list(instance, "PASS_TO_PASS", where)
    for key in ("instance_id", "repo", "base_commit", "version", "log_parser", "eval_script", "test_patch"):
        if not isinstance(out[key], str):
            raise InvalidArgument(f"{where}: {key} must be a string", details={"field": key})
        if key != "test_patch" and not out[key].strip():
            raise InvalidArgument(f"{where}: {key} is empty", details={"field": key})
    if out["eval_type"] not in EVAL_TYPES:
        raise InvalidArgument(
            f"{where}: eval_type must be one of {', '.join(EVAL_TYPES)}", details={"field": "eval_type"}
        )
    if not all(marker in out["eval_script"] for marker in _MARKERS):
        raise InvalidArgument(
            f"{where}: eval_script must bracket the test output with {' and '.join(map(repr, _MARKERS))}",
            details={"field": "eval_script"},
        )
    parsers = _known_parsers()
    if parsers is not None and out["log_parser"] not in parsers:
        raise InvalidArgument(
            f"{where}: log_parser {out['log_parser']!r} is not one of the installed swebench's parsers "
            f"(repo {out['repo']}, version {out['version']})",
            details={"field": "log_parser"},
        )
    return out
