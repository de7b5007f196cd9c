"""Conversions between ``polar.common.v1`` messages and the plain records of :mod:`polar_core.records`.

Only the servicer and the proxy client use this module; domain code sees dataclasses.
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf import json_format, struct_pb2
from polar.common.v1 import completion_pb2, reconstruction_pb2, status_pb2, trace_pb2

from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord, ReconstructionStrategy, TerminalStatus, Trace
from reconstructor.stats import ReconstructionStats

__all__ = [
    "completion_from_proto",
    "stats_to_proto",
    "status_from_proto",
    "strategy_from_proto",
    "trace_to_proto",
]

_STRATEGIES: dict[int, ReconstructionStrategy] = {
    reconstruction_pb2.RECONSTRUCTION_STRATEGY_PER_REQUEST: ReconstructionStrategy.PER_REQUEST,
    reconstruction_pb2.RECONSTRUCTION_STRATEGY_PREFIX_MERGE: ReconstructionStrategy.PREFIX_MERGE,
    reconstruction_pb2.RECONSTRUCTION_STRATEGY_EXACT: ReconstructionStrategy.EXACT,
}
# Proto fields that CompletionRecord keeps in ``extra`` (they are not part of the contract's core fields).
_EXTRA_FIELDS = ("normalization_rules_fired", "tool_call_parse_error", "sampling", "backend", "replica")


def strategy_from_proto(value: int, default: ReconstructionStrategy) -> ReconstructionStrategy:
    """Return the strategy for an enum value; UNSPECIFIED gives ``default``."""
    if value == reconstruction_pb2.RECONSTRUCTION_STRATEGY_UNSPECIFIED:
        return default
    try:
        return _STRATEGIES[value]
    except KeyError:
        raise InvalidArgument(f"unknown reconstruction strategy {value}") from None


def status_from_proto(value: int) -> TerminalStatus:
    """Return the terminal status for an enum value; UNSPECIFIED is refused."""
    if value == status_pb2.TERMINAL_STATUS_UNSPECIFIED:
        raise InvalidArgument("terminal_status is required")
    try:
        name = status_pb2.TerminalStatus.Name(value)  # type: ignore[arg-type]
    except ValueError:
        raise InvalidArgument(f"unknown terminal status {value}") from None
    return TerminalStatus(name.removeprefix("TERMINAL_STATUS_").lower())


def _status_to_proto(status: str) -> status_pb2.TerminalStatus:
    # The generated stubs type Value() as int although it returns a member of the enum.
    return cast(status_pb2.TerminalStatus, status_pb2.TerminalStatus.Value(f"TERMINAL_STATUS_{status.upper()}"))


def _struct_to_dict(message: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(message)


def completion_from_proto(message: completion_pb2.Completion) -> CompletionRecord:
    """Return the record of a ``Completion`` message (raises ``InvalidArgument`` on length mismatch)."""
    extra: dict[str, Any] = {}
    for name in _EXTRA_FIELDS:
        value = getattr(message, name)
        if isinstance(value, struct_pb2.Struct):
            if message.HasField(name):
                extra[name] = _struct_to_dict(value)
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
        request=_struct_to_dict(message.request),
        response=_struct_to_dict(message.response),
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
        terminal_status=_status_to_proto(trace.status),
    )


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
    )
