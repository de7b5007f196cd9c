"""From session results to a training batch: traces, their policy lag, and what was left out and why.

The staleness rule lives here: a trace whose oldest call was sampled more than ``max_policy_lag`` versions
behind the version being trained is dropped (and counted) before any tensor is built, and
:func:`check_lag_bound` asserts the rule on the batch that reaches the loss.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from polar_client.tensors import as_trace
from polar_core.policy_version import INITIAL, parse_version
from polar_core.records import Trace

__all__ = ["Batch", "LagBoundViolated", "SessionSample", "build_batch", "check_lag_bound", "trace_lag"]


_NOT_EVALUATED = frozenset({"infra_error", "cancelled"})


class LagBoundViolated(AssertionError):
    """A trainable token beyond the staleness bound was about to reach the loss (a trainer bug)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SessionSample:
    """One finished session as the trainer sees it.

    Attributes:
        task_id: The group it belongs to.
        session_id: The session.
        status: Its terminal status (``resolved``, ``unresolved``, ``infra_error``, ...).
        reward: The evaluator's reward.
        traces: Its traces (domain records).
        reported_lags: The rollout server's ``policy_lag`` of each trace (0 when the server does not set it).
    """

    task_id: str
    session_id: str
    status: str
    reward: float
    traces: tuple[Trace, ...]
    reported_lags: tuple[int, ...]

    @classmethod
    def from_result(cls, result: Any) -> SessionSample:
        """Build from a ``polar.common.v1.SessionResult``."""
        traces = tuple(as_trace(t) for t in result.traces)
        lags = tuple(int(getattr(t, "policy_lag", 0)) for t in result.traces)
        return cls(result.task_id, result.session_id, result.status, float(result.reward), traces, lags)


def trace_lag(trace: Trace, current_version: int, reported: int = 0) -> int:
    """How many versions the trace's oldest call is behind ``current_version`` (at least ``reported``).

    The trainer recomputes the lag at training time from the versions the proxy stamped on the calls, since
    the fleet may have moved on since the rollout server recorded the result.
    """
    versions = [parse_version(v) for v in trace.policy_versions] or [INITIAL]
    return max(reported, current_version - min(versions), 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """The traces of one optimiser step and the bookkeeping of how they were chosen.

    Attributes:
        traces: Traces that reach the loss (trainable tokens, within the lag bound).
        lags: The lag of each of ``traces``.
        current_version: The version being trained (the one the batch's gradient is applied to).
        max_policy_lag: The bound the batch was built under.
        sessions: Every session considered.
        stale_traces: Traces with trainable tokens dropped for being beyond the bound.
        stale_tokens: Their trainable tokens.
        untrainable_traces: Traces without a trainable token or with weight 0 (e.g. ``infra_error``).
    """

    traces: tuple[Trace, ...]
    lags: tuple[int, ...]
    current_version: int
    max_policy_lag: int
    sessions: tuple[SessionSample, ...]
    stale_traces: int
    stale_tokens: int
    untrainable_traces: int

    @property
    def trainable_tokens(self) -> int:
        """Mask-1 tokens that reach the loss."""
        return sum(sum(t.loss_mask) for t in self.traces)

    def status_counts(self) -> dict[str, int]:
        """Sessions by terminal status."""
        return dict(sorted(Counter(s.status for s in self.sessions).items()))

    def rewards(self) -> list[float]:
        """The reward of every session that ran to an evaluation (each once; not ``infra_error``/``cancelled``)."""
        return [s.reward for s in self.sessions if s.status not in _NOT_EVALUATED]

    def lag_summary(self) -> dict[str, float]:
        """Minimum, mean and maximum lag of the traces that reach the loss (zeros when there are none)."""
        if not self.lags:
            return {"min": 0.0, "mean": 0.0, "max": 0.0}
        return {"min": float(min(self.lags)), "mean": statistics.fmean(self.lags), "max": float(max(self.lags))}


def build_batch(sessions: Iterable[SessionSample], *, current_version: int, max_policy_lag: int) -> Batch:
    """Choose the traces that reach the loss: trainable, weighted, and within ``max_policy_lag``.

    Args:
        sessions: Finished sessions of the step's groups.
        current_version: The version being trained.
        max_policy_lag: The staleness bound.
    """
    considered = tuple(sessions)
    kept: list[Trace] = []
    lags: list[int] = []
    stale = stale_tokens = untrainable = 0
    for session in considered:
        reported = session.reported_lags or (0,) * len(session.traces)
        for trace, reported_lag in zip(session.traces, reported, strict=True):
            if not any(trace.loss_mask) or trace.weight <= 0:
                untrainable += 1
                continue
            lag = trace_lag(trace, current_version, reported_lag)
            if lag > max_policy_lag:
                stale += 1
                stale_tokens += sum(trace.loss_mask)
                continue
            kept.append(trace)
            lags.append(lag)
    batch = Batch(
        tuple(kept), tuple(lags), current_version, max_policy_lag, considered, stale, stale_tokens, untrainable
    )
    check_lag_bound(batch.traces, current_version=current_version, max_policy_lag=max_policy_lag)
    return batch


def check_lag_bound(traces: Sequence[Trace], *, current_version: int, max_policy_lag: int) -> None:
    """Raise :class:`LagBoundViolated` if any trace with a trainable token is beyond the bound.

    Called on every batch just before the loss, independently of how the batch was chosen.
    """
    for trace in traces:
        if any(trace.loss_mask) and trace_lag(trace, current_version) > max_policy_lag:
            raise LagBoundViolated(
                f"trace {trace.session_id}/{trace.trace_index} (versions {trace.policy_versions}) is more than "
                f"{max_policy_lag} behind version {current_version}"
            )
