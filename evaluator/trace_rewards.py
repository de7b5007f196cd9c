"""Per-trace and per-call rewards of an evaluation, checked against the session's traces.

An evaluator may score a session per trace (``trace_rewards``: one reward per trace, by ``trace_index``) or per
model call (``call_rewards``: call id to reward). A trace's reward from per-call rewards is the **sum** of the
rewards of its calls (``Trace.call_ids``); calls given no reward add nothing, so rewarding only each trace's
last call scores the trace by its outcome. A call id that belongs to no trace, or a trace none of whose calls
has a reward, is refused: a reward is never dropped or made up silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from polar_core.errors import InvalidArgument
from polar_core.records import Trace

__all__ = ["check_trace_rewards", "trace_rewards_from_calls"]


def trace_rewards_from_calls(traces: Sequence[Trace], call_rewards: Mapping[str, float]) -> tuple[float, ...]:
    """Map per-call rewards to per-trace rewards (indexed by ``trace_index``).

    Raises:
        InvalidArgument: A call id is in no trace, or a trace has no rewarded call.
    """
    owner = {call_id: t.trace_index for t in traces for call_id in t.call_ids}
    unknown = sorted(set(call_rewards) - set(owner))
    if unknown:
        raise InvalidArgument(f"call_rewards names {len(unknown)} call(s) in no trace of the session: {unknown[:5]}")
    rewards = [0.0] * len(traces)
    rewarded = [False] * len(traces)
    for call_id, reward in call_rewards.items():
        index = owner[call_id]
        rewards[index] += float(reward)
        rewarded[index] = True
    missing = [i for i, hit in enumerate(rewarded) if not hit]
    if missing:
        raise InvalidArgument(f"call_rewards gives no reward to any call of trace(s) {missing[:5]}")
    return tuple(rewards)


def check_trace_rewards(traces: Sequence[Trace], trace_rewards: Sequence[float]) -> None:
    """Check that ``trace_rewards`` holds one reward per trace (when the evaluation was given the traces).

    Raises:
        InvalidArgument: The counts differ.
    """
    if trace_rewards and traces and len(trace_rewards) != len(traces):
        raise InvalidArgument(
            f"the evaluator returned {len(trace_rewards)} trace rewards for {len(traces)} traces "
            "(trace_rewards needs exactly one per trace, by trace_index)"
        )
