"""What an attempt's result does to its session: retry it, sample it again, or finish it. Pure, no I/O.

:func:`decide_outcome` states the rule once, from the session and the result as read, the task, the fleet's
policy version and the clock; :meth:`rollout_server.core.RolloutCore.apply_outcome` reads those inputs, calls it
and applies the :data:`Outcome` in the store in one transaction (persist before act).

The rule, in the order it is applied:

1. Only ``infra_error`` is retried, while the task is active and attempts remain; model outcomes are final.
   An attempt lost to an unreachable dependency (``dependency_unavailable``, an *outage*) does not use up an
   attempt and backs off at most 8 steps; any other ``infra_error`` backs off exponentially.
2. Otherwise the result is final. A trainable result beyond its task's ``max_policy_lag`` is decided by
   :func:`rollout_server.staleness.decide`: kept with its lag, sampled again at once (``resample``, which uses
   up no attempt either), or recorded without its traces when the task leaves no time to sample again.
3. A final result is queued for delivery when the task has a callback.
"""

from __future__ import annotations

import dataclasses
import enum

from polar_core.records import TerminalStatus
from rollout_server.models import DeliveryRecord, ResultRecord, SessionRecord, SessionState, TaskRecord
from rollout_server.staleness import StaleDecision, decide, dropped_result, with_lag

__all__ = ["FinishSession", "Outcome", "RetryReason", "RetrySession", "decide_outcome"]


class RetryReason(enum.Enum):
    """Why a session goes back to the queue (the value is the ``reason`` label of the retry metric)."""

    INFRA_ERROR = "infra_error"
    DEPENDENCY_UNAVAILABLE = "dependency_unavailable"
    STALE_POLICY = "stale_policy"


@dataclasses.dataclass(frozen=True, slots=True)
class RetrySession:
    """Record the attempt's report in the ledger only, and queue the session again.

    Attributes:
        result: The attempt's report, as it is recorded.
        session: The session, pending again, to write in place of the one read.
        reason: Why it runs again.
    """

    result: ResultRecord
    session: SessionRecord
    reason: RetryReason


@dataclasses.dataclass(frozen=True, slots=True)
class FinishSession:
    """Record the session's final result, finish it and queue the result's delivery.

    Attributes:
        result: The final result (with its lag; cancelled and without traces when ``staleness`` is ``DROP``).
        session: The session, done, to write in place of the one read.
        delivery: The delivery to queue, when the task has a callback.
        staleness: What the task's staleness bound said (``FRESH``, ``KEEP`` or ``DROP``).
        settle_task: Whether the task was active, so it may now be settled.
    """

    result: ResultRecord
    session: SessionRecord
    delivery: DeliveryRecord | None
    staleness: StaleDecision
    settle_task: bool


Outcome = RetrySession | FinishSession
"""What applying a result does, as :func:`decide_outcome` decides it."""


def decide_outcome(
    session: SessionRecord,
    result: ResultRecord,
    task: TaskRecord | None,
    *,
    current_version: int,
    now: float,
    max_attempts: int,
    retry_backoff_s: float,
) -> Outcome:
    """Decide what ``result`` (an attempt of ``session``, as read) does; see the module docstring for the rule.

    Args:
        session: The session as read from the store.
        result: The attempt's result; it is not changed (the outcome carries the copy to record).
        task: The session's task, or ``None`` when it is gone.
        current_version: The fleet's policy version (only used when the result carries policy versions).
        now: Unix time the result is recorded at.
        max_attempts: Attempts a session may use up (``CoreConfig.max_attempts``).
        retry_backoff_s: One backoff step (``CoreConfig.retry_backoff_s``).
    """
    result = dataclasses.replace(result, recorded_at=now)
    active = task is not None and not task.state.terminal
    infra = result.status is TerminalStatus.INFRA_ERROR
    outage = infra and result.dependency_unavailable
    failures = session.infra_failures + (1 if infra and not outage else 0)
    outages = session.outages + (1 if outage else 0)
    counted = session.attempt - session.stale_resamples - outages  # neither uses up attempts
    if infra and active and counted < max_attempts:
        steps = min(2 ** (outages - 1), 8) if outage else 2 ** (failures - 1)
        again = dataclasses.replace(
            _pending(session, not_before=now + retry_backoff_s * steps), infra_failures=failures, outages=outages
        )
        reason = RetryReason.DEPENDENCY_UNAVAILABLE if outage else RetryReason.INFRA_ERROR
        return RetrySession(result, again, reason)
    if result.policy_versions:
        result = with_lag(result, current_version)
    staleness = StaleDecision.FRESH
    if task is not None and result.status.trainable:  # untrainable traces carry no loss whatever their lag
        staleness = decide(task, result.policy_lag, now=now)
    if staleness is StaleDecision.RESAMPLE:
        again = dataclasses.replace(
            _pending(session, not_before=now), infra_failures=failures, stale_resamples=session.stale_resamples + 1
        )
        return RetrySession(result, again, RetryReason.STALE_POLICY)
    if task is not None and staleness is StaleDecision.DROP:
        result = dropped_result(result, task)
    done = dataclasses.replace(session, state=SessionState.DONE, infra_failures=failures, outages=outages)
    delivery = None
    if task is not None and task.callback is not None:
        delivery = DeliveryRecord(result.idempotency_key, task.task_id, session.session_id, task.callback)
        delivery.next_attempt_at = now
    return FinishSession(result, done, delivery, staleness, settle_task=active)


def _pending(session: SessionRecord, *, not_before: float) -> SessionRecord:
    """``session`` queued again from ``not_before``, off its gateway."""
    return dataclasses.replace(
        session, state=SessionState.PENDING, gateway_id="", not_before=not_before, dispatched_at=None, deadline=None
    )
