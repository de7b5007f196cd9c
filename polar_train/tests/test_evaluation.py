"""The trainer's evaluation lane: configuration errors, rounds beside training, never in a batch."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from polar.common.v1 import session_pb2, task_pb2, trace_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb

from polar_core.errors import InvalidArgument
from polar_core.model_fixtures import build_tiny_model, build_tiny_tokenizer
from polar_train.batch import SessionSample
from polar_train.config import TrainConfig, load_config
from polar_train.evaluation import build_eval_lane, eval_tasks
from polar_train.loop import Trainer
from polar_train.tasks import load_template

TASK = Path(__file__).resolve().parents[2] / "examples" / "train" / "lowercase" / "task.yaml"
HELD_OUT = ({"instruction": "Name a colour in lowercase letters only.", "samples": 2, "name": "colour"},)


def _config(tmp_path: Path, **overrides: Any) -> Path:
    data = {"model": "tiny", "task": str(TASK), "run_dir": str(tmp_path / "run"), **overrides}
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"eval_every": 1, "eval_tasks": [{"instruction": "x"}]}, r"eval_tasks\[0\] needs samples"),
        ({"eval_every": 1, "eval_tasks": [{"instruction": "x", "samples": 0}]}, r"eval_tasks\[0\] needs samples"),
        ({"eval_every": 1, "eval_tasks": [{"samples": 2}]}, r"needs a task file or an instruction"),
        ({"eval_every": 1, "eval_tasks": [{"task": "nope.yaml", "samples": 2}]}, r"nope.yaml does not exist"),
        ({"eval_every": 2}, r"eval_every needs eval_tasks"),
        ({"eval_tasks": [{"instruction": "x", "samples": 1}]}, r"never run without eval_every"),
        (
            {
                "eval_every": 1,
                "eval_tasks": [{"instruction": "x", "samples": 1}, {"instruction": "y", "samples": 1, "name": "t0"}],
            },
            r"names must be distinct: t0",
        ),
        ({"eval_every": 1, "eval_tasks": [{"instruction": "x", "samples": 1, "seeds": 3}]}, r"seeds"),
    ],
)
def test_a_bad_evaluation_lane_is_refused_when_the_config_is_read(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        load_config(_config(tmp_path, **overrides))


def test_eval_tasks_are_the_template_with_held_out_instructions_and_no_staleness_bound(tmp_path: Path) -> None:
    other = tmp_path / "other" / "task.yaml"
    other.parent.mkdir()
    other.write_text(TASK.read_text(encoding="utf-8").replace("{task_dir}", str(TASK.parent)), encoding="utf-8")
    config = load_config(
        _config(
            tmp_path,
            max_policy_lag=1,
            eval_every=1,
            eval_tasks=[*HELD_OUT, {"task": "other/task.yaml", "samples": 3}],
        )
    )
    template = load_template(TASK, max_policy_lag=1, stale_policy="keep")
    tasks = eval_tasks(config, template)
    assert [(t.task.task_id, t.samples, t.task.num_samples) for t in tasks] == [("colour", 2, 2), ("t1", 3, 3)]
    assert tasks[0].task.instruction == HELD_OUT[0]["instruction"]
    assert all(not t.task.HasField("max_policy_lag") for t in tasks)
    assert all(t.task.stale_policy == task_pb2.STALE_POLICY_KEEP for t in tasks)


class FleetWithEval:
    """Training groups finish at once under the fleet's current version; eval rounds finish only when released."""

    def __init__(self) -> None:
        self.version = 0
        self.events: list[str] = []
        self.release = asyncio.Event()

    async def submit(self, task: Any, *, task_timeout_s: float | None = None) -> pb.SubmitTaskResponse:
        self.events.append(f"submit {task.task_id.split('-', 2)[-1]} @v{self.version}")
        return pb.SubmitTaskResponse(task_id=task.task_id)

    async def watch(self, task_id: str) -> AsyncIterator[session_pb2.SessionResult]:
        if "-eval-" in task_id:
            await self.release.wait()  # an eval round outlives the training steps after it
        sampled = str(self.version)  # the version the fleet serves when the sessions reach the model
        for i in range(2):
            trace = trace_pb2.Trace(
                session_id=f"{task_id}-{i}",
                task_id=task_id,
                prompt_token_ids=[10, 11],
                response_token_ids=[20 + i, 30],
                loss_mask=[1, 1],
                response_logprobs=[-4.0, -4.0],
                weight=1.0,
                policy_versions=[sampled],
            )
            result = session_pb2.SessionResult(
                task_id=task_id, session_id=f"{task_id}-{i}", status="resolved", reward=1.0
            )
            result.statistics.completions = 1
            result.traces.append(trace)
            yield result

    async def cancel(self, task_id: str, reason: str = "") -> pb.TaskInfo:
        return pb.TaskInfo()

    async def current_version(self) -> int:
        return self.version

    async def update(self, version: int, weights_path: Path) -> None:
        self.events.append(f"update v{version}")
        self.version = version
        if version == 3:
            self.release.set()  # the rounds end only after the last update: training never waited for them


async def test_rounds_run_beside_training_and_never_reach_a_batch(tmp_path: Path) -> None:
    fleet = FleetWithEval()
    config = TrainConfig(
        model="tiny",
        task=TASK,
        run_dir=tmp_path / "run",
        group_size=2,
        groups_per_step=1,
        steps=3,
        submit_next="after_update",
        max_policy_lag=0,
        eval_every=2,
        eval_tasks=HELD_OUT,  # type: ignore[arg-type]
    )
    template = load_template(TASK, max_policy_lag=0, stale_policy="keep")
    tokenizer = build_tiny_tokenizer()
    trained: list[SessionSample] = []
    trainer = Trainer(
        config,
        client=fleet,  # type: ignore[arg-type]
        updater=fleet,
        template=template,
        model=build_tiny_model(tokenizer, seed=0),
        tokenizer=tokenizer,
        on_sessions=lambda _step, sessions: trained.extend(sessions),
        evaluation=build_eval_lane(config, fleet, eval_tasks(config, template)),
    )
    rows = await trainer.run()

    assert len(rows) == 3
    assert not any("-eval-" in s.task_id for s in trained)  # eval sessions never count toward a batch
    submits = [e for e in fleet.events if "eval" in e]
    # Round 0 at the starting version (after step 0's group), round 1 right after the second update (v2).
    assert submits == ["submit eval-v0-r000-colour @v0", "submit eval-v2-r001-colour @v2"]
    assert fleet.events.index("submit eval-v2-r001-colour @v2") == fleet.events.index("update v2") + 2
    reports = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    # Both rounds were sampled after the fleet reached v3 (they were held back): neither counts a session.
    assert [(r["round"], r["policy_version"], r["step"]) for r in reports] == [(0, 0, None), (1, 2, 1)]
    assert [(r["sessions"], r["mismatched_sessions"], r["complete"]) for r in reports] == [(0, 2, False)] * 2
    assert reports[0]["mismatched"][0]["policy_versions"] == ["3"]
