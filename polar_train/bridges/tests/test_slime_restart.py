"""The reservations journal and restarts: kill mid-window, restart from a checkpoint, no group sampled twice."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from polar_train.bridges.slime_journal import ReservationJournal, compact_samples
from polar_train.bridges.slime_settings import BridgeConfigError
from polar_train.bridges.slime_window import SampleCodec, SlimeBridge
from polar_train.bridges.tests.slime_fakes import FakePolar, bridge, config, template
from polar_train.bridges.tests.slime_sample_standin import Sample, StandInDataSource, check_train_contract

PROMPTS = [f"prompt {i}" for i in range(100)]


def _ids(groups: list[list[Any]]) -> list[int]:
    return [g[0].metadata["group_id"] for g in groups]


def _flat(groups: list[list[Any]]) -> list[dict[str, Any]]:
    return [s.to_dict() for g in groups for s in g]


async def test_kill_mid_window_and_restart_from_a_checkpoint_samples_no_group_twice(tmp_path: Path) -> None:
    polar = FakePolar(auto_finish=False)  # one rollout server across both processes
    cfg = config(tmp_path / "journal.jsonl", batch=2, samples=3, level=2)
    first = bridge(cfg, polar)
    source = StandInDataSource(PROMPTS, 3)
    handed: dict[int, list[list[Any]]] = {}

    async def rollout(b: Any, rollout_id: int, finish: list[int]) -> list[list[Any]]:
        task = asyncio.create_task(b.rollout(rollout_id, source))
        for _ in range(50):
            await asyncio.sleep(0)
        for number in finish:
            polar.finish(f"{b.run_id}-g{number:08d}")
        return await asyncio.wait_for(task, 5)

    handed[0] = await rollout(first, 0, [0, 1])
    checkpoint = source.save()  # slime saves the data source with its checkpoint after rollout 0
    handed[1] = await rollout(first, 1, [2, 3])
    handed[2] = await rollout(first, 2, [5, 4, 6])  # 6 finishes too but stays in the window
    assert [_ids(handed[r]) for r in range(3)] == [[0, 1], [2, 3], [4, 5]]
    open_before = sorted(first._window)
    assert open_before == [6, 7, 8, 9]
    # The process is killed: nothing more is written (close() only cancels the watchers).
    await first.close()

    # slime restarts from the checkpoint of rollout 0: its data source rolls back, rollouts 1.. run again.
    source.load(checkpoint)
    second = bridge(cfg, polar)
    assert second.run_id == first.run_id
    again = {r: await rollout(second, r, []) for r in (1, 2)}
    for r in (1, 2):  # the same groups, read back from the rollout server, filled identically
        assert _ids(again[r]) == _ids(handed[r])
        assert _flat(again[r]) == _flat(handed[r])
    assert second.counters.replayed_groups == 4
    assert second.counters.reattached_groups == 4  # groups 6-9, followed again
    after = await rollout(second, 3, [7, 8, 9])
    assert _ids(after) == [6, 7]
    # The rolled-back data source hands out data groups 6-9 again; they are skipped, not sampled again.
    assert second.counters.skipped_reservations == 4
    assert second.counters.submitted_groups == 2
    assert second.in_flight == 4
    check_train_contract(after, rollout_batch_size=2, n_samples_per_prompt=3)

    assert set(polar.sampled.values()) == {1}  # no prompt group sampled twice
    consumed = [i for r in (0, 1, 2) for i in _ids(handed[r])] + _ids(after)
    assert consumed == list(range(8))  # and none lost: every reserved group is handed over, in order
    assert [g[0].prompt for g in after] == ["prompt 6", "prompt 7"]
    assert polar.submissions > len(polar.tasks)  # followed-again groups were submitted again, idempotently
    await second.close()


async def test_a_reservation_whose_submission_was_lost_is_submitted_after_a_restart(tmp_path: Path) -> None:
    cfg = config(tmp_path / "journal.jsonl", batch=1, samples=2, level=1)
    sample = StandInDataSource(["lost prompt"], 2).get_samples(1)[0]
    journal = ReservationJournal(cfg.journal)
    journal.append({"kind": "run", "run_id": "crashed"})
    journal.append(
        {
            "kind": "reserve",
            "group": 0,
            "task_id": "crashed-g00000000",
            "data_group_index": 0,
            "instruction": "lost prompt",
            "samples": [s.to_dict() for s in sample],
            "rollout_id": 0,
        }
    )
    journal.close()  # the process died before SubmitTask
    polar = FakePolar()
    b = bridge(cfg, polar)
    groups = await b.rollout(0, StandInDataSource(["lost prompt", "next"], 2))
    assert [g[0].prompt for g in groups] == ["lost prompt"]
    assert polar.sampled == {"lost prompt": 1, "next": 1}
    await b.close()


def test_the_journal_is_append_only_and_survives_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = ReservationJournal(path)
    journal.append({"kind": "run", "run_id": "r"})
    journal.append({"kind": "consume", "rollout_id": 0, "groups": [0, 1]})
    journal.close()
    with path.open("a") as fh:
        fh.write('{"kind":"consume","rollout_id":1,"gro')  # the crash came mid-write
    reopened = ReservationJournal(path)
    assert reopened.state.rollouts == {0: [0, 1]}
    reopened.append({"kind": "discard", "group": 2})
    reopened.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["run", "consume", "discard"]


def test_a_malformed_record_before_the_end_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('{"kind":"run","run_id":"r"}\nnot json\n{"kind":"discard","group":1}\n')
    with pytest.raises(BridgeConfigError, match=r"journal\.jsonl:2"):
        ReservationJournal(path)


def test_a_record_that_is_not_json_is_refused_before_it_is_written(tmp_path: Path) -> None:
    journal = ReservationJournal(tmp_path / "journal.jsonl")
    with pytest.raises(BridgeConfigError, match="cannot journal"):
        journal.append({"kind": "reserve", "samples": [{"image": object()}]})
    journal.close()
    assert (tmp_path / "journal.jsonl").read_text() == ""


async def test_a_journal_of_another_run_is_refused(tmp_path: Path) -> None:
    first = bridge(config(tmp_path / "journal.jsonl", run_id="run-a"), FakePolar())
    assert first.run_id == "run-a"
    await first.close()
    journal = ReservationJournal(tmp_path / "journal.jsonl")
    with pytest.raises(BridgeConfigError, match="a new run wants a new journal"):
        SlimeBridge(config(journal.path, run_id="run-b"), FakePolar(), template(), SampleCodec(Sample), journal)
    journal.close()
    again = bridge(config(tmp_path / "journal.jsonl"), FakePolar())  # no run id given: the journal's
    assert again.run_id == "run-a"
    await again.close()


def test_a_groups_prompt_is_journaled_once_unless_its_copies_differ() -> None:
    copies = [Sample(prompt="p", index=i, group_index=3).to_dict() for i in range(16)]
    compact = compact_samples(copies)
    assert set(compact) == {"prompt", "indices"}
    assert compact["indices"] == list(range(16))
    copies[5]["metadata"] = {"seed": 5}
    assert compact_samples(copies) == {"samples": copies}


async def test_the_journal_holds_each_prompt_once_and_restores_every_copy(tmp_path: Path) -> None:
    cfg = config(tmp_path / "journal.jsonl", batch=1, samples=4, level=1)
    b = bridge(cfg, FakePolar())
    await b.rollout(0, StandInDataSource(PROMPTS, 4))
    await b.close()
    reserve = json.loads(cfg.journal.read_text().splitlines()[1])
    assert reserve["kind"] == "reserve"
    assert reserve["indices"] == [0, 1, 2, 3]
    assert "samples" not in reserve
    restored = ReservationJournal(cfg.journal)
    assert [s["index"] for s in restored.state.reserved[0].samples] == [0, 1, 2, 3]
    restored.close()
