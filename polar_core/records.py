"""Plain records promised to users: the completion record and the trace (see ``contracts.md``).

These dataclasses are the in-process form shared by the proxy (which writes completion records), the
reconstructor (completions in, traces out), the gateway and the rollout server. JSON field names are exactly
the contract's; unknown JSON fields are kept in ``extra`` so nothing a newer writer added is lost.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self

from polar_core.errors import InvalidArgument

__all__ = [
    "CompletionRecord",
    "ReconstructionStrategy",
    "TerminalStatus",
    "Trace",
    "read_jsonl",
    "write_jsonl",
]


class TerminalStatus(enum.StrEnum):
    """Terminal status of a session; separate from reward."""

    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"
    AGENT_TIMEOUT = "agent_timeout"
    EVAL_TIMEOUT = "eval_timeout"
    INVALID_PATCH = "invalid_patch"
    INFRA_ERROR = "infra_error"
    CANCELLED = "cancelled"

    @property
    def trainable(self) -> bool:
        """Whether traces of a session with this status may carry loss (infra failures never do)."""
        return self not in (TerminalStatus.INFRA_ERROR, TerminalStatus.CANCELLED)


class ReconstructionStrategy(enum.StrEnum):
    """How completions become traces."""

    PER_REQUEST = "per-request"
    PREFIX_MERGE = "prefix-merge"
    EXACT = "exact"


def _pop_known(cls: type[Any], data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    known = {k: v for k, v in data.items() if k in names}
    extra = {k: v for k, v in data.items() if k not in names}
    return known, extra


@dataclasses.dataclass(slots=True)
class CompletionRecord:
    """One model call as captured by the proxy (a line of ``completions.jsonl``)."""

    session_id: str
    call_id: str
    seq: int
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    protocol: str = ""
    model: str = ""
    policy_version: str = ""
    parent_call_id: str | None = None
    finish_reason: str = "stop"
    request: dict[str, Any] = dataclasses.field(default_factory=dict)
    response: dict[str, Any] = dataclasses.field(default_factory=dict)
    started_at: float = 0.0
    ended_at: float = 0.0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.response_token_ids) != len(self.response_logprobs):
            raise InvalidArgument(
                f"completion {self.call_id!r}: {len(self.response_token_ids)} response tokens but "
                f"{len(self.response_logprobs)} logprobs",
                details={"call_id": self.call_id},
            )

    def to_dict(self) -> dict[str, Any]:
        """Return the contract's JSON object (``extra`` fields are merged back in)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build a record from its JSON object; raises :class:`InvalidArgument` when fields are missing."""
        known, extra = _pop_known(cls, data)
        try:
            return cls(**known, extra=extra)
        except TypeError as exc:
            raise InvalidArgument(f"malformed completion record: {exc}") from None


@dataclasses.dataclass(slots=True)
class Trace:
    """One trainer-facing sample (a line of ``traces.jsonl``)."""

    session_id: str
    task_id: str
    trace_index: int
    call_ids: list[str]
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    loss_mask: list[int]
    response_logprobs: list[float]
    reward: float = 0.0
    weight: float = 1.0
    status: str = TerminalStatus.UNRESOLVED.value
    exact_context: bool = True
    policy_versions: list[str] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.response_token_ids)
        if len(self.loss_mask) != n or len(self.response_logprobs) != n:
            raise InvalidArgument(
                f"trace {self.session_id}/{self.trace_index}: response, loss_mask and response_logprobs "
                f"lengths differ ({n}, {len(self.loss_mask)}, {len(self.response_logprobs)})"
            )

    def to_dict(self) -> dict[str, Any]:
        """Return the contract's JSON object."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build a trace from its JSON object; raises :class:`InvalidArgument` when fields are missing."""
        known, extra = _pop_known(cls, data)
        try:
            return cls(**known, extra=extra)
        except TypeError as exc:
            raise InvalidArgument(f"malformed trace: {exc}") from None


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of a JSON-lines file, naming the line of any malformed one."""
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidArgument(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise InvalidArgument(f"{path}:{lineno}: expected a JSON object")
            yield obj


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """Write rows as JSON lines atomically (temp file + rename); return the number written."""
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, separators=(",", ":"), ensure_ascii=False))
            fh.write("\n")
            count += 1
    tmp.replace(path)
    return count
