"""Unit tests of task statistics and protobuf conversion."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2
from polar.common.v1 import session_pb2, status_pb2, task_pb2, trace_pb2

from polar_core.errors import InvalidArgument
from polar_core.records import TerminalStatus
from rollout_server.convert import (
    new_task_from_proto,
    result_from_proto,
    result_to_proto,
    results_page_to_proto,
    split_result,
)
from rollout_server.models import ResultRecord, SessionRecord, SessionState, TaskRecord, TaskState
from rollout_server.stats import Distribution, summarize


def _result(sid: str, status: TerminalStatus, reward: float, versions: list[str]) -> ResultRecord:
    return ResultRecord(
        sid, "t", 0, status, reward, 1, "g", sid, duration_s=10.0, calls=4, chains=2, policy_versions=versions
    )


def test_distribution() -> None:
    d = Distribution.of([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (d.count, d.mean, d.p50, d.p90, d.max) == (5, 22.0, 3.0, 100.0, 100.0)
    assert Distribution.of([]) == Distribution()


def test_summary_reports_policy_age_next_to_reward() -> None:
    task = TaskRecord("t", b"", "h", 4, 0, 0, 60.0, None, TaskState.RUNNING, 0.0, 100.0)
    sessions = [SessionRecord(f"s{i}", "t", i, SessionState.DONE, attempt=1 + (i == 3)) for i in range(4)]
    results = [
        _result("s0", TerminalStatus.RESOLVED, 1.0, ["10"]),
        _result("s1", TerminalStatus.UNRESOLVED, 0.0, ["base", "10"]),  # a label is the initial policy, 0
        _result("s2", TerminalStatus.AGENT_TIMEOUT, 0.0, ["9"]),
        _result("s3", TerminalStatus.INFRA_ERROR, 0.0, []),
    ]
    summary = summarize(task, sessions, results, ["0", "9", "10", "base"], {})
    st = summary.statistics
    assert summary.sessions_usable == 3
    assert summary.mean_reward == pytest.approx(1 / 3)
    assert [(b.policy_age, b.sessions, b.mean_reward) for b in st.reward_by_policy_age] == [
        (0, 1, 1.0),
        (1, 1, 0.0),
        (2, 1, 0.0),
    ]
    assert (st.sessions_dropped, st.sessions_retried, st.sessions_truncated, st.attempts_total) == (1, 1, 1, 5)
    assert st.calls.mean == 4
    assert summary.sessions_by_status == {"resolved": 1, "unresolved": 1, "agent_timeout": 1, "infra_error": 1}


def test_task_conversion_validates_and_hashes_deterministically() -> None:
    task = task_pb2.Task(
        task_id="a", instruction="x", num_samples=2, callback=task_pb2.CallbackSpec(http_url="http://h/cb")
    )
    first = new_task_from_proto(task)
    assert first.callback is not None
    assert first.callback.kind == "http"
    assert first.session_timeout_s == 600.0
    assert new_task_from_proto(task).spec_hash == first.spec_hash
    assert new_task_from_proto(task, duration_pb2.Duration(seconds=5)).spec_hash != first.spec_hash
    assert new_task_from_proto(task_pb2.Task(instruction="x", num_samples=1)).task_id  # assigned
    with pytest.raises(InvalidArgument):
        new_task_from_proto(task_pb2.Task(task_id="a", instruction="x", num_samples=0))
    with pytest.raises(InvalidArgument):
        new_task_from_proto(
            task_pb2.Task(
                task_id="a", instruction="x", num_samples=1, callback=task_pb2.CallbackSpec(http_url="ftp://x")
            )
        )


def test_result_conversion_round_trips_and_checks_status() -> None:
    pb = session_pb2.SessionResult(session_id="s", status="resolved", reward=1.0, attempt=2, gateway_id="g")
    pb.timings["total"] = 3.5
    record = result_from_proto(pb)
    assert record.status is TerminalStatus.RESOLVED
    assert record.duration_s == 3.5
    back = result_to_proto(record)
    assert back.terminal_status == status_pb2.TERMINAL_STATUS_RESOLVED
    assert back.timings["total"] == 3.5
    with pytest.raises(InvalidArgument):
        result_from_proto(session_pb2.SessionResult(session_id="s", status="great"))
    with pytest.raises(InvalidArgument):
        result_from_proto(
            session_pb2.SessionResult(
                session_id="s", status="resolved", terminal_status=status_pb2.TERMINAL_STATUS_INFRA_ERROR
            )
        )
    with pytest.raises(InvalidArgument):
        result_from_proto(session_pb2.SessionResult(session_id="s"))


def test_task_results_page_by_count_and_bytes_and_may_omit_traces() -> None:
    def stored(index: int) -> ResultRecord:
        payload = session_pb2.SessionResult(traces=[trace_pb2.Trace(prompt_token_ids=[1] * 1000)])
        record = _result(f"s{index}", TerminalStatus.RESOLVED, 1.0, [])
        record.payload = payload.SerializeToString()
        record.result_index = index
        return record

    records = [stored(i) for i in range(5)]
    size = result_to_proto(records[0]).ByteSize()
    page, next_index, _ = results_page_to_proto(records, omit_traces=False, max_results=0, max_bytes=2 * size + 1)
    assert [r.session_id for r in page] == ["s0", "s1"]
    assert next_index == 2
    page, next_index, _ = results_page_to_proto(records[4:], omit_traces=False, max_results=0, max_bytes=1)
    assert [r.session_id for r in page] == ["s4"]  # one even over the budget; the last page
    assert next_index == 0
    page, next_index, _ = results_page_to_proto(records, omit_traces=True, max_results=3, max_bytes=0)
    assert [len(r.traces) for r in page] == [0, 0, 0]
    assert next_index == 3


def test_a_result_over_max_result_bytes_is_read_in_parts_that_join_to_the_whole():
    def stored(index: int, traces: int) -> ResultRecord:
        payload = session_pb2.SessionResult(
            traces=[trace_pb2.Trace(trace_index=i, prompt_token_ids=[1] * 1000) for i in range(traces)]
        )
        record = _result(f"s{index}", TerminalStatus.RESOLVED, 1.0, [])
        record.payload = payload.SerializeToString()
        record.result_index = index
        return record

    records = [stored(0, 1), stored(1, 7), stored(2, 1)]
    one = result_to_proto(records[0]).ByteSize()
    budget = 2 * one + 100  # two traces of the long result per part
    got: list[tuple[str, list[int]]] = []
    index, trace = 0, 0
    for _ in range(20):
        page, index, trace = results_page_to_proto(
            records[index:],
            omit_traces=False,
            max_results=0,
            max_bytes=budget,
            from_trace=trace,
            max_result_bytes=budget,
        )
        assert sum(r.ByteSize() for r in page) <= budget
        got.extend((r.session_id, [t.trace_index for t in r.traces]) for r in page)
        if not index and not trace:
            break
    assert got == [("s0", [0]), ("s1", [0, 1]), ("s1", [2, 3]), ("s1", [4, 5]), ("s1", [6]), ("s2", [0])]
    # Without max_result_bytes a page holds the whole result, however large (what old clients expect).
    page, index, trace = results_page_to_proto(records[1:], omit_traces=False, max_results=0, max_bytes=budget)
    assert [len(r.traces) for r in page] == [7]
    assert (index, trace) == (2, 0)
    parts = split_result(result_to_proto(records[1]), budget)
    assert [first for _, first in parts] == [0, 2, 4, 6]
    assert all(p.session_id == "s1" for p, _ in parts)
