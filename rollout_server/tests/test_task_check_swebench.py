"""SubmitTask refuses a ``swebench`` task whose instance the evaluator could not grade; nothing is recorded."""

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

_INSTANCE = {
    "instance_id": "octo__lib-7", "repo": "octo/lib", "version": "1.0", "base_commit": "0" * 40, "test_patch": "",
    "FAIL_TO_PASS": ["tests/test_a.py::test_new"], "PASS_TO_PASS": [], "log_parser": "parse_log_pytest",
    "eval_type": "pass_and_fail", "eval_script": ": '>>>>> Start Test Output'\npytest\n: '>>>>> End Test Output'\n",
}  # fmt: skip


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqlStore]:
    opened = await open_sqlite_store(tmp_path / "rollout.sqlite3")
    yield opened
    await opened.close()


def _task(task_id: str, instance: dict[str, Any]) -> task_pb2.Task:
    task = task_pb2.Task(task_id=task_id, instruction="fix it", num_samples=1)
    task.harness.name = "command"
    task.evaluator.strategy = "swebench"
    task.evaluator.options.update({"instance": instance})
    return task


@pytest.mark.parametrize(
    ("change", "field"),
    [({"log_parser": "parse_log_nonesuch"}, "log_parser"), ({"eval_script": None}, "eval_script"),
     ({"eval_type": "sometimes"}, "eval_type"), ({"FAIL_TO_PASS": "x"}, "FAIL_TO_PASS")],
)  # fmt: skip
async def test_an_ungradable_instance_is_refused(
    tmp_path: Path, store: SqlStore, change: dict[str, Any], field: str
) -> None:
    core = RolloutCore(
        store, FakeGatewayClient(), task_check=TaskCheck.from_settings(RolloutSettings(task_roots=[str(tmp_path)]))
    )
    instance = {k: v for k, v in {**_INSTANCE, **change}.items() if v is not None}
    with pytest.raises(InvalidArgument) as info:
        await core.submit_task(new_task_from_proto(_task("bad", instance)))
    assert info.value.details["field"] == field
    assert await store.get_task("bad") is None
    _, existed = await core.submit_task(new_task_from_proto(_task("good", _INSTANCE)))
    assert not existed
    assert await store.get_task("good") is not None


async def test_a_records_host_repository_outside_the_roots_is_refused(tmp_path: Path, store: SqlStore) -> None:
    from polar_client import task_from_mapping
    from polar_client.formats.swebench import record_to_mapping

    roots = tmp_path / "tasks"
    roots.mkdir()
    record = {**_INSTANCE, "patch": "", "problem_statement": "fix it", "polar": {"repo_dir": "../../etc"}}
    mapping = record_to_mapping(record, base_dir=roots)
    check = TaskCheck.from_settings(RolloutSettings(task_roots=[str(roots)]))
    core = RolloutCore(store, FakeGatewayClient(), task_check=check)
    with pytest.raises(InvalidArgument, match="not under the operator's task roots"):
        await core.submit_task(new_task_from_proto(task_from_mapping(mapping)))
    assert await store.active_tasks() == []
