"""Conversions between ``polar.common.v1`` messages and the plain records of :mod:`polar_core.records`.

Only the servicer and the proxy client use this module; domain code sees dataclasses.
"""

from __future__ import annotations

from polar.common.v1 import reconstruction_pb2

from polar_core.errors import InvalidArgument
from polar_core.records import ReconstructionStats, ReconstructionStrategy

__all__ = ["stats_to_proto", "strategy_from_proto"]

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
    )
