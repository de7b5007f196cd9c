"""SWE-bench instance records (JSONL, JSON, Parquet, or a ``datasets`` directory saved with ``save_to_disk``).

A record becomes a task: ``instruction`` is its ``problem_statement``; the runtime is Docker with the
instance's image (the record's ``image`` field, else the official name
``swebench/sweb.eval.x86_64.<instance_id with __ as _1776_>:latest``; ``image_template`` overrides it); the
agent works in the image's ``/testbed``, which holds the repository at ``base_commit``; the evaluator is the
``swebench`` strategy (:mod:`evaluator.strategies.swebench`), which grades with the official ``swebench``
package in a clean container of the same image.

Records carry the fields of the ``swebench`` 5 dataset schema: ``instance_id, repo, base_commit, patch,
test_patch, problem_statement, FAIL_TO_PASS, PASS_TO_PASS, version`` plus what grading needs,
``eval_script`` (the script the harness runs, bracketing the test output with its markers), ``log_parser``
(a name in ``swebench.harness.log_parsers.PARSER_REGISTRY``) and ``eval_type`` (``pass_and_fail`` or
``fail_only``); ``environment_setup_commit``, ``hints_text``, ``created_at`` and ``image`` are optional. A
record lacking a field, or naming a parser the installed ``swebench`` does not know, is refused with the field
named. The gold ``patch`` is checked but never put in the task (the agent must not see it).

A record may carry a ``polar`` mapping (:data:`POLAR_KEYS`): task fields set over the defaults (``harness``,
``num_samples``, ``timeout_seconds``, ``runtime``, ...), and ``repo_dir``, a git repository on this host
(relative to the records file) holding ``base_commit``: the agent's workspace is then its tree at
``base_commit`` and the evaluator grades a copy of it, history included, in the local runtime (a private
SWE-style dataset without images). Like every task path it must lie under the operator's task roots.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar_checks.swebench import check_grading
from polar_core.errors import InvalidArgument

__all__ = [
    "POLAR_KEYS",
    "REQUIRED_FIELDS",
    "check_record",
    "detect",
    "official_image",
    "read_records",
    "record_to_mapping",
    "task_mappings",
]

REQUIRED_FIELDS = (
    "instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS",
    "PASS_TO_PASS", "version", "eval_script", "log_parser", "eval_type",
)  # fmt: skip
"""Fields every record must have (the strategy needs all but ``patch`` and ``problem_statement``)."""
_OPTIONAL_FIELDS = ("environment_setup_commit", "hints_text", "created_at", "image", "image_assets")
POLAR_KEYS = ("harness", "num_samples", "timeout_seconds", "priority", "backend", "builder", "runtime", "repo_dir")
"""Keys of a record's optional ``polar`` mapping: Polar task fields set over the defaults, and ``repo_dir``."""
WORKDIR = "/testbed"


def official_image(instance_id: str) -> str:
    """The official SWE-bench evaluation image of an instance (``__`` is spelled ``_1776_`` in image names)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest".lower()


def _first_record(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        if path.suffix == ".json":
            head = fh.read(1 << 20).lstrip()
            if not head.startswith("["):
                return None
            try:
                records = json.loads(head + fh.read())
            except json.JSONDecodeError:
                return None
            return records[0] if isinstance(records, list) and records else None
        for line in fh:
            if line.strip():
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    return None
    return None


def _looks_like_record(keys: Any) -> bool:
    return "instance_id" in keys and "problem_statement" in keys and "task_id" not in keys


def detect(path: Path) -> bool:
    """A ``.jsonl``/``.json``/``.parquet`` file of records, or a directory written by ``save_to_disk``."""
    try:
        if path.is_dir():
            if (path / "dataset_dict.json").is_file():
                return True
            info = path / "dataset_info.json"
            if not (info.is_file() and (path / "state.json").is_file()):
                return False
            features = json.loads(info.read_text(encoding="utf-8")).get("features") or {}
            return _looks_like_record(features)
        if path.suffix == ".parquet" and path.is_file():
            import pyarrow.parquet as pq

            return _looks_like_record(pq.read_schema(path).names)
        if path.suffix in (".jsonl", ".json") and path.is_file():
            first = _first_record(path)
            return isinstance(first, dict) and _looks_like_record(first)
    except (OSError, ValueError):
        return False
    return False


def _read_dataset_dir(path: Path, split: str) -> list[dict[str, Any]]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        if not split:
            split = names[0] if len(names) == 1 else ("test" if "test" in names else "")
        if split not in loaded:
            raise InvalidArgument(f"{path}: choose a split ({', '.join(names)})", details={"split": split})
        loaded = loaded[split]
    return [dict(row) for row in loaded]


def read_records(path: Path, *, split: str = "") -> list[dict[str, Any]]:
    """The records of a file or ``save_to_disk`` directory, as plain dicts.

    Raises:
        InvalidArgument: Unreadable, or a line or element that is not a JSON object.
    """
    try:
        if path.is_dir():
            return _read_dataset_dir(path, split)
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return [dict(r) for r in pq.read_table(path).to_pylist()]
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgument(f"cannot read {path}: {exc}", details={"path": str(path)}) from None
    if path.suffix == ".json":
        rows = json.loads(text)
        items = list(enumerate(rows if isinstance(rows, list) else [rows], 1))
    else:
        items = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append((lineno, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise InvalidArgument(
                        f"{path}:{lineno}: not JSON ({exc.msg})", details={"line": str(lineno)}
                    ) from None
    for where, row in items:
        if not isinstance(row, dict):
            raise InvalidArgument(
                f"{path}:{where}: a SWE-bench record must be a JSON object", details={"line": str(where)}
            )
    return [row for _, row in items]


def check_record(record: Mapping[str, Any], where: str = "record") -> dict[str, Any]:
    """The record's grading fields, checked and normalised (test lists as lists).

    Raises:
        InvalidArgument: A missing or malformed field (named in the message and ``details["field"]``).
    """
    missing = [key for key in REQUIRED_FIELDS if record.get(key) is None]
    if missing:
        raise InvalidArgument(
            f"{where}: the SWE-bench record lacks {', '.join(missing)}", details={"field": missing[0]}
        )
    for key in (*REQUIRED_FIELDS, *_OPTIONAL_FIELDS):
        textual = key not in ("FAIL_TO_PASS", "PASS_TO_PASS", "image_assets")
        if textual and record.get(key) is not None and not isinstance(record[key], str):
            raise InvalidArgument(f"{where}: {key} must be a string", details={"field": key})
    return check_grading(record, where)


def _polar_fields(record: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The record's optional ``polar`` mapping (a JSON object, or its text), its keys checked."""
    extra = record.get("polar")
    if extra is None or extra == "":
        return {}
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError:
            extra = None
    if not isinstance(extra, Mapping):
        raise InvalidArgument(f"{where}: polar must be a mapping of task fields", details={"field": "polar"})
    unknown = sorted(set(extra) - set(POLAR_KEYS))
    if unknown:
        raise InvalidArgument(
            f"{where}: polar.{unknown[0]} is not one of {', '.join(POLAR_KEYS)}",
            details={"field": f"polar.{unknown[0]}"},
        )
    if "repo_dir" in extra and not isinstance(extra["repo_dir"], str):
        raise InvalidArgument(f"{where}: polar.repo_dir must be a path", details={"field": "polar.repo_dir"})
    return dict(extra)


