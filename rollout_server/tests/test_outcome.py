"""Unit tests of :func:`rollout_server.outcome.decide_outcome`: one table of cases, no store, no clock, no I/O."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from polar_core.records import TerminalStatus
from rollout_server.models import (
    CallbackTarget,
    ResultRecord,
    SessionRecord,
    SessionState,
    StalePolicy,
    TaskRecord,
    TaskState,
)
from rollout_server.outcome import FinishSession, RetryReason, RetrySession, decide_outcome
from rollout_server.staleness import StaleDecision

_NOW = 1000.0
_BACKOFF = 2.0
_MAX_ATTEMPTS = 3
_CALLBACK = CallbackTarget("http", "http://trainer/cb")


def _task(**changes: Any) -> TaskRecord:
    task = TaskRecord(
        task_id="t",
        spec=b"",
        spec_hash="h",
        num_samples=1,
        priority=0,
        early_stop_min_usable=0,
        session_timeout_s=60.0,
        callback=None,
        state=TaskState.RUNNING,
        submitted_at=0.0,
        deadline=_NOW + 100.0,
    )
    return dataclasses.replace(task, **changes)


def _session(**changes: Any) -> SessionRecord:
    session = SessionRecord("t-0000", "t", 0, state=SessionState.RUNNING, attempt=1, gateway_id="g1")
    session.dispatched_at, session.deadline = _NOW - 10.0, _NOW + 50.0
    return dataclasses.replace(session, **changes)


def _result(status: TerminalStatus = TerminalStatus.RESOLVED, **changes: Any) -> ResultRecord:
    result = ResultRecord(
        session_id="t-0000",
        task_id="t",
        sample_index=0,
        status=status,
        reward=1.0 if status is TerminalStatus.RESOLVED else 0.0,
        attempt=1,
        gateway_id="g1",
        idempotency_key="t-0000#1",
        payload=b"traces",
    )
    return dataclasses.replace(result, **changes)


@dataclasses.dataclass(frozen=True)
class Retry:
    """An expected :class:`RetrySession`."""

    reason: RetryReason
    not_before: float
    infra_failures: int = 0
    outages: int = 0
    stale_resamples: int = 0


@dataclasses.dataclass(frozen=True)
class Finish:
    """An expected :class:`FinishSession`."""

    status: TerminalStatus
    staleness: StaleDecision = StaleDecision.FRESH
    delivery: bool = False
    settle_task: bool = True
    infra_failures: int = 0
    outages: int = 0
    policy_lag: int = 0


_INFRA = TerminalStatus.INFRA_ERROR
_OUTAGE: dict[str, Any] = {"dependency_unavailable": True}
_LAG_2: dict[str, Any] = {"policy_versions": ["3"]}  # with the fleet at version 5
_CASES: list[tuple[str, dict[str, Any], ResultRecord, TaskRecord | None, Retry | Finish]] = [
    ("resolved is final", {}, _result(), _task(), Finish(TerminalStatus.RESOLVED)),
    ("unresolved is final", {}, _result(TerminalStatus.UNRESOLVED), _task(), Finish(TerminalStatus.UNRESOLVED)),
    (
        "agent_timeout is final",
        {},
        _result(TerminalStatus.AGENT_TIMEOUT),
        _task(),
        Finish(TerminalStatus.AGENT_TIMEOUT),
    ),
    (
        "a callback queues a delivery",
        {},
        _result(),
        _task(callback=_CALLBACK),
        Finish(TerminalStatus.RESOLVED, delivery=True),
    ),
    (
        "first infra_error retries after one step",
        {},
        _result(_INFRA),
        _task(),
        Retry(RetryReason.INFRA_ERROR, _NOW + _BACKOFF, infra_failures=1),
    ),
    (
        "second infra_error backs off two steps",
        {"attempt": 2, "infra_failures": 1},
        _result(_INFRA, attempt=2),
        _task(),
        Retry(RetryReason.INFRA_ERROR, _NOW + 2 * _BACKOFF, infra_failures=2),
    ),
    (
        "infra_error on the last attempt is final",
        {"attempt": 3, "infra_failures": 2},
        _result(_INFRA, attempt=3),
        _task(callback=_CALLBACK),
        Finish(_INFRA, infra_failures=3, delivery=True),
    ),
    (
        "infra_error of a finished task is final",
        {},
        _result(_INFRA),
        _task(state=TaskState.CANCELLED),
        Finish(_INFRA, infra_failures=1, settle_task=False),
    ),
    (
        "infra_error of a deleted task is final",
        {},
        _result(_INFRA),
        None,
        Finish(_INFRA, infra_failures=1, settle_task=False),
    ),
    (
        "an outage uses up no attempt",
        {"attempt": 5, "outages": 4},
        _result(_INFRA, attempt=5, **_OUTAGE),
        _task(),
        Retry(RetryReason.DEPENDENCY_UNAVAILABLE, _NOW + 8 * _BACKOFF, outages=5),
    ),
    (
        "an outage's first retry is one step",
        {},
        _result(_INFRA, **_OUTAGE),
        _task(),
        Retry(RetryReason.DEPENDENCY_UNAVAILABLE, _NOW + _BACKOFF, outages=1),
    ),
    (
        "resamples use up no attempt",
        {"attempt": 3, "stale_resamples": 1, "infra_failures": 1},
        _result(_INFRA, attempt=3),
        _task(),
        Retry(RetryReason.INFRA_ERROR, _NOW + 2 * _BACKOFF, infra_failures=2, stale_resamples=1),
    ),
    (
        "an outage of a finished task is final",
        {},
        _result(_INFRA, **_OUTAGE),
        _task(state=TaskState.COMPLETED),
        Finish(_INFRA, outages=1, settle_task=False),
    ),
    (
        "within the bound is fresh",
        {},
        _result(**_LAG_2),
        _task(max_policy_lag=2, stale_policy=StalePolicy.RESAMPLE),
        Finish(TerminalStatus.RESOLVED, policy_lag=2),
    ),
    (
        "beyond the bound, keep",
        {},
        _result(**_LAG_2),
        _task(max_policy_lag=1, stale_policy=StalePolicy.KEEP),
        Finish(TerminalStatus.RESOLVED, StaleDecision.KEEP, policy_lag=2),
    ),
    (
        "beyond the bound, resample at once",
        {"infra_failures": 1},
        _result(**_LAG_2),
        _task(max_policy_lag=1, stale_policy=StalePolicy.RESAMPLE),
        Retry(RetryReason.STALE_POLICY, _NOW, infra_failures=1, stale_resamples=1),
    ),
    (
        "beyond the bound, no time left: dropped",
        {},
        _result(**_LAG_2),
        _task(max_policy_lag=1, stale_policy=StalePolicy.RESAMPLE, deadline=_NOW),
        Finish(TerminalStatus.CANCELLED, StaleDecision.DROP, policy_lag=2),
    ),
    (
        "untrainable results are never stale",
        {"attempt": 3, "infra_failures": 2},
        _result(_INFRA, attempt=3, **_LAG_2),
        _task(max_policy_lag=0, stale_policy=StalePolicy.RESAMPLE),
        Finish(_INFRA, infra_failures=3, policy_lag=2),
    ),
    (
        "a call newer than the fleet moves the fleet",
        {},
        _result(policy_versions=["3", "7"]),
        _task(max_policy_lag=3),
        Finish(TerminalStatus.RESOLVED, StaleDecision.KEEP, policy_lag=4),
    ),
    (
        "a version that is not a number is the initial one, 0",
        {},
        _result(policy_versions=["v1"]),
        _task(max_policy_lag=0),
        Finish(TerminalStatus.RESOLVED, StaleDecision.KEEP, policy_lag=5),
    ),
]


@pytest.mark.parametrize(
    ("session_changes", "result", "task", "expected"), [c[1:] for c in _CASES], ids=[c[0] for c in _CASES]
)
def test_decide_outcome(
    session_changes: dict[str, Any], result: ResultRecord, task: TaskRecord | None, expected: Retry | Finish
) -> None:
    session = _session(**session_changes)
    before = (dataclasses.replace(session), dataclasses.replace(result))
    outcome = decide_outcome(
        session, result, task, current_version=5, now=_NOW, max_attempts=_MAX_ATTEMPTS, retry_backoff_s=_BACKOFF
    )
    assert (session, result) == before  # the inputs are left as they were
    assert outcome.result.recorded_at == _NOW
    assert outcome.session.attempt == session.attempt
    if isinstance(expected, Retry):
        assert isinstance(outcome, RetrySession)
        assert outcome.reason is expected.reason
        assert outcome.result.status is result.status  # the ledger keeps the report as it was sent
        got = outcome.session
        assert (got.state, got.gateway_id, got.dispatched_at, got.deadline) == (SessionState.PENDING, "", None, None)
        assert got.not_before == expected.not_before
        assert (got.infra_failures, got.outages, got.stale_resamples) == (
            expected.infra_failures,
            expected.outages,
            expected.stale_resamples,
        )
        return
    assert isinstance(outcome, FinishSession)
    assert outcome.result.status is expected.status
    assert outcome.staleness is expected.staleness
    assert outcome.settle_task is expected.settle_task
    assert outcome.result.policy_lag == expected.policy_lag
    assert outcome.session.state is SessionState.DONE
    assert (outcome.session.infra_failures, outcome.session.outages) == (expected.infra_failures, expected.outages)
    if expected.staleness is StaleDecision.DROP:
        assert (outcome.result.payload, outcome.result.reward) == (b"", 0.0)
    else:
        assert outcome.result.payload == result.payload
    if expected.delivery:
        assert outcome.delivery is not None
        assert (outcome.delivery.idempotency_key, outcome.delivery.next_attempt_at) == (result.idempotency_key, _NOW)
    else:
        assert outcome.delivery is None


def test_the_fleet_version_is_recorded_with_the_lag() -> None:
    outcome = decide_outcome(
        _session(),
        _result(policy_versions=["3", "7"]),
        _task(),
        current_version=5,
        now=_NOW,
        max_attempts=3,
        retry_backoff_s=1.0,
    )
    assert (outcome.result.fleet_version, outcome.result.policy_lag) == (7, 4)


def test_a_retried_attempt_is_recorded_without_its_lag() -> None:
    # The ledger row of a retried attempt carries no lag: only final results are measured against the fleet.
    outcome = decide_outcome(
        _session(),
        _result(_INFRA, policy_versions=["1"]),
        _task(),
        current_version=5,
        now=_NOW,
        max_attempts=3,
        retry_backoff_s=1.0,
    )
    assert isinstance(outcome, RetrySession)
    assert (outcome.result.fleet_version, outcome.result.policy_lag) == (0, 0)
