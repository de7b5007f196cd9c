"""Trace sample weights: how much each trace counts in the trainer's average.

Reconstruction decides how many traces a session yields, which must not silently decide how much the
session counts. With :attr:`WeightingMode.SESSION` a session's traces share weight 1, so a verbose session
split into 100 per-request traces counts as much as a concise one merged into a single trace (the
``g_session`` estimator of the review's equation 12); :attr:`WeightingMode.TRACE` gives every trace
weight 1 (``g_trace``).
"""

from __future__ import annotations

import enum

__all__ = ["WeightingMode", "trace_weights"]


class WeightingMode(enum.StrEnum):
    """How trace weights are normalised (mirrors ``polar.reconstructor.v1.WeightingMode``)."""

    SESSION = "session"
    TRACE = "trace"


def trace_weights(num_traces: int, mode: WeightingMode, *, trainable: bool = True) -> list[float]:
    """Return the weights of one session's ``num_traces`` traces.

    Args:
        num_traces: How many traces the session produced.
        mode: The weighting mode.
        trainable: False for sessions whose status carries no learning signal (infra errors, cancelled);
            their traces get weight 0 so that no normalisation counts them.

    Returns:
        One weight per trace; with ``SESSION`` they sum to 1 (or 0 when not trainable).
    """
    if not trainable:
        return [0.0] * num_traces
    if mode is WeightingMode.SESSION:
        return [1.0 / num_traces] * num_traces if num_traces else []
    return [1.0] * num_traces
