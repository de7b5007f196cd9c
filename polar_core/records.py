"""Plain records promised to users: the completion record and the trace (see ``contracts.md``).

These dataclasses are the in-process form shared by the proxy (which writes completion records), the
reconstructor (completions in, traces out), the gateway and the rollout server. JSON field names are exactly
the contract's; unknown JSON fields are kept in ``extra`` so nothing a newer writer added is lost.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Self, cast

from polar_core.errors import InvalidArgument

__all__ = [
    "AgentStatus",
    "CompletionRecord",
    "ReconstructionStats",
    "ReconstructionStrategy",
    "SplitReason",
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


class _ContractRecord:
    """The JSON form shared by the contract's records: exactly the contract's fields, unknown ones in ``extra``."""

    __slots__ = ()
    _KIND: ClassVar[str]
    extra: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Return the contract's JSON object (``extra`` fields are merged back in)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(cast("Any", self)) if f.name != "extra"}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build a record from its JSON object; raises :class:`InvalidArgument` when fields are missing."""
        known, extra = _pop_known(cls, data)
        build: Any = cls  # a dataclass: its generated __init__ takes the fields
        try:
            return cast("Self", build(**known, extra=extra))
        except TypeError as exc:
            raise InvalidArgument(f"malformed {cls._KIND}: {exc}") from None


@dataclasses.dataclass(slots=True)
class CompletionRecord(_ContractRecord):
    """One model call as captured by the proxy (a line of ``completions.jsonl``)."""

    _KIND: ClassVar[str] = "completion record"

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


@dataclasses.dataclass(slots=True)
class Trace(_ContractRecord):
    """One trainer-facing sample (a line of ``traces.jsonl``)."""

    _KIND: ClassVar[str] = "trace"

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


class AgentStatus(enum.StrEnum):
    """How the agent run ended, as the gateway saw it (``polar.evaluator.v1.AgentStatus`` on the wire)."""

    COMPLETED = "completed"
    TIMEOUT = "timeout"
    ERROR = "error"
    CANCELLED = "cancelled"


class SplitReason:
    """Names used as keys of :attr:`ReconstructionStats.splits_by_reason`."""

    PREFIX_MISMATCH = "prefix_mismatch"
    """No chain's last prompt is a token prefix of the call's prompt (compaction, subagent, rewrite)."""
    REPEATED_PROMPT = "repeated_prompt"
    """No chain qualifies and one ends in a prompt equal to the call's (a retry or a parallel sample)."""
    NO_END_OF_TURN = "no_end_of_turn"
    """The tail after the previous prompt has no end-of-turn token, so the boundary is unsafe."""
    MALFORMED_TAIL = "malformed_tail"
    """The previous sampled response holds an end-of-turn token before its end, so the first one in the tail
    may belong to its rendering: the boundary is ambiguous."""
    INEXACT_CONTEXT = "inexact_context"
    """(``exact`` only) a chain's last prompt prefixes the call's, but the chain's whole sequence does not."""
    POLICY_VERSION = "policy_version"
    """The chosen chain was sampled by another policy version and splitting on versions is enabled."""


@dataclasses.dataclass(slots=True)
class ReconstructionStats:
    """Counters of one reconstruction; add them up with :meth:`combine`.

    Attributes:
        calls: Completions read.
        chains: Traces produced.
        merges: Calls merged into an existing chain (``calls == chains + merges + aborted_calls``).
        splits_by_reason: Calls that started a new chain although another chain existed, by
            :class:`SplitReason`.
        mismatched_context_calls: Merged calls whose merged context differs from the prompt they were sampled
            with (only ``prefix-merge`` produces them; review §11.1).
        mismatched_context_tokens: The sampled (trainable) tokens of those calls.
        trainable_tokens: Tokens with loss mask 1 over all traces.
        total_tokens: Prompt and response tokens over all traces: what a trainer processes.
        aborted_calls: Calls left out of every trace because they were aborted (``finish_reason`` ``abort``:
            cut by a weight update, or the harness went away); their records stay for the audit trail.
    """

    calls: int = 0
    chains: int = 0
    merges: int = 0
    splits_by_reason: dict[str, int] = dataclasses.field(default_factory=dict)
    mismatched_context_calls: int = 0
    mismatched_context_tokens: int = 0
    trainable_tokens: int = 0
    total_tokens: int = 0
    aborted_calls: int = 0

    @property
    def splits(self) -> int:
        """The total number of splits, whatever their reason."""
        return sum(self.splits_by_reason.values())

    def count_split(self, reason: str) -> None:
        """Record one split for ``reason``."""
        self.splits_by_reason[reason] = self.splits_by_reason.get(reason, 0) + 1

    @classmethod
    def combine(cls, parts: Iterable[ReconstructionStats]) -> Self:
        """Return the sum of several reconstructions' statistics."""
        out = cls()
        reasons: Counter[str] = Counter()
        for p in parts:
            out.calls += p.calls
            out.chains += p.chains
            out.merges += p.merges
            reasons.update(p.splits_by_reason)
            out.mismatched_context_calls += p.mismatched_context_calls
            out.mismatched_context_tokens += p.mismatched_context_tokens
            out.trainable_tokens += p.trainable_tokens
            out.total_tokens += p.total_tokens
            out.aborted_calls += p.aborted_calls
        out.splits_by_reason = dict(sorted(reasons.items()))
        return out

    def to_dict(self) -> dict[str, Any]:
        """Return the statistics as a JSON-ready object."""
        return dataclasses.asdict(self)
