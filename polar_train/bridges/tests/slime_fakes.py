"""A fake rollout server for the slime bridge's unit tests: tasks, sessions and policy versions in memory.

Each task is *sampled* once, when first submitted (``sampled`` counts it per prompt group); submitting the same
task id again with the identical task answers ``already_existed``, as the rollout server does. A task's results
are released by :meth:`FakePolar.finish` (or at once with ``auto_finish``), so tests choose the order in which
groups finish.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

from polar.common.v1 import session_pb2, task_pb2, trace_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb

from polar_client import PolicyUpdateResult
from polar_train.bridges.slime_journal import ReservationJournal
from polar_train.bridges.slime_settings import BridgeConfig, SlimeBridgeSettings
from polar_train.bridges.slime_window import SampleCodec, SlimeBridge
from polar_train.bridges.tests.slime_sample_standin import Sample

Outcome = Callable[[task_pb2.Task, int], session_pb2.SessionResult]


def trace(
    *,
    prompt: list[int] | None = None,
    response: list[int] | None = None,
    mask: list[int] | None = None,
    logprobs: list[float] | None = None,
    versions: tuple[str, ...] = ("0",),
    index: int = 0,
) -> trace_pb2.Trace:
    """A trace; by default a 3-token prompt and a 4-token response whose middle token is a tool output."""
    response = [11, 12, 13, 14] if response is None else response
    return trace_pb2.Trace(
        trace_index=index,
        prompt_token_ids=[1, 2, 3] if prompt is None else prompt,
        response_token_ids=response,
        loss_mask=[1, 0, 1, 1] if mask is None else mask,
        response_logprobs=[-0.5, 0.0, -0.25, -0.125] if logprobs is None else logprobs,
        policy_versions=list(versions),
    )


def result(
    task: task_pb2.Task, index: int, *, status: str = "resolved", reward: float | None = None, traces: Any = None
) -> session_pb2.SessionResult:
    """Session ``index`` of ``task``; by default resolved, reward ``index / 10``, one default trace."""
    return session_pb2.SessionResult(
        session_id=f"{task.task_id}-s{index}",
        task_id=task.task_id,
        status=status,
        reward=index / 10 if reward is None else reward,
        sample_index=index,
        traces=[trace()] if traces is None else traces,
    )


class FakePolar:
    """The rollout server as far as the bridge sees it."""

    def __init__(self, outcome: Outcome = result, *, auto_finish: bool = True, version: int = 0) -> None:
        self.outcome = outcome
        self.auto_finish = auto_finish
        self.version = version
        self.tasks: dict[str, task_pb2.Task] = {}
        self.sampled: Counter[str] = Counter()  # by instruction: how often each prompt group was sampled
        self.submissions = 0
        self.stamps: list[int] = []  # versions stamped through update_policy
        self._gates: dict[str, asyncio.Event] = {}

    async def submit(self, task: Any, *, task_timeout_s: float | None = None) -> pb.SubmitTaskResponse:
        self.submissions += 1
        if task.task_id in self.tasks:
            assert self.tasks[task.task_id] == task, "the same task id with another task"
            return pb.SubmitTaskResponse(task_id=task.task_id, already_existed=True)
        self.tasks[task.task_id] = task
        self.sampled[task.instruction] += 1
        self._gates[task.task_id] = gate = asyncio.Event()
        if self.auto_finish:
            gate.set()
        return pb.SubmitTaskResponse(task_id=task.task_id)

    def finish(self, task_id: str) -> None:
        self._gates[task_id].set()

    async def watch(self, task_id: str) -> AsyncIterator[session_pb2.SessionResult]:
        await self._gates[task_id].wait()
        task = self.tasks[task_id]
        for index in range(task.num_samples):
            yield self.outcome(task, index)

    async def get_policy(self) -> pb.GetPolicyResponse:
        return pb.GetPolicyResponse(policy=pb.PolicyInfo(version=self.version))

    async def update_policy(
        self,
        version: int,
        weights_path: str = "",
        *,
        pause_mode: Literal["drain", "abort"] = "drain",
        drain_timeout_s: float | None = None,
        timeout_s: float | None = None,
        weights_synced: bool = False,
    ) -> PolicyUpdateResult:
        """A synced stamp (the only kind the bridge makes): the fleet's version moves."""
        assert weights_synced
        assert not weights_path
        assert version > self.version
        self.version = version
        self.stamps.append(version)
        return PolicyUpdateResult(version, "", complete=True, replayed=False, seconds=0.0, proxies=())


def config(journal: Path, *, batch: int = 2, samples: int = 4, level: int = 2, **settings: Any) -> BridgeConfig:
    """A checked-enough configuration for :class:`SlimeBridge` in tests."""
    merged = {"task": journal.parent / "task.yaml", "max_async_level": level, "max_policy_lag": level, **settings}
    return BridgeConfig(
        settings=SlimeBridgeSettings(**merged),
        rollout_batch_size=batch,
        n_samples_per_prompt=samples,
        journal=journal,
    )


def template() -> task_pb2.Task:
    """A task template (the bridge only copies it)."""
    return task_pb2.Task(harness=task_pb2.HarnessSpec(name="command"), timeout_seconds=60.0)


def bridge(cfg: BridgeConfig, polar: FakePolar) -> SlimeBridge:
    """A bridge over ``polar`` with the stand-in ``Sample``."""
    return SlimeBridge(cfg, polar, template(), SampleCodec(Sample), ReservationJournal(cfg.journal))