def _use_host_repository(mapping: dict[str, Any], repo_dir: str, base_commit: str, base_dir: Path | None) -> None:
    """Point the task at a git repository on this host instead of the image's ``/testbed`` (local runtime)."""
    path = Path(repo_dir)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    path = path.resolve()
    mapping["runtime"] = {"kind": "local"}
    mapping["metadata"].pop("workspace_image_path", None)
    mapping["metadata"].update({"repo": str(path), "base_commit": base_commit})
    mapping["evaluator"]["repo"] = str(path)


def record_to_mapping(
    record: Mapping[str, Any], *, where: str = "record", image_template: str = "", base_dir: Path | None = None
) -> dict[str, Any]:
    """A Polar task mapping for one record (see the module docstring).

    Args:
        record: The instance record.
        where: Where it came from, for messages.
        image_template: Overrides the image: ``{instance_id}`` and ``{official}`` (the official image name) are
            filled in, e.g. ``registry.local/{official}``.
        base_dir: What a relative ``polar.repo_dir`` is relative to (the records file's folder).
    """
    grading = check_record(record, where)
    instance_id = grading["instance_id"]
    official = official_image(instance_id)
    image = image_template.format(instance_id=instance_id, official=official) if image_template else ""
    image = image or record.get("image") or official
    metadata = {"repository": grading["repo"], "workspace_image_path": WORKDIR}
    metadata["swebench"] = {
        key: record[key]
        for key in ("instance_id", "repo", "version", "base_commit", "environment_setup_commit")
        if record.get(key)
    }
    extra = _polar_fields(record, where)
    mapping: dict[str, Any] = {
        "task_id": instance_id,
        "instruction": record["problem_statement"],
        "num_samples": 1,  # polar submit --samples / polar run --samples / polar.num_samples set more
        "runtime": {"kind": "docker", "image": image},
        "evaluator": {"strategy": "swebench", "instance": grading},
        "metadata": metadata,
    }
    repo_dir = extra.pop("repo_dir", None)
    if repo_dir is not None:
        _use_host_repository(mapping, repo_dir, grading["base_commit"], base_dir)
    mapping.update(extra)
    return mapping


def task_mappings(path: Path, **opts: Any) -> list[dict[str, Any]]:
    """Every record of ``path`` as a task mapping (options: ``split``, ``image_template``).

    Raises:
        InvalidArgument: A malformed record (its position and the field named), or an instance id twice.
    """
    split = str(opts.get("split") or "")
    base_dir = (path if path.is_dir() else path.parent).resolve()
    template = str(opts.get("image_template") or "")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, record in enumerate(read_records(path, split=split)):
        label = record.get("instance_id") if isinstance(record.get("instance_id"), str) else f"#{index + 1}"
        where = f"{path} record {label}"
        mapping = record_to_mapping(record, where=where, image_template=template, base_dir=base_dir)
        if mapping["task_id"] in seen:
            raise InvalidArgument(
                f"{path}: instance {mapping['task_id']} appears twice", details={"field": "instance_id"}
            )
        seen.add(mapping["task_id"])
        out.append(mapping)
    return out
