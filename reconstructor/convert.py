"""Every protobuf ↔ domain conversion of the reconstructor (``polar.reconstructor.v1``, the shared
``polar.common.v1`` reconstruction messages ↔ :mod:`reconstructor.models` and :mod:`polar_core.records`).

The servicer and the gateway's reconstructor client use this module; domain code sees dataclasses.
"""

from __future__ import annotations

from polar.reconstructor.v1 import reconstructor_service_pb2

from polar_core.convert import stats_to_proto, status_from_proto, strategy_from_proto, trace_to_proto
from polar_core.limits import chunked
from reconstructor.models import ReconstructionOptions, ReconstructionResult, ServiceDefaults, SessionOutcome
from reconstructor.trace_weights import WeightingMode

__all__ = [
    "options_from_proto",
    "outcome_from_proto",
    "response_chunks_to_proto",
    "response_to_proto",
    "weighting_from_proto",
]

_WEIGHTING: dict[int, WeightingMode] = {
    reconstructor_service_pb2.WEIGHTING_MODE_SESSION: WeightingMode.SESSION,
    reconstructor_service_pb2.WEIGHTING_MODE_TRACE: WeightingMode.TRACE,
}


def weighting_from_proto(value: int, default: WeightingMode) -> WeightingMode:
    """Return the weighting mode for an enum value; UNSPECIFIED (or unknown) gives ``default``."""
    return _WEIGHTING.get(value, default)


def options_from_proto(
    request: reconstructor_service_pb2.ReconstructRequest, defaults: ServiceDefaults
) -> ReconstructionOptions:
    """The reconstruction options of a request, ``defaults`` filling what it leaves unspecified."""
    return ReconstructionOptions(
        strategy=strategy_from_proto(request.strategy, defaults.strategy),
        end_of_turn_ids=tuple(request.end_of_turn_token_ids) or defaults.end_of_turn_ids,
        weighting=weighting_from_proto(request.weighting, defaults.weighting),
        split_on_policy_version=defaults.split_on_policy_version,
        prefer_exact_context=defaults.prefer_exact_context,
    )


def outcome_from_proto(request: reconstructor_service_pb2.ReconstructRequest) -> SessionOutcome:
    """The task id, reward and terminal status a request gives for its session."""
    return SessionOutcome(
        task_id=request.task_id, reward=request.reward, status=status_from_proto(request.terminal_status)
    )


def response_to_proto(result: ReconstructionResult) -> reconstructor_service_pb2.ReconstructResponse:
    """The ``ReconstructResponse`` of a reconstruction."""
    return reconstructor_service_pb2.ReconstructResponse(
        traces=[trace_to_proto(t) for t in result.traces], stats=stats_to_proto(result.stats)
    )


def response_chunks_to_proto(
    result: ReconstructionResult, max_bytes: int
) -> list[reconstructor_service_pb2.ReconstructStreamResponse]:
    """The ``ReconstructStream`` answer of a reconstruction: its traces in chunks of about ``max_bytes``.

    The last message carries the statistics (a session without traces gets one message with them only).
    """
    traces = [trace_to_proto(t) for t in result.traces]
    replies = [
        reconstructor_service_pb2.ReconstructStreamResponse(traces=chunk) for chunk in chunked(traces, max_bytes)
    ]
    if not replies:
        replies.append(reconstructor_service_pb2.ReconstructStreamResponse())
    replies[-1].stats.CopyFrom(stats_to_proto(result.stats))
    return replies
