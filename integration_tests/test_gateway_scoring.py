"""Scoring with the real parts: a real gateway, model proxy (scripted backend), reconstructor and evaluator, the
local runtime and the ``command`` harness (issue #12, points 3, 4 and 7).

* an agent that writes the reference fix of ``examples/tasks/paginate`` and then sleeps past its budget ends
  ``agent_timeout`` with reward 1 from the real tests (per-test outcomes on the result), and with reward 0 when
  the task opts out (``score_on_timeout: false``); either way the result keeps its patch and harness logs;
* a ``command`` evaluator with ``needs_traces: true`` reads the session's traces from ``$POLAR_TRACES_FILE`` and
  writes per-trace (or per-call) rewards, which arrive on the result's traces; a count that does not fit ends
  ``infra_error`` naming the mismatch.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from polar.common.v1 import reconstruction_pb2, session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2 as pb

from integration_tests.support.evaluator import example_spec
from integration_tests.support.gateway_stack import gateway_stack, until_stage

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    pytest.mark.skipif(shutil.which("python3") is None, reason="the agent script needs python3 on PATH"),
]

# The agent: N chat calls through the proxy (a growing conversation), optionally the paginate fix, then a sleep.
AGENT = """
import json, os, sys, time, urllib.request
calls, fix, pause = int(sys.argv[1]), sys.argv[2] == "fix", float(sys.argv[3])
messages = []
for i in range(calls):
    messages.append({"role": "user", "content": f"step {i}"})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    messages.append(json.loads(urllib.request.urlopen(request, timeout=60).read())["choices"][0]["message"])
if fix:
    source = open("pagination.py").read()
    open("pagination.py", "w").write(source.replace("return total // per_page", "return -(-total // per_page)"))
print("agent: fixed and now thinking", flush=True)
print("agent: a note on stderr", file=sys.stderr, flush=True)
time.sleep(pause)
"""
# The command evaluator: reads the traces and writes reward.json with per-trace or per-call rewards.
SCORER = """
import json, os, sys
mode = sys.argv[1]
traces = json.load(open(os.environ["POLAR_TRACES_FILE"]))
out = {"reward": 1.0}
if mode == "per_trace":
    out["trace_rewards"] = [0.25 * (t["trace_index"] + 1) for t in traces]
elif mode == "per_call":
    out["call_rewards"] = {c: 0.5 for t in traces for c in t["call_ids"]}
else:
    out["trace_rewards"] = [1.0] * (len(traces) + 1)
