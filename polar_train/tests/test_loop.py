"""The loop against an in-memory rollout server: when groups are submitted, what is trained, what is dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from polar.common.v1 import session_pb2, trace_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb

from polar_core.model_fixtures import build_tiny_model, build_tiny_tokenizer
from polar_train.config import TrainConfig
from polar_train.loop import Trainer
from polar_train.metrics import read_metrics
from polar_train.tasks import load_template

TASK = Path(__file__).resolve().parents[2] / "examples" / "train" / "lowercase" / "task.yaml"


class FakeFleet:
    """A rollout server and its one proxy: sessions sample under the version current when they are watched."""

    def __init__(self, stale_every: int = 0) -> None:
        self.version = 0
        self.events: list[str] = []
        self.cancelled: list[str] = []
        self._stale_every = stale_every
        self._count = 0

    async def submit(self, task: Any, *, task_timeout_s: float | None = None) -> pb.SubmitTaskResponse:
        self.events.append(f"submit {task.task_id} @v{self.version}")
        return pb.SubmitTaskResponse(task_id=task.task_id, already_existed=False)

    async def watch(self, task_id: str) -> AsyncIterator[session_pb2.SessionResult]:
        await asyncio.sleep(0)
        for i in range(4):
            self._count += 1
            reported = 5 if self._stale_every and self._count % self._stale_every == 0 else 0
            trace = trace_pb2.Trace(
                session_id=f"{task_id}-{i}",
                task_id=task_id,
                prompt_token_ids=[10, 11, 12],
                response_token_ids=[20 + i, 30],
                loss_mask=[1, 1],
                response_logprobs=[-4.0, -4.0],
                weight=1.0,
                policy_versions=[str(self.version)],
                policy_lag=reported,
            )
            result = session_pb2.SessionResult(
                task_id=task_id, session_id=f"{task_id}-{i}", status="unresolved", reward=i / 4
            )
            result.traces.append(trace)
            yield result

    async def cancel(self, task_id: str, reason: str = "") -> pb.TaskInfo:
        self.cancelled.append(task_id)
        return pb.TaskInfo()

    async def current_version(self) -> int:
        return self.version

    async def update(self, version: int, weights_path: Path) -> None:
        assert (weights_path / "config.json").is_file()
        self.events.append(f"update v{version}")
        self.version = version


def _trainer(tmp_path: Path, fleet: FakeFleet, **overrides: Any) -> Trainer:
    tokenizer = build_tiny_tokenizer()
    config = TrainConfig(
        model="tiny", task=TASK, run_dir=tmp_path / "run", group_size=4, groups_per_step=1, steps=3, **overrides
    )
    template = load_template(TASK, max_policy_lag=config.max_policy_lag, stale_policy=config.stale_policy)
    return Trainer(
        config,
        client=fleet,  # type: ignore[arg-type]
        updater=fleet,
        template=template,
        model=build_tiny_model(tokenizer, seed=0),
        tokenizer=tokenizer,
    )


async def test_before_step_submits_the_next_group_before_training_and_trains_it_one_version_behind(
    tmp_path: Path,
) -> None:
    fleet = FakeFleet()
    trainer = _trainer(tmp_path, fleet, submit_next="before_step")
    rows = await trainer.run()
    prefix = trainer.task_id(0, 0).removesuffix("s000-g0")
    names = [e.split(" @")[0].replace(prefix, "") for e in fleet.events]
    assert names == [
        "submit s000-g0",
        "submit s001-g0",
        "update v1",
        "submit s002-g0",
        "update v2",
        "update v3",
    ]
    # Step 1 was sampled under v0 and trained at v1 (lag 1, within the bound); nothing was dropped.
    assert [r.sampled_versions for r in rows] == [[0], [0], [1]]
    assert [r.max_trained_lag for r in rows] == [0, 1, 1]
    assert all(r.stale_traces == 0 and r.trainable_tokens == 8 for r in rows)
    assert [r["step"] for r in read_metrics(trainer.metrics_path)] == [0, 1, 2]
    assert (tmp_path / "run" / "checkpoints" / "v3" / "config.json").is_file()
    assert (tmp_path / "run" / "checkpoints" / "v3").stat().st_mode & 0o777 == 0o755


async def test_after_update_is_synchronous(tmp_path: Path) -> None:
    fleet = FakeFleet()
    trainer = _trainer(tmp_path, fleet, submit_next="after_update", max_policy_lag=0)
    rows = await trainer.run()
    assert [e.split(" ")[0] for e in fleet.events] == ["submit", "update", "submit", "update", "submit", "update"]
    assert [r.max_trained_lag for r in rows] == [0, 0, 0]
    assert [r.sampled_versions for r in rows] == [[0], [1], [2]]


async def test_before_update_submits_between_the_step_and_the_update(tmp_path: Path) -> None:
    fleet = FakeFleet()
    trainer = _trainer(tmp_path, fleet, submit_next="before_update")
    await trainer.run()
    assert [e.split(" ")[0] for e in fleet.events] == ["submit", "submit", "update", "submit", "update", "update"]


async def test_stale_sessions_are_dropped_counted_and_never_trained(tmp_path: Path) -> None:
    fleet = FakeFleet(stale_every=2)  # every second session: the server reports a lag of 5
    trainer = _trainer(tmp_path, fleet, submit_next="after_update", max_policy_lag=0)
    rows = await trainer.run()
    assert [r.stale_traces for r in rows] == [2, 2, 2]
    assert [r.stale_tokens for r in rows] == [4, 4, 4]
    assert [r.trainable_tokens for r in rows] == [4, 4, 4]
    assert all(r.sessions == {"unresolved": 4} for r in rows)  # they still count as sessions


async def test_a_time_budget_stops_after_the_step_and_cancels_what_was_submitted_ahead(tmp_path: Path) -> None:
    fleet = FakeFleet()
    trainer = _trainer(tmp_path, fleet, submit_next="before_step", max_seconds=1e-9)
    rows = await trainer.run()
    assert len(rows) == 1
    assert fleet.events[-1] == "update v1"
