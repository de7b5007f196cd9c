"""SubmitTask refuses, before anything is recorded, a task that widens the operator's policy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from polar.common.v1 import task_pb2

from polar_core.errors import InvalidArgument
from rollout_server.convert import new_task_from_proto
from rollout_server.core import RolloutCore
from rollout_server.settings import RolloutSettings
from rollout_server.store.sql import SqlStore
from rollout_server.store.sqlite import open_sqlite_store
from rollout_server.task_check import TaskCheck
from rollout_server.testing.fakes import FakeGatewayClient


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqlStore]:
    opened = await open_sqlite_store(tmp_path / "rollout.sqlite3")
    yield opened
    await opened.close()


def _task(task_id: str, *, runtime: dict[str, Any] | None = None, repo: str = "", **kw: Any) -> task_pb2.Task:
    task = task_pb2.Task(task_id=task_id, instruction="do it", num_samples=1, **kw)
    task.harness.name = "command"
    if runtime:
        task.runtime.options.update(runtime)
    if repo:
        task.metadata.update({"repo": repo})
    return task


@pytest.mark.parametrize(
    ("runtime", "field"),
    [
        ({"network": "host"}, "network"),
        ({"isolation": "none"}, "isolation"),
        ({"docker_host": "tcp://10.0.0.1:2375"}, "docker_host"),
        ({"env": {"LD_PRELOAD": "/x.so"}}, "env.LD_PRELOAD"),
        ({"pids_limit": 100000}, "pids_limit"),
    ],
)
async def test_a_widening_task_is_refused_and_nothing_is_stored(
    tmp_path: Path, store: SqlStore, runtime: dict[str, Any], field: str
) -> None:
    check = TaskCheck.from_settings(RolloutSettings(task_roots=[str(tmp_path)]))
    core = RolloutCore(store, FakeGatewayClient(), task_check=check)
    with pytest.raises(InvalidArgument) as info:
        await core.submit_task(new_task_from_proto(_task("wide", runtime=runtime)))
    assert info.value.details["field"] == field
    assert await store.get_task("wide") is None
    assert await store.active_tasks() == []


async def test_repository_paths_outside_the_roots_are_refused_also_through_a_symlink(
    tmp_path: Path, store: SqlStore
) -> None:
    roots, outside = tmp_path / "tasks", tmp_path / "secret"
    (roots / "repo").mkdir(parents=True)
    outside.mkdir()
    (roots / "link").symlink_to(outside)
    core = RolloutCore(
        store, FakeGatewayClient(), task_check=TaskCheck.from_settings(RolloutSettings(task_roots=[str(roots)]))
    )
    for i, repo in enumerate((outside, roots / "link")):
        with pytest.raises(InvalidArgument, match="not under the operator's task roots"):
            await core.submit_task(new_task_from_proto(_task(f"t{i}", repo=str(repo))))
    assert await store.active_tasks() == []
    summary, existed = await core.submit_task(
        new_task_from_proto(_task("ok", runtime={"network": "none", "memory_limit": "1g"}, repo=str(roots / "repo")))
    )
    assert not existed
    assert summary.task.task_id == "ok"
