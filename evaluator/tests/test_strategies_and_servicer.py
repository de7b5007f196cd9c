from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from google.protobuf import json_format
from polar.common.v1 import status_pb2, task_pb2
from polar.evaluator.v1 import evaluator_service_pb2 as pb

from evaluator import (
    AgentStatus,
    Artifacts,
    EvaluationResult,
    EvaluatorService,
    EvaluatorSettings,
    EvaluatorSpec,
    HandleNotFound,
    InvalidOptions,
    PrepareParams,
    TestOutcome,
    TestStatus,
    UnknownStrategy,
    evaluator_config,
)
from evaluator.convert import artifacts_from_proto, evaluator_spec_from_proto, result_to_proto
from evaluator.servicer import EvaluatorServicer
from evaluator.strategies import build_strategy
from polar_client import load_task
from polar_core.records import TerminalStatus

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def test_unknown_strategy_and_bad_options() -> None:
    with pytest.raises(UnknownStrategy):
        build_strategy(EvaluatorSpec("nope"))
    with pytest.raises(UnknownStrategy):
        build_strategy(EvaluatorSpec("no_such_module_xyz:f"))
    with pytest.raises(InvalidOptions):
        build_strategy(EvaluatorSpec("swe", {}))
    with pytest.raises(InvalidOptions):
        build_strategy(EvaluatorSpec("command", {"command": 3}))


def test_example_task_files_resolve_their_repository() -> None:
    tasks = sorted(EXAMPLES.glob("*/task.yaml"))
    assert len(tasks) >= 5
    for path in tasks:
        task = load_task(path)  # the one task-file reader; the evaluator gets its EvaluatorSpec
        spec = evaluator_spec_from_proto(task.evaluator)
        assert spec.strategy == "swe"
        assert Path(spec.options["repo"]).is_dir()
        assert spec.options["fail_to_pass"]
        assert spec.options["pass_to_pass"]
        assert (path.parent / "fix.patch").is_file()
        assert task.runtime.kind == task_pb2.RUNTIME_KIND_LOCAL


@pytest.fixture
def service(tmp_path: Path) -> EvaluatorService:
    return EvaluatorService(evaluator_config(EvaluatorSettings(state_dir=tmp_path)))


@pytest.mark.parametrize(
    ("agent_status", "reward", "status"),
    [
        (AgentStatus.COMPLETED, 1.0, TerminalStatus.RESOLVED),
        (AgentStatus.ERROR, 0.0, TerminalStatus.UNRESOLVED),
        (AgentStatus.TIMEOUT, 0.0, TerminalStatus.AGENT_TIMEOUT),
        (AgentStatus.CANCELLED, 0.0, TerminalStatus.CANCELLED),
    ],
)
async def test_session_completed(service, agent_status, reward, status) -> None:
    handle = await service.prepare(PrepareParams(spec=EvaluatorSpec("session_completed")))
    result = await service.evaluate(handle, Artifacts(agent_status=agent_status))
    assert (result.reward, result.status) == (reward, status)
    assert Path(result.log_ref).name == "eval.log"


async def test_custom_evaluator_per_trace_rewards_and_crash(service, tmp_path, monkeypatch) -> None:
    (tmp_path / "my_custom_eval.py").write_text(
        textwrap.dedent(
            """
            from evaluator import CustomResult

            async def score(request):
                return CustomResult(reward=0.5, trace_rewards=(0.0, 1.0))

            def crash(request):
                raise RuntimeError("evaluator bug")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    handle = await service.prepare(PrepareParams(spec=EvaluatorSpec("my_custom_eval:score")))
    result = await service.evaluate(handle, Artifacts())
    assert (result.reward, result.status, result.trace_rewards) == (0.5, TerminalStatus.UNRESOLVED, (0.0, 1.0))
    handle = await service.prepare(PrepareParams(spec=EvaluatorSpec("custom", {"callable": "my_custom_eval:crash"})))
    result = await service.evaluate(handle, Artifacts())
    assert result.status is TerminalStatus.INFRA_ERROR
    assert "evaluator bug" in result.error_message


async def test_prepare_idempotent_and_unknown_handle(service) -> None:
    params = PrepareParams(spec=EvaluatorSpec("session_completed"), request_id="r1")
    assert await service.prepare(params) == await service.prepare(params)
    with pytest.raises(HandleNotFound):
        await service.evaluate("ev-unknown", Artifacts())
    assert await service.release("ev-unknown") is False


async def test_servicer_round_trip(service) -> None:
    servicer = EvaluatorServicer(service)
    options = json_format.ParseDict({"x": 1}, task_pb2.EvaluatorSpec().options)
    prepared = await servicer.Prepare(
        pb.PrepareRequest(
            evaluator=task_pb2.EvaluatorSpec(strategy="session_completed", options=options), request_id="a"
        ),
        None,  # type: ignore[arg-type]
    )
    request = pb.EvaluateRequest(
        handle=prepared.handle,
        artifacts=pb.EvaluationArtifacts(patch_text="", agent_status=pb.AGENT_STATUS_TIMEOUT),
    )
    response = await servicer.Evaluate(request, None)  # type: ignore[arg-type]
    assert response.terminal_status == status_pb2.TERMINAL_STATUS_AGENT_TIMEOUT
    assert response.log_ref
    assert (await servicer.Release(pb.ReleaseRequest(handle=prepared.handle), None)).released  # type: ignore[arg-type]


def test_proto_conversions() -> None:
    artifacts = artifacts_from_proto(
        pb.EvaluationArtifacts(
            patch_bytes=b"\xff",
            files=[pb.ArtifactFile(path="a.txt", content=b"hi")],
            agent_status=pb.AGENT_STATUS_ERROR,
        )
    )
    assert artifacts.patch == b"\xff"
    assert artifacts.files == {"a.txt": b"hi"}
    assert artifacts.agent_status is AgentStatus.ERROR
    response = result_to_proto(
        EvaluationResult(
            1.0,
            TerminalStatus.RESOLVED,
            test_outcomes=(TestOutcome("t::a", TestStatus.MISSING, 0.5),),
            log_ref="/x",
            duration_s=2.0,
        )
    )
    assert response.terminal_status == status_pb2.TERMINAL_STATUS_RESOLVED
    assert response.test_outcomes[0].outcome == pb.TEST_OUTCOME_STATUS_MISSING
    assert response.duration.seconds == 2


async def test_a_command_that_fills_the_disk_quota_is_unresolved_and_the_service_goes_on(tmp_path: Path) -> None:
    # What runs in the evaluator's runtime is the patched tree's code: over the quota is the patch's failure.
    settings = EvaluatorSettings(state_dir=tmp_path / "state", disk_limit="32m", min_isolation="none")
    svc = EvaluatorService(evaluator_config(settings))
    fill = "for i in $(seq 1 32); do head -c 8388608 /dev/zero > fill$i.bin; done; sleep 60"
    try:
        handle = await svc.prepare(PrepareParams(spec=EvaluatorSpec("command", {"command": fill})))
        result = await svc.evaluate(handle, Artifacts())
        assert result.status is TerminalStatus.UNRESOLVED, result.error_message
        assert result.reward == 0.0
        assert "disk quota" in result.error_message
        assert "quota 32 MiB" in result.error_message
        ok = 'echo \'{"reward": 1.0}\' > "$POLAR_REWARD_FILE"'
        handle = await svc.prepare(PrepareParams(spec=EvaluatorSpec("command", {"command": ok})))
        assert (await svc.evaluate(handle, Artifacts())).status is TerminalStatus.RESOLVED
    finally:
        await svc.close()
