"""Rewards on a session's traces: the session's reward on every trace, or the evaluator's per-trace rewards.

The reconstructor stamps the reward it is given; the pipeline restamps the traces once the verdict is known
(a task whose evaluator ``needs_traces`` is reconstructed before it is evaluated) and puts each trace's own
reward on it when the evaluator returned ``trace_rewards`` (indexed by ``trace_index``, one per trace). A count
that does not match the traces is refused (:class:`~polar_core.errors.InvalidArgument`), never dropped.

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from polar_core.errors import InvalidArgument
from polar_core.records import TerminalStatus, Trace

__all__ = ["stamp_traces"]


def stamp_traces(
    traces: Sequence[Trace], *, reward: float, status: TerminalStatus, trace_rewards: Sequence[float] = ()
) -> list[Trace]:
    """Return ``traces`` carrying ``status`` and, each, its reward (``trace_rewards[trace_index]`` or ``reward``).

    Raises:
        InvalidArgument: ``trace_rewards`` is non-empty and does not hold exactly one reward per trace.
    """
    if trace_rewards:
        indices = sorted(t.trace_index for t in traces)
        if len(trace_rewards) != len(traces) or indices != list(range(len(traces))):
            raise InvalidArgument(
                f"the evaluator returned {len(trace_rewards)} trace rewards for {len(traces)} traces; "
                "trace_rewards needs exactly one reward per trace, by trace_index"
            )
    return [
        dataclasses.replace(
            t, reward=float(trace_rewards[t.trace_index]) if trace_rewards else reward, status=status.value
        )
        for t in traces
    ]
