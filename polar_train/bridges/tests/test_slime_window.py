"""The slime bridge's prefetch window over a fake rollout server: bound, warmth, order, discards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from polar.common.v1 import session_pb2, task_pb2

from polar_train.bridges.slime_window import GroupsUnusable
from polar_train.bridges.tests.slime_fakes import FakePolar, bridge, config, result
from polar_train.bridges.tests.slime_sample_standin import StandInDataSource, check_train_contract

PROMPTS = [f"prompt {i}" for i in range(100)]


async def _until(predicate: object, *, rounds: int = 1000) -> None:
    for _ in range(rounds):
        if callable(predicate) and predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def test_the_window_holds_batch_times_level_groups_and_stays_warm(tmp_path: Path) -> None:
    polar = FakePolar()
    cfg = config(tmp_path / "journal.jsonl", batch=2, samples=4, level=3)
    b = bridge(cfg, polar)
    source = StandInDataSource(PROMPTS, 4)
    handed: list[int] = []
    for rollout_id in range(4):
        groups = await b.rollout(rollout_id, source)
        check_train_contract(groups, rollout_batch_size=2, n_samples_per_prompt=4)
        handed += [g[0].metadata["group_id"] for g in groups]
        # Full again before returning: the next rollout's groups sample while slime trains.
        assert b.in_flight == cfg.window == 6
        assert len(polar.tasks) == len(handed) + 6
    assert len(handed) == len(set(handed)) == 8
    task = polar.tasks[f"{b.run_id}-g00000000"]
    assert task.num_samples == 4
    assert task.instruction == "prompt 0"
    assert task.max_policy_lag == 3
    assert task.stale_policy == task_pb2.STALE_POLICY_KEEP
    assert task.harness.name == "command"  # the template's
    assert set(polar.sampled.values()) == {1}
    assert b.counters.consumed_groups == 8
    assert b.counters.submitted_groups == 14
    await b.close()


async def test_groups_leave_in_the_order_they_finish(tmp_path: Path) -> None:
    polar = FakePolar(auto_finish=False)
    b = bridge(config(tmp_path / "journal.jsonl", batch=2, samples=2, level=2), polar)
    source = StandInDataSource(PROMPTS, 2)
    rollout = asyncio.create_task(b.rollout(0, source))
    await _until(lambda: len(polar.tasks) == 4)
    polar.finish(f"{b.run_id}-g00000003")
    await asyncio.sleep(0.01)
    assert not rollout.done()  # one finished group is not a rollout of two
    polar.finish(f"{b.run_id}-g00000001")
    groups = await asyncio.wait_for(rollout, 5)
    assert [g[0].metadata["group_id"] for g in groups] == [1, 3]
    assert [g[0].prompt for g in groups] == ["prompt 1", "prompt 3"]
    assert b.in_flight == 4  # groups 0 and 2 still sampling, 4 and 5 reserved after the hand-off
    await b.close()


async def test_a_group_without_a_usable_trace_is_discarded_and_replaced(tmp_path: Path) -> None:
    def outcome(task: task_pb2.Task, index: int) -> session_pb2.SessionResult:
        if task.instruction == "prompt 0":
            return result(task, index, status="infra_error", traces=[])
        return result(task, index)

    polar = FakePolar(outcome)
    cfg = config(tmp_path / "journal.jsonl", batch=2, samples=2, level=1)
    b = bridge(cfg, polar)
    groups = await b.rollout(0, StandInDataSource(PROMPTS, 2))
    assert [g[0].prompt for g in groups] == ["prompt 1", "prompt 2"]
    assert b.counters.discarded_groups == 1
    assert 0 in b._journal.state.discarded
    assert b.in_flight == 2
    await b.close()


async def test_group_after_group_without_a_trace_stops_the_run_with_the_reason(tmp_path: Path) -> None:
    def outcome(task: task_pb2.Task, index: int) -> session_pb2.SessionResult:
        broken = result(task, index, status="infra_error", traces=[])
        broken.error_message = "the harness exited with code 2 before its first model call"
        return broken

    polar = FakePolar(outcome)
    b = bridge(config(tmp_path / "journal.jsonl", batch=1, samples=2, level=1), polar)
    with pytest.raises(GroupsUnusable, match="exited with code 2"):
        await b.rollout(0, StandInDataSource(PROMPTS, 2))
    assert b.counters.discarded_groups == 3
    await b.close()


async def test_stamp_versions_moves_the_fleet_to_each_rollout_id_once(tmp_path: Path) -> None:
    """slime syncs weights into its own servers before each rollout; the bridge stamps that on the fleet."""
    polar = FakePolar()
    source = StandInDataSource(PROMPTS, 4)
    off = bridge(config(tmp_path / "off.jsonl"), polar)
    await off.rollout(0, source)
    await off.rollout(1, source)
    assert polar.stamps == []  # off by default: the trainer stamps versions itself
    await off.close()
    polar = FakePolar()
    b = bridge(config(tmp_path / "journal.jsonl", stamp_versions=True), polar)
    for rollout_id in range(3):
        groups = await b.rollout(rollout_id, source)
        check_train_contract(groups, rollout_batch_size=2, n_samples_per_prompt=4)
    assert polar.stamps == [1, 2]  # rollout 0 is the initial policy, version 0: nothing to stamp
    assert polar.version == 2
    await b.close()
