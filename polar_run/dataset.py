"""The datasets of ``polar generate`` (pure; the command is :mod:`polar_run.run_generate`): the task dataset it
reads, the SFT dataset it writes (records and the train/validation split by repository), and the ledger that
accounts for every sample in between.

A *dataset* is a file or directory in a format of :mod:`polar_client.formats` (SWE-bench records, a Harbor task
directory or a directory of them), a JSONL file of tasks (one task mapping a line, paths relative to the file), or a
directory: its ``tasks.jsonl`` if it has one, else every ``task.yaml``/``task.yml`` below it. A task's *repository* (the
unit of the train/validation split and of the ledger's rows) is ``metadata.repository`` when given, else the
name of the directory holding the task file (for JSONL lines: the line's ``task_id``).

Ledger identities (per row, and for the totals, which are column sums of the rows)::

    samples  = accepted + sum(rejected.values())        # every requested sample ends exactly once
    sessions = samples + empty_retries                  # an empty generation is re-run as a new session
    attempts = sessions + retries                       # infra_error attempts retried by the rollout server
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from polar_client.formats import load_mappings
from polar_core.errors import InvalidArgument
from polar_run.run_config import load_task_mapping

__all__ = [
    "DatasetTask",
    "Ledger",
    "LedgerRow",
    "SampleOutcome",
    "build_ledger",
    "is_empty_generation",
    "load_dataset",
    "sft_record",
    "split_of",
    "split_repositories",
]

REJECTED_EMPTY = "empty"


@dataclasses.dataclass(frozen=True, slots=True)
class DatasetTask:
    """One task of a dataset: its parsed mapping, where relative paths resolve from, and its repository."""

    data: dict[str, Any]
    path: Path
    repository: str

    @property
    def task_id(self) -> str:
        """The task's id."""
        return str(self.data.get("task_id") or "")


def _repository(data: Mapping[str, Any], fallback: str) -> str:
    metadata = data.get("metadata")
    if isinstance(metadata, Mapping) and metadata.get("repository"):
        return str(metadata["repository"])
    return fallback


