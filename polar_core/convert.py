"""The one place that converts the contract's records to and from their protobuf messages.

Every service that sends or receives completions, traces or terminal statuses over gRPC uses these, so the
JSON records (``completions.jsonl``, ``traces.jsonl``) and the messages can never drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast

from google.protobuf import json_format, struct_pb2
from polar.common.v1 import completion_pb2, reconstruction_pb2, status_pb2, task_pb2, trace_pb2

from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord, ReconstructionStats, ReconstructionStrategy, TerminalStatus, Trace

__all__ = [
    "RUNTIME_KINDS",
    "RUNTIME_KIND_VALUES",
    "completion_from_proto",
    "completion_to_proto",
    "dict_to_struct",
    "stats_to_proto",
    "status_from_proto",
    "status_to_proto",
    "strategy_from_proto",
    "struct_to_dict",
    "trace_from_proto",
    "trace_to_proto",
]

RUNTIME_KINDS: Mapping[int, str] = MappingProxyType(
    {
        value.number: value.name.removeprefix("RUNTIME_KIND_").lower()
        for value in task_pb2.RuntimeKind.DESCRIPTOR.values
        if value.number != task_pb2.RUNTIME_KIND_UNSPECIFIED
    }
)
"""``RuntimeKind`` enum value → the task file's ``runtime.kind`` (``RUNTIME_KIND_DOCKER`` → ``docker``), read from
the enum itself, so a kind added to ``task.proto`` needs no table here or in a service."""

RUNTIME_KIND_VALUES: Mapping[str, int] = MappingProxyType({name: number for number, name in RUNTIME_KINDS.items()})
"""``runtime.kind`` name → ``RuntimeKind`` enum value (the inverse of :data:`RUNTIME_KINDS`)."""

# Completion message fields that CompletionRecord keeps in ``extra`` (beyond the contract's core fields).
_EXTRA_FIELDS = ("normalization_rules_fired", "tool_call_parse_error", "sampling", "backend", "replica")


def dict_to_struct(data: dict[str, Any], out: struct_pb2.Struct | None = None) -> struct_pb2.Struct:
    """Fill ``out`` (or a new Struct) from a JSON-compatible dict and return it."""
    out = out if out is not None else struct_pb2.Struct()
    out.update(data)
    return out


def struct_to_dict(message: struct_pb2.Struct) -> dict[str, Any]:
    """Return a Struct as a plain dict."""
    return json_format.MessageToDict(message)


def status_to_proto(status: TerminalStatus | str) -> status_pb2.TerminalStatus:
    """``resolved`` → ``TERMINAL_STATUS_RESOLVED``."""
    name = TerminalStatus(status).value.upper()
    # The generated stubs type Value() as int although it returns a member of the enum.
    return cast(status_pb2.TerminalStatus, status_pb2.TerminalStatus.Value(f"TERMINAL_STATUS_{name}"))


def status_from_proto(value: int) -> TerminalStatus:
    """``TERMINAL_STATUS_RESOLVED`` → ``resolved``; UNSPECIFIED and unknown values are InvalidArgument."""
    if value == status_pb2.TERMINAL_STATUS_UNSPECIFIED:
        raise InvalidArgument("terminal_status is required")
    try:
        name = status_pb2.TerminalStatus.Name(value)  # type: ignore[arg-type]
    except ValueError:
        raise InvalidArgument(f"unknown terminal status {value}") from None
    return TerminalStatus(name.removeprefix("TERMINAL_STATUS_").lower())


def completion_to_proto(record: CompletionRecord) -> completion_pb2.Completion:
    """Return the ``Completion`` message of a record (``extra`` fields the message has are kept)."""
    out = completion_pb2.Completion(
        session_id=record.session_id,
        call_id=record.call_id,
        seq=record.seq,
        protocol=record.protocol,
        model=record.model,
        policy_version=record.policy_version,
        prompt_token_ids=record.prompt_token_ids,
        response_token_ids=record.response_token_ids,
        response_logprobs=record.response_logprobs,
        finish_reason=record.finish_reason,
        started_at=record.started_at,
        ended_at=record.ended_at,
    )
    if record.parent_call_id is not None:
        out.parent_call_id = record.parent_call_id
    dict_to_struct(record.request, out.request)
    dict_to_struct(record.response, out.response)
    extra = record.extra
    out.normalization_rules_fired.extend(extra.get("normalization_rules_fired") or ())
    out.tool_call_parse_error = bool(extra.get("tool_call_parse_error", False))
    if isinstance(extra.get("sampling"), dict):
        dict_to_struct(extra["sampling"], out.sampling)
    out.backend = str(extra.get("backend") or "")
    out.replica = str(extra.get("replica") or "")
    return out


def completion_from_proto(message: completion_pb2.Completion) -> CompletionRecord:
    """Return the record of a ``Completion`` message (raises ``InvalidArgument`` on length mismatch)."""
    extra: dict[str, Any] = {}
    for name in _EXTRA_FIELDS:
        value = getattr(message, name)
        if isinstance(value, struct_pb2.Struct):
            if message.HasField(name):
                extra[name] = struct_to_dict(value)
        elif value:
            extra[name] = list(value) if name == "normalization_rules_fired" else value
    return CompletionRecord(
        session_id=message.session_id,
        call_id=message.call_id,
        seq=message.seq,
        prompt_token_ids=list(message.prompt_token_ids),
        response_token_ids=list(message.response_token_ids),
        response_logprobs=list(message.response_logprobs),
        protocol=message.protocol,
        model=message.model,
        policy_version=message.policy_version,
        parent_call_id=message.parent_call_id if message.HasField("parent_call_id") else None,
        finish_reason=message.finish_reason,
        request=struct_to_dict(message.request),
        response=struct_to_dict(message.response),
        started_at=message.started_at,
        ended_at=message.ended_at,
        extra=extra,
    )


def trace_to_proto(trace: Trace) -> trace_pb2.Trace:
    """Return the ``Trace`` message of a trace."""
    return trace_pb2.Trace(
        session_id=trace.session_id,
        task_id=trace.task_id,
        trace_index=trace.trace_index,
        call_ids=trace.call_ids,
        prompt_token_ids=trace.prompt_token_ids,
        response_token_ids=trace.response_token_ids,
        loss_mask=trace.loss_mask,
        response_logprobs=trace.response_logprobs,
        reward=trace.reward,
        weight=trace.weight,
        status=trace.status,
        exact_context=trace.exact_context,
        policy_versions=trace.policy_versions,
        terminal_status=status_to_proto(trace.status),
    )


def trace_from_proto(message: trace_pb2.Trace) -> Trace:
    """Return the trace of a ``Trace`` message."""
    return Trace(
        session_id=message.session_id,
        task_id=message.task_id,
        trace_index=message.trace_index,
        call_ids=list(message.call_ids),
        prompt_token_ids=list(message.prompt_token_ids),
        response_token_ids=list(message.response_token_ids),
        loss_mask=list(message.loss_mask),
        response_logprobs=list(message.response_logprobs),
        reward=message.reward,
        weight=message.weight,
        status=message.status,
        exact_context=message.exact_context,
        policy_versions=list(message.policy_versions),
    )


_STRATEGIES: dict[int, ReconstructionStrategy] = {
    reconstruction_pb2.RECONSTRUCTION_STRATEGY_PER_REQUEST: ReconstructionStrategy.PER_REQUEST,
    reconstruction_pb2.RECONSTRUCTION_STRATEGY_PREFIX_MERGE: ReconstructionStrategy.PREFIX_MERGE,
    reconstruction_pb2.RECONSTRUCTION_STRATEGY_EXACT: ReconstructionStrategy.EXACT,
}


def strategy_from_proto(value: int, default: ReconstructionStrategy) -> ReconstructionStrategy:
    """Return the strategy for an enum value; UNSPECIFIED gives ``default``."""
    if value == reconstruction_pb2.RECONSTRUCTION_STRATEGY_UNSPECIFIED:
        return default
    try:
        return _STRATEGIES[value]
    except KeyError:
        raise InvalidArgument(f"unknown reconstruction strategy {value}") from None


def stats_to_proto(stats: ReconstructionStats) -> reconstruction_pb2.ReconstructionStats:
    """Return the ``ReconstructionStats`` message of the statistics."""
    return reconstruction_pb2.ReconstructionStats(
        calls=stats.calls,
        chains=stats.chains,
        merges=stats.merges,
        splits_by_reason=stats.splits_by_reason,
        mismatched_context_calls=stats.mismatched_context_calls,
        mismatched_context_tokens=stats.mismatched_context_tokens,
        trainable_tokens=stats.trainable_tokens,
        total_tokens=stats.total_tokens,
        aborted_calls=stats.aborted_calls,
    )