json.dump(out, open(os.environ["POLAR_REWARD_FILE"], "w"))
"""


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Any]:
    async with gateway_stack(tmp_path) as running:
        yield running.stub


def _spec(
    session_id: str, *, argv: list[str], evaluator: task_pb2.EvaluatorSpec, timeout_s: float, repo: str = ""
) -> session_pb2.SessionSpec:
    task = task_pb2.Task(
        task_id="scoring",
        instruction="Fix page_count.",
        timeout_seconds=timeout_s,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=evaluator,
    )
    task.harness.options.update({"argv": argv})
    if repo:
        task.metadata.update({"repo": repo})
    return session_pb2.SessionSpec(session_id=session_id, task_id="scoring", task=task, attempt=1)


def _paginate_evaluator(**extra: Any) -> tuple[task_pb2.EvaluatorSpec, str]:
    spec, _ = example_spec("paginate")
    evaluator = task_pb2.EvaluatorSpec(strategy=spec.strategy)
    evaluator.options.update({**dict(spec.options), **extra})
    return evaluator, str(spec.options["repo"])


async def _done(stub: Any, spec: session_pb2.SessionSpec) -> session_pb2.SessionResult:
    await stub.StartSession(pb.StartSessionRequest(spec=spec))
    reply = await until_stage(stub, spec.session_id, status_pb2.SESSION_STAGE_DONE, limit_s=110)
    return reply.result  # type: ignore[no-any-return]


@pytest.mark.timeout(240)
async def test_a_timed_out_agent_with_the_fix_is_scored_and_its_work_kept(gateway: Any) -> None:
    evaluator, repo = _paginate_evaluator()
    argv = ["python3", "-c", AGENT, "1", "fix", "120"]
    result = await _done(gateway, _spec("late-fix", argv=argv, evaluator=evaluator, timeout_s=4, repo=repo))
    assert result.status == "agent_timeout", result.error_message
    assert result.terminal_status == status_pb2.TERMINAL_STATUS_AGENT_TIMEOUT
    assert result.reward == 1.0
    outcomes = {t.test_id: t.outcome for t in result.test_outcomes}
    assert outcomes["tests/test_pagination.py::test_partial_last_page"] == "passed"
    assert len(outcomes) == 6
    assert set(outcomes.values()) == {"passed"}
    assert result.eval_log_ref.endswith("eval.log")
    assert b"-    return total // per_page" in result.patch
    assert b"+    return -(-total // per_page)" in result.patch
    assert not result.patch_truncated
    assert "fixed and now thinking" in result.harness_stdout
    assert "a note on stderr" in result.harness_stderr
    assert all(t.reward == 1.0 and t.status == "agent_timeout" for t in result.traces)

    # The same work in a task that does not score timeouts: reward 0, but the work is still kept.
    evaluator, repo = _paginate_evaluator(score_on_timeout=False)
    result = await _done(gateway, _spec("late-fix-off", argv=argv, evaluator=evaluator, timeout_s=4, repo=repo))
    assert result.status == "agent_timeout"
    assert result.reward == 0.0
    assert list(result.test_outcomes) == []
    assert b"+    return -(-total // per_page)" in result.patch
    assert result.statistics.completions == 1


def _command_evaluator(mode: str) -> task_pb2.EvaluatorSpec:
    evaluator = task_pb2.EvaluatorSpec(strategy="command")
    evaluator.options.update({"command": ["python3", "-c", SCORER, mode], "needs_traces": True})
    return evaluator


@pytest.mark.timeout(240)
async def test_trace_rewards_from_a_command_evaluator_reach_the_traces(gateway: Any) -> None:
    argv = ["python3", "-c", AGENT, "3", "no", "0"]
    spec = _spec("per-trace", argv=argv, evaluator=_command_evaluator("per_trace"), timeout_s=60)
    spec.task.builder.strategy = reconstruction_pb2.RECONSTRUCTION_STRATEGY_PER_REQUEST  # one trace per call
    per_trace = await _done(gateway, spec)
    assert per_trace.status == "resolved", per_trace.error_message
    assert per_trace.reward == 1.0
    assert sorted(t.reward for t in per_trace.traces) == [0.25, 0.5, 0.75]
    assert [t.reward for t in per_trace.traces] == [0.25 * (t.trace_index + 1) for t in per_trace.traces]
    assert all(t.status == "resolved" for t in per_trace.traces)

    per_call = await _done(
        gateway, _spec("per-call", argv=argv, evaluator=_command_evaluator("per_call"), timeout_s=60)
    )
    assert per_call.status == "resolved", per_call.error_message
    assert sum(len(t.call_ids) for t in per_call.traces) == 3
    assert [t.reward for t in per_call.traces] == [0.5 * len(t.call_ids) for t in per_call.traces]

    wrong = await _done(gateway, _spec("wrong", argv=argv, evaluator=_command_evaluator("wrong"), timeout_s=60))
    assert wrong.status == "infra_error"
    assert f"{len(wrong.traces) + 1} trace rewards for {len(wrong.traces)} traces" in wrong.error_message
    assert wrong.reward == 0.0
    rows = [json_format.MessageToDict(t) for t in wrong.traces]
    assert all(r.get("reward", 0.0) == 0.0 for r in rows)
    assert json.dumps(rows)  # the traces are still reported, marked as not trainable
