"""The slime bridge's reservations journal: an append-only JSON-lines file, each line fsynced before it is acted on.

A restarted slime run rolls its data source and its weights back to the last checkpoint, but the groups the
bridge had reserved since then were already submitted to Polar and (some of them) sampled. The journal is what
lets a restarted bridge use them instead of sampling them again:

``run``
    The first line: the run id every task id starts with (``<run_id>-g<group>``).
``reserve``
    A group taken from slime's data source, written *before* its task is submitted: the group number, the
    task id, the data source's ``group_index``, the instruction and the prompt samples (``Sample.to_dict()``;
    stored once with each copy's ``index`` when the copies differ in nothing else, as slime's data source makes
    them, so a group of 16 does not store its prompt 16 times).
``consume``
    The groups a rollout handed to slime, written *before* they are returned: ``rollout_id`` and group numbers.
``discard``
    A group that finished without a single usable trace and was replaced (never handed to slime).

After a restart at rollout ``s``: rollouts ``>= s`` that the journal records are replayed with exactly their
groups (their results are read back from the rollout server, not sampled again); reserved groups that no rollout
consumed and that were not discarded are followed again (their tasks are submitted again, which the rollout
server answers ``already_existed``); a group the data source hands out again (it was rolled back) is skipped by
its ``group_index``. A crash can leave a torn last line; it is ignored. Any other malformed line is an error.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import IO, Any

from polar_train.bridges.slime_settings import BridgeConfigError

__all__ = ["JournalState", "Reservation", "ReservationJournal", "compact_samples"]


@dataclasses.dataclass(frozen=True, slots=True)
class Reservation:
    """One reserved group as the journal holds it.

    Attributes:
        group: The bridge's group number (increasing over the run).
        task_id: Its Polar task.
        data_group_index: The data source's ``group_index`` of its samples (``None`` when the source sets none).
        instruction: The task's instruction.
        samples: The prompt samples as ``Sample.to_dict()`` gave them.
        rollout_id: The rollout during which it was reserved.
    """

    group: int
    task_id: str
    data_group_index: int | None
    instruction: str
    samples: list[dict[str, Any]]
    rollout_id: int


@dataclasses.dataclass(slots=True)
class JournalState:
    """What a journal holds, folded.

    Attributes:
        run_id: The run's id (empty for a new journal).
        reserved: Every reservation, by group.
        consumed: The rollout that consumed each consumed group.
        rollouts: Each recorded rollout's groups, in the order handed to slime.
        discarded: Groups discarded without being handed to slime.
    """

    run_id: str = ""
    reserved: dict[int, Reservation] = dataclasses.field(default_factory=dict)
    consumed: dict[int, int] = dataclasses.field(default_factory=dict)
    rollouts: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    discarded: set[int] = dataclasses.field(default_factory=set)

    @property
    def next_group(self) -> int:
        """The number the next reservation gets."""
        return max(self.reserved, default=-1) + 1

    @property
    def data_group_indices(self) -> set[int]:
        """The data source's group indices already reserved."""
        return {r.data_group_index for r in self.reserved.values() if r.data_group_index is not None}

    def open_groups(self) -> list[int]:
        """Reserved groups neither consumed nor discarded, in reservation order."""
        return sorted(g for g in self.reserved if g not in self.consumed and g not in self.discarded)

    def apply(self, record: dict[str, Any]) -> None:
        """Fold one record in."""
        kind = record["kind"]
        if kind == "run":
            self.run_id = str(record["run_id"])
        elif kind == "reserve":
            group = int(record["group"])
            self.reserved[group] = Reservation(
                group=group,
                task_id=str(record["task_id"]),
                data_group_index=record.get("data_group_index"),
                instruction=str(record["instruction"]),
                samples=_samples(record),
                rollout_id=int(record["rollout_id"]),
            )
        elif kind == "consume":
            rollout = int(record["rollout_id"])
            groups = [int(g) for g in record["groups"]]
            self.rollouts[rollout] = groups
            for group in groups:
                self.consumed[group] = rollout
        elif kind == "discard":
            self.discarded.add(int(record["group"]))
        else:
            raise ValueError(f"unknown record kind {kind!r}")


def _samples(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A reserve record's prompt samples: listed, or one prompt and each copy's ``index``."""
    if "samples" in record:
        return list(record["samples"])
    prompt = dict(record["prompt"])
    return [{**prompt, "index": index} for index in record["indices"]]


def compact_samples(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields of a reserve record that hold ``samples``: one prompt and the indices when the copies differ
    only in ``index``, else the list."""
    first = {k: v for k, v in samples[0].items() if k != "index"}
    if all({k: v for k, v in s.items() if k != "index"} == first for s in samples[1:]):
        return {"prompt": samples[0], "indices": [s.get("index") for s in samples]}
    return {"samples": samples}


def _read(path: Path) -> JournalState:
    state = JournalState()
    if not path.exists():
        return state
    lines = path.read_bytes().split(b"\n")
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            state.apply(record)
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):  # the last line lacks its newline: torn by a crash mid-write
                break
            raise BridgeConfigError(f"{path}:{number}: malformed journal record ({exc})") from None
    return state


class ReservationJournal:
    """The append-only journal; every :meth:`append` is on disk (fsynced) when it returns.

    Args:
        path: The journal file; created (with its directory) if missing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.state = _read(path)
        self._truncate_torn_tail()
        created = not path.exists()
        self._fh: IO[str] = path.open("a", encoding="utf-8")
        if created:
            _fsync_dir(path.parent)

    def _truncate_torn_tail(self) -> None:
        """Cut a torn last line, so the next record starts on a line of its own."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as fh:
                fh.truncate(data.rfind(b"\n") + 1)
                fh.flush()
                os.fsync(fh.fileno())

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` as one line, fsync it, and fold it into :attr:`state`.

        Raises:
            BridgeConfigError: The record is not JSON-serialisable (for example a prompt sample holding tensors).
        """
        try:
            line = json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise BridgeConfigError(f"cannot journal a {record.get('kind')} record: {exc}") from None
        self._fh.write(line + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.state.apply(record)

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
