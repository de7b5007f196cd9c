"""Trace sample weights: how much each trace counts in the trainer's average.

Reconstruction decides how many traces a session yields, which must not silently decide how much the
session counts. With :attr:`WeightingMode.SESSION` a session's traces share weight 1, so a verbose session
split into 100 per-request traces counts as much as a concise one merged into a single trace (the
``g_session`` estimator of the review's equation 12); :attr:`WeightingMode.TRACE` gives every trace
weight 1 (``g_trace``). Sessions that carry no learning signal (``infra_error``, ``cancelled``) are excluded
by their all-zero loss masks, not by their weights, so the contract "a session's traces sum to 1" holds for
every session; a trainer drops traces without a mask-1 token before normalising.
"""

from __future__ import annotations

import enum

__all__ = ["WeightingMode", "trace_weights"]


class WeightingMode(enum.StrEnum):
    """How trace weights are normalised (mirrors ``polar.reconstructor.v1.WeightingMode``)."""

    SESSION = "session"
    TRACE = "trace"


def trace_weights(num_traces: int, mode: WeightingMode) -> list[float]:
    """Return the weights of one session's ``num_traces`` traces.

    Args:
        num_traces: How many traces the session produced.
        mode: The weighting mode.

    Returns:
        One weight per trace; with ``SESSION`` they sum to 1.
    """
    if mode is WeightingMode.SESSION:
        return [1.0 / num_traces] * num_traces if num_traces else []
    return [1.0] * num_traces
