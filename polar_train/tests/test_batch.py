"""Batch building: which traces reach the loss, their lag, and the counts of what was left out."""

from __future__ import annotations

import pytest
from polar.common.v1 import session_pb2, trace_pb2

from polar_core.records import Trace
from polar_train.batch import (
    Batch,
    LagBoundViolated,
    SessionSample,
    build_batch,
    check_lag_bound,
    trace_lag,
)


def _trace(session: str, versions: list[str], *, mask: list[int] | None = None, weight: float = 1.0) -> Trace:
    loss_mask = mask if mask is not None else [1, 1, 1]
    return Trace(
        session_id=session,
        task_id="t",
        trace_index=0,
        call_ids=["c"],
        prompt_token_ids=[1, 2],
        response_token_ids=[3, 4, 5],
        loss_mask=loss_mask,
        response_logprobs=[-1.0, -1.0, -1.0],
        weight=weight,
        policy_versions=versions,
    )


def _session(name: str, *traces: Trace, status: str = "unresolved", reward: float = 0.5) -> SessionSample:
    return SessionSample("t", name, status, reward, traces, (0,) * len(traces))


def test_lag_is_measured_from_the_oldest_call_and_never_below_the_reported_one() -> None:
    assert trace_lag(_trace("s", ["2", "3"]), 3) == 1
    assert trace_lag(_trace("s", ["3"]), 3) == 0
    assert trace_lag(_trace("s", ["3"]), 3, reported=2) == 2
    # An unknown (non-integer) version counts as the initial policy, so a lag is over- rather than under-estimated.
    assert trace_lag(_trace("s", ["base"]), 2) == 2
    assert trace_lag(_trace("s", []), 1) == 1


def test_traces_beyond_the_bound_are_dropped_and_counted() -> None:
    sessions = [
        _session("fresh", _trace("fresh", ["3"])),
        _session("one-behind", _trace("one-behind", ["2"])),
        _session("two-behind", _trace("two-behind", ["1", "3"])),
        _session("straddling", _trace("straddling-a", ["1"]), _trace("straddling-b", ["3"])),
    ]
    batch = build_batch(sessions, current_version=3, max_policy_lag=1)
    assert [t.session_id for t in batch.traces] == ["fresh", "one-behind", "straddling-b"]
    assert batch.lags == (0, 1, 0)
    assert batch.stale_traces == 2
    assert batch.stale_tokens == 6
    assert batch.trainable_tokens == 9
    assert batch.lag_summary() == {"min": 0.0, "mean": pytest.approx(1 / 3), "max": 1.0}


def test_a_zero_bound_keeps_only_current_tokens() -> None:
    sessions = [_session("a", _trace("a", ["4"])), _session("b", _trace("b", ["3"]))]
    batch = build_batch(sessions, current_version=4, max_policy_lag=0)
    assert [t.session_id for t in batch.traces] == ["a"]


def test_traces_without_trainable_tokens_are_left_out_but_their_sessions_counted() -> None:
    sessions = [
        _session("ok", _trace("ok", ["0"]), reward=1.0, status="resolved"),
        _session("masked", _trace("masked", ["0"], mask=[0, 0, 0])),
        _session("infra", _trace("infra", ["0"], weight=0.0), status="infra_error", reward=0.0),
    ]
    batch = build_batch(sessions, current_version=0, max_policy_lag=0)
    assert [t.session_id for t in batch.traces] == ["ok"]
    assert batch.untrainable_traces == 2
    assert batch.status_counts() == {"infra_error": 1, "resolved": 1, "unresolved": 1}
    assert batch.rewards() == [1.0, 0.5]  # an infra_error's 0.0 is not a reward the policy earned


def test_check_lag_bound_rejects_a_stale_trace_that_skipped_build_batch() -> None:
    stale = _trace("stale", ["0"])
    with pytest.raises(LagBoundViolated, match="more than 1 behind version 2"):
        check_lag_bound([stale], current_version=2, max_policy_lag=1)
    check_lag_bound([_trace("masked", ["0"], mask=[0, 0, 0])], current_version=2, max_policy_lag=1)
    hand_made = Batch((stale,), (2,), 2, 1, (), 0, 0, 0)
    with pytest.raises(LagBoundViolated):
        check_lag_bound(hand_made.traces, current_version=hand_made.current_version, max_policy_lag=1)


def test_session_sample_reads_a_session_result_with_the_servers_lag() -> None:
    result = session_pb2.SessionResult(task_id="t", session_id="s", status="resolved", reward=0.75)
    result.traces.append(
        trace_pb2.Trace(
            session_id="s",
            task_id="t",
            prompt_token_ids=[1],
            response_token_ids=[2, 3],
            loss_mask=[1, 1],
            response_logprobs=[-0.5, -0.25],
            weight=1.0,
            policy_versions=["5"],
            policy_lag=2,
        )
    )
    sample = SessionSample.from_result(result)
    assert sample.reported_lags == (2,)
    assert sample.traces[0].response_token_ids == [2, 3]
    # The server saw it two versions behind when it recorded it; the trainer never trusts a smaller lag.
    assert build_batch([sample], current_version=5, max_policy_lag=1).stale_traces == 1