def load_dataset(path: Path) -> list[DatasetTask]:
    """Read a dataset (see the module docstring).

    Raises:
        InvalidArgument: Nothing to read, a malformed line, or two tasks with one ``task_id``.
    """
    from polar_client.formats import harbor  # Harbor tasks: each anchored at its own directory

    if harbor.detect(path) or harbor.is_dataset(path):
        mappings = harbor.task_mappings(path)
        tasks = [DatasetTask(m, Path(m["metadata"]["harbor"]["task_dir"]) / "task.toml",
                             _repository(m, str(m["task_id"]))) for m in mappings]  # fmt: skip
    elif (foreign := load_mappings(path)) is not None:  # SWE-bench records, ... (polar_client.formats)
        anchor = (path if path.is_dir() else path.parent) / "task.yaml"
        tasks = [DatasetTask(data, anchor, _repository(data, str(data["task_id"]))) for data in foreign]
    elif path.is_dir():
        if (path / "tasks.jsonl").is_file():
            return load_dataset(path / "tasks.jsonl")
        files = sorted({*path.rglob("task.yaml"), *path.rglob("task.yml")})
        if not files:
            raise InvalidArgument(f"{path} holds neither tasks.jsonl nor task.yaml files")
        tasks = []
        for file in files:
            data = load_task_mapping(file)
            data.setdefault("task_id", file.parent.name)
            tasks.append(DatasetTask(data, file, _repository(data, file.parent.name)))
    elif path.is_file():
        tasks = []
        # Relative paths in a JSONL line resolve from the file's directory, as if it were a task file there.
        anchor = path.parent / "task.yaml"
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidArgument(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(data, dict) or not data.get("task_id"):
                raise InvalidArgument(f"{path}:{lineno}: a task object with a task_id is required")
            tasks.append(DatasetTask(data, anchor, _repository(data, str(data["task_id"]))))
    else:
        raise InvalidArgument(f"dataset {path} does not exist")
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise InvalidArgument(f"dataset {path}: task_id {task.task_id!r} appears twice")
        seen.add(task.task_id)
    if not tasks:
        raise InvalidArgument(f"dataset {path} is empty")
    return tasks


def is_empty_generation(completions: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a session's model produced nothing: no call, or no call with sampled text or a tool call.

    A call that sampled only its end-of-turn token answers with empty text; that is empty too.
    """
    for record in completions:
        response = record.get("response") or {}
        if str(response.get("text") or "").strip() or response.get("tool_calls"):
            return False
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class SampleOutcome:
    """One session of ``polar generate`` as the ledger counts it.

    Attributes:
        repository: The task's repository.
        task_id: The dataset task (not the retry task's id).
        session_id: The session.
        status: Its terminal status.
        attempts: Attempts the rollout server made (more than 1 after ``infra_error`` retries).
        empty: Its generation was empty (and its status a model outcome).
        final: It is the last session of its sample (an empty one that was re-run is not).
    """

    repository: str
    task_id: str
    session_id: str
    status: str
    attempts: int
    empty: bool
    final: bool

    @property
    def accepted(self) -> bool:
        """A final, non-empty, resolved session."""
        return self.final and not self.empty and self.status == "resolved"

    @property
    def rejection(self) -> str | None:
        """Why a final session was not accepted: its status, or ``empty``; None when accepted or re-run."""
        if not self.final or self.accepted:
            return None
        return REJECTED_EMPTY if self.empty else self.status


@dataclasses.dataclass(slots=True)
class LedgerRow:
    """Counts of one repository (or the totals)."""

    repository: str
    tasks: int = 0
    samples: int = 0
    sessions: int = 0
    attempts: int = 0
    retries: int = 0
    empty_retries: int = 0
    accepted: int = 0
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, other: LedgerRow) -> None:
        """Add ``other``'s counts to this row."""
        for name in ("tasks", "samples", "sessions", "attempts", "retries", "empty_retries", "accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for status, count in other.rejected.items():
            self.rejected[status] = self.rejected.get(status, 0) + count

    def to_dict(self) -> dict[str, Any]:
        """JSON form, with ``rejected`` sorted by status."""
        out = dataclasses.asdict(self)
        out["rejected"] = dict(sorted(self.rejected.items()))
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class Ledger:
    """Rows per repository (sorted) and their totals."""

    rows: list[LedgerRow]
    totals: LedgerRow

    def to_dict(self) -> dict[str, Any]:
        """The ``ledger.json`` object."""
        return {"rows": [r.to_dict() for r in self.rows], "totals": self.totals.to_dict()}


def build_ledger(tasks: Iterable[tuple[str, str, int]], outcomes: Iterable[SampleOutcome]) -> Ledger:
    """Count outcomes per repository.

    Args:
        tasks: ``(repository, task_id, samples requested)`` of every dataset task.
        outcomes: Every session that ran, re-runs of empty generations included.

    Raises:
        InvalidArgument: An outcome of a task not in ``tasks``.
    """
    rows: dict[str, LedgerRow] = {}
    known: set[str] = set()
    for repository, task_id, samples in tasks:
        row = rows.setdefault(repository, LedgerRow(repository))
        row.tasks += 1
        row.samples += samples
        known.add(task_id)
    for outcome in outcomes:
        if outcome.task_id not in known:
            raise InvalidArgument(f"outcome of unknown task {outcome.task_id!r}")
        row = rows[outcome.repository]
        row.sessions += 1
        row.attempts += outcome.attempts
        row.retries += outcome.attempts - 1
        if not outcome.final:
            row.empty_retries += 1
        elif outcome.accepted:
            row.accepted += 1
        else:
            reason = outcome.rejection or outcome.status
            row.rejected[reason] = row.rejected.get(reason, 0) + 1
    ordered = [rows[k] for k in sorted(rows)]
    totals = LedgerRow("total")
    for row in ordered:
        totals.add(row)
    return Ledger(ordered, totals)


def _assistant_message(response: Mapping[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": str(response.get("text") or "")}
    calls = [
        {
            "id": str(call.get("id") or ""),
            "type": "function",
            "function": {"name": str(call.get("name") or ""), "arguments": _json_text(call.get("arguments"))},
        }
        for call in response.get("tool_calls") or []
    ]
    if calls:
        message["tool_calls"] = calls
    if response.get("reasoning"):
        message["reasoning_content"] = str(response["reasoning"])
    return message


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {}, ensure_ascii=False, sort_keys=True)


def _chat_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded request message in OpenAI chat format (tool-call arguments as JSON text)."""
    out: dict[str, Any] = {"role": str(message.get("role") or ""), "content": str(message.get("content") or "")}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": str(call.get("id") or ""),
                "type": "function",
                "function": {
                    "name": str((call.get("function") or {}).get("name") or ""),
                    "arguments": _json_text((call.get("function") or {}).get("arguments")),
                },
            }
            for call in message["tool_calls"]
        ]
    for key in ("tool_call_id", "name", "reasoning_content"):
        if message.get(key) is not None:
            out[key] = str(message[key])
    return out


def sft_record(
    completions: Sequence[Mapping[str, Any]], *, task_id: str, session_id: str, repository: str
) -> dict[str, Any] | None:
    """The chat-format SFT record of a session: its last call's request messages plus the response.

    Returns None when the session made no call. Tool-call arguments are JSON text (OpenAI's fine-tuning format).
    """
    if not completions:
        return None
    last = max(completions, key=lambda r: int(r.get("seq", 0)))
    request = last.get("request") or {}
    messages = [_chat_message(m) for m in request.get("messages") or []]
    messages.append(_assistant_message(last.get("response") or {}))
    return {
        "messages": messages,
        "tools": list(request.get("tools") or []),
        "task_id": task_id,
        "session_id": session_id,
        "repo": repository,
    }


def split_of(repository: str, validation_fraction: float) -> str:
    """``train`` or ``validation`` for a repository, from a hash of its name alone (stable across datasets)."""
    digest = hashlib.sha256(repository.encode("utf-8")).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64
    return "validation" if point < validation_fraction else "train"


def split_repositories(repositories: Iterable[str], validation_fraction: float) -> dict[str, str]:
    """Assign every repository to one split with :func:`split_of`.

    With at least two repositories and a positive fraction, an empty validation split takes the repository
    whose hash is smallest, and an empty training split gives back the largest, so both splits exist.
    """
    if not 0.0 <= validation_fraction <= 1.0:
        raise InvalidArgument("the validation fraction must be between 0 and 1")
    names = sorted(set(repositories))
    splits = {name: split_of(name, validation_fraction) for name in names}
    if len(names) >= 2 and 0.0 < validation_fraction < 1.0:
        by_hash = sorted(names, key=lambda n: hashlib.sha256(n.encode("utf-8")).digest())
        if "validation" not in splits.values():
            splits[by_hash[0]] = "validation"
        if "train" not in splits.values():
            splits[by_hash[-1]] = "train"
    return splits
