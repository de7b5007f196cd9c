"""The evaluation lane against an in-memory rollout server: the pin is checked per call, reports are honest."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf import json_format
from polar.common.v1 import session_pb2, task_pb2, trace_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb

from polar_client.evaluation import EvalLane, EvalSession, EvalTask, check_pin, summarize_round
from polar_core.errors import InvalidArgument


def _result(
    session_id: str, versions: list[str], *, reward: float = 1.0, status: str = "resolved", calls: int | None = None
) -> session_pb2.SessionResult:
    result = session_pb2.SessionResult(session_id=session_id, status=status, reward=reward)
    result.statistics.completions = len(versions) if calls is None else calls
    if versions:
        result.traces.append(trace_pb2.Trace(session_id=session_id, policy_versions=versions))
    return result


class FakeRollout:
    """Submit and watch: each task's sessions are the results ``plan`` names for it, in order."""

    def __init__(self, plan: dict[str, list[session_pb2.SessionResult]], gate: asyncio.Event | None = None) -> None:
        self.plan = plan
        self.submitted: list[task_pb2.Task] = []
        self.cancelled: list[str] = []
        self._gate = gate

    async def submit(self, task: task_pb2.Task, *, task_timeout_s: float | None = None) -> pb.SubmitTaskResponse:
        self.submitted.append(task)
        return pb.SubmitTaskResponse(task_id=task.task_id)

    async def watch(self, task_id: str) -> AsyncIterator[session_pb2.SessionResult]:
        if self._gate is not None:
            await self._gate.wait()
        name = task_id.rsplit("-", 1)[1]
        for result in self.plan[name]:
            yield result

    async def cancel(self, task_id: str, reason: str = "") -> pb.TaskInfo:
        self.cancelled.append(task_id)
        return pb.TaskInfo()


def _task(task_id: str) -> task_pb2.Task:
    task = task_pb2.Task(task_id=task_id, instruction="held out", num_samples=99)
    task.metadata.update({"dataset": "heldout"})
    return task


def test_an_eval_task_needs_samples_and_an_id() -> None:
    with pytest.raises(InvalidArgument, match="samples must be an integer >= 1"):
        EvalTask(_task("a"), 0)
    with pytest.raises(InvalidArgument, match="needs a task_id"):
        EvalTask(task_pb2.Task(), 2)
    with pytest.raises(InvalidArgument, match="at least one held-out task"):
        EvalLane(FakeRollout({}), [], task_id_prefix="run")
    with pytest.raises(InvalidArgument, match="distinct"):
        EvalLane(FakeRollout({}), [EvalTask(_task("a"), 1), EvalTask(_task("a"), 2)], task_id_prefix="run")


def test_a_session_matches_only_when_every_call_carries_the_pinned_version() -> None:
    assert check_pin(_result("s", ["3"]), 3) == (True, ("3",))
    assert check_pin(_result("s", ["3", "4"]), 3) == (False, ("3", "4"))
    assert check_pin(_result("s", ["base"]), 0) == (True, ("base",))  # a label is the initial policy
    assert check_pin(_result("s", [], calls=0, status="agent_timeout"), 3) == (True, ())  # nothing was sampled
    # Calls were recorded but no trace names their version (reconstruction failed): it cannot be vouched for.
    assert check_pin(_result("s", [], calls=2, status="infra_error"), 3) == (False, ())


async def test_a_round_reports_the_pinned_version_and_sets_mismatched_sessions_apart(tmp_path: Path) -> None:
    plan = {
        "easy": [_result("e0", ["2"]), _result("e1", ["2"], reward=0.5, status="unresolved")],
        # The fleet moved to v3 while hard-1 ran: its later call was sampled by other weights.
        "hard": [_result("h0", ["2"], reward=0.0, status="unresolved"), _result("h1", ["2", "3"])],
    }
    fleet = FakeRollout(plan)
    lane = EvalLane(
        fleet,
        [EvalTask(_task("easy"), 2), EvalTask(_task("hard"), 2)],
        task_id_prefix="run",
        report_path=tmp_path / "eval.jsonl",
        sessions_path=tmp_path / "eval_sessions.jsonl",
        task_timeout_s=30.0,
    )
    report = await lane.run_round(2, step=1)

    assert [t.task_id for t in fleet.submitted] == ["run-eval-v2-r000-easy", "run-eval-v2-r000-hard"]
    assert [t.num_samples for t in fleet.submitted] == [2, 2]
    tag = json_format.MessageToDict(fleet.submitted[0].metadata)
    assert tag == {"dataset": "heldout", "polar_eval": {"round": 0.0, "policy_version": 2.0, "task_id": "easy"}}
    assert (report.round, report.policy_version, report.step, report.tasks) == (0, 2, 1, 2)
    assert (report.sessions, report.sessions_total, report.mismatched_sessions) == (3, 4, 1)
    assert report.mean_reward == pytest.approx(0.5)  # (1 + 0.5 + 0) / 3: h1 is not the pinned version's
    assert report.resolved_rate == pytest.approx(1 / 3)
    assert report.mismatched == ({"session_id": "h1", "policy_versions": ["2", "3"]},)
    assert report.by_task["hard"] == {"sessions": 1, "mean_reward": 0.0, "resolved_rate": 0.0}
    assert not report.complete

    [line] = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert line["policy_version"] == 2
    assert line["mismatched_sessions"] == 1
    assert line["complete"] is False
    sessions = [json.loads(x) for x in (tmp_path / "eval_sessions.jsonl").read_text().splitlines()]
    assert {(s["session_id"], s["policy_version"], s["matched"]) for s in sessions} == {
        ("e0", 2, True),
        ("e1", 2, True),
        ("h0", 2, True),
        ("h1", 2, False),
    }

    # A lane continuing the same report file (a resumed run) numbers its rounds after the reported ones.
    again = EvalLane(fleet, [EvalTask(_task("easy"), 1)], task_id_prefix="run", report_path=tmp_path / "eval.jsonl")
    assert again.evaluated(2)
    assert not again.evaluated(3)
    await again.start_round(3)
    assert fleet.submitted[-1].task_id == "run-eval-v3-r001-easy"


def test_failures_of_the_infrastructure_are_counted_but_earn_no_reward() -> None:
    sessions = [
        EvalSession(0, 1, "t", "x", "a", "resolved", 1.0, ("1",), True),
        EvalSession(0, 1, "t", "x", "b", "infra_error", 0.0, (), True),
    ]
    report = summarize_round(0, 1, None, ["t"], sessions, 1.0)
    assert (report.sessions, report.mean_reward, report.resolved_rate) == (2, 1.0, 1.0)
    assert report.by_status == {"infra_error": 1, "resolved": 1}


async def test_rounds_run_in_the_background_and_cancel_leaves_nothing_running() -> None:
    gate = asyncio.Event()
    fleet = FakeRollout({"easy": [_result("e0", ["0"])]}, gate=gate)
    lane = EvalLane(fleet, [EvalTask(_task("easy"), 1)], task_id_prefix="run")
    round_task = lane.start_round(0)
    await asyncio.sleep(0.01)
    assert not round_task.done()  # waiting for its sessions; the caller goes on
    await lane.cancel()
    assert round_task.cancelled()
    assert fleet.cancelled == ["run-eval-v0-r000-easy"]
