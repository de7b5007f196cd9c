"""The asynchronous GRPO loop: sample through Polar, step, checkpoint, move the fleet, keep sampling.

One step ``k`` (the trainer holds the weights of version ``v``)::

    [submit_next=before_step]   submit step k+1's groups     they sample under v while step k trains
    wait for step k's groups    one watcher per group consumes WatchTask results as they finish
    drop traces more than max_policy_lag behind v            counted; asserted again before the loss
    one AdamW step on the rest                               group-relative advantages, truncated IS
    [submit_next=before_update] submit step k+1's groups     they start while the fleet moves
    save run_dir/checkpoints/v{v+1}; UpdatePolicy(v+1)
    [submit_next=after_update]  submit step k+1's groups     synchronous rounds

The optimiser step and the checkpoint run in a worker thread, so the event loop keeps consuming results
(and, with the embedded stack, keeps serving the services living in this process).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import grpc
from polar.common.v1 import session_pb2

from polar_client import RolloutClient
from polar_client.evaluation import EvalLane
from polar_client.policy import PauseModeName
from polar_core.errors import FailedPrecondition
from polar_core.policy_version import parse_version
from polar_train.batch import Batch, SessionSample, build_batch
from polar_train.checkpoints import checkpoint_dir, save_checkpoint
from polar_train.config import TrainConfig
from polar_train.loss import StepSettings, train_on_batch
from polar_train.metrics import StepMetrics, append_metrics, group_spread
from polar_train.tasks import GroupTemplate

__all__ = ["PolicyUpdater", "RolloutUpdater", "Trainer"]

_log = logging.getLogger(__name__)


class PolicyUpdater(Protocol):
    """Moves the fleet to a new policy version (``UpdatePolicy`` in production)."""

    async def current_version(self) -> int:
        """The fleet's version now (0: the proxies' configured weights)."""
        ...

    async def update(self, version: int, weights_path: Path) -> None:
        """Return once every proxy serves ``version`` from ``weights_path``; raise if the fleet did not move."""
        ...


class RolloutUpdater:
    """:class:`PolicyUpdater` over the rollout server's ``UpdatePolicy``.

    Args:
        client: The rollout client.
        pause_mode: ``drain`` or ``abort``.
    """

    def __init__(self, client: RolloutClient, *, pause_mode: PauseModeName = "drain") -> None:
        self._client = client
        self._pause_mode = pause_mode

    async def current_version(self) -> int:
        """``GetPolicy``'s current version."""
        return int((await self._client.get_policy()).policy.version)

    async def update(self, version: int, weights_path: Path) -> None:
        """Call ``UpdatePolicy``; raise :class:`FailedPrecondition` naming the proxies that did not load."""
        reply = await self._client.update_policy(version, str(weights_path), pause_mode=self._pause_mode)
        if not reply.complete:
            failed = [f"{p.address}: {p.error}" for p in reply.failed]
            raise FailedPrecondition(f"policy v{version} did not reach every proxy: {'; '.join(failed)}")


@dataclasses.dataclass(slots=True)
class _Group:
    task_id: str
    step: int
    results: list[session_pb2.SessionResult]
    watcher: asyncio.Task[None]


class Trainer:
    """The loop over a running rollout server (see the module docstring).

    Args:
        config: The run's configuration.
        client: A client of the rollout server.
        updater: Moves the fleet after each step.
        template: The task template.
        model: The policy being optimised (a transformers causal LM, float32).
        tokenizer: Its tokenizer (saved with each checkpoint).
        start_version: The fleet's version when the run starts (the weights ``model`` holds).
        first_step: The first step to run (a resumed run continues after the steps ``metrics.jsonl`` holds).
        resume: Follow a group whose task id the rollout server already holds (submitted by the run being
            resumed) instead of refusing it.
        on_step: Called with each step's metrics (e.g. to print a line).
        on_sessions: Called with each step's index and the sessions it considered (e.g. to audit rewards).
        evaluation: The evaluation lane: a round pinned to the starting version once the first groups are
            submitted, and one after every ``config.eval_every``-th update; rounds run beside training (their
            tasks are never part of a batch) and the run waits for them at its end.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        client: RolloutClient,
        updater: PolicyUpdater,
        template: GroupTemplate,
        model: Any,
        tokenizer: Any,
        start_version: int = 0,
        first_step: int = 0,
        resume: bool = False,
        on_step: Callable[[StepMetrics], None] | None = None,
        on_sessions: Callable[[int, list[SessionSample]], None] | None = None,
        evaluation: EvalLane | None = None,
    ) -> None:
        import torch

        self.config = config
        self._client = client
        self._updater = updater
        self._template = template
        self._model = model
        self._tokenizer = tokenizer
        self.version = start_version
        self.first_step = first_step
        self._resume = resume
        self._on_step = on_step
        self._on_sessions = on_sessions
        self._evaluation = evaluation
        self._groups: dict[int, list[_Group]] = {}
        self._optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
        )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._settings = StepSettings(tis_cap=config.tis_cap, pad_token_id=int(pad or 0), max_length=config.max_length)
        self.metrics_path = config.run_dir / "metrics.jsonl"

    def task_id(self, step: int, group: int) -> str:
        """A deterministic task id (the agent derives its sampling seed from its session id)."""
        return f"{self.config.run_dir.name}-seed{self.config.seed}-s{step:03d}-g{group}"

    async def run(self) -> list[StepMetrics]:
        """Run every step; return their metrics (also appended to ``metrics.jsonl``)."""
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        rows: list[StepMetrics] = []
        deadline = time.monotonic() + self.config.max_seconds if self.config.max_seconds else None
        try:
            for step in range(self.first_step, self.config.steps):
                if deadline is not None and rows and time.monotonic() >= deadline:
                    _log.info("time budget of %.0fs spent after %d steps", self.config.max_seconds, len(rows))
                    break
                await self._submit(step)
                if self.config.submit_next == "before_step":
                    await self._submit(step + 1)
                if step == self.first_step:
                    self._evaluate(None)  # the starting version, after the first groups (they go first)
                rows.append(await self._step(step))
                append_metrics(self.metrics_path, rows[-1])
                if self._on_step is not None:
                    self._on_step(rows[-1])
            if self._evaluation is not None:
                await self._evaluation.wait()
        finally:
            await self._cancel_pending()
            if self._evaluation is not None:
                await self._evaluation.cancel()
        return rows

    def _evaluate(self, step: int | None) -> None:
        """Start an evaluation round pinned to the version the fleet serves now (``step``: the update's step)."""
        lane = self._evaluation
        if lane is None:
            return
        if step is None and lane.evaluated(self.version):
            return  # a resumed run: this version has its round already
        if step is not None and (step + 1) % self.config.eval_every:
            return
        lane.start_round(self.version, step=step)

    async def _submit(self, step: int) -> None:
        if step in self._groups or step >= self.config.steps:
            return
        groups: list[_Group] = []
        for g in range(self.config.groups_per_step):
            task = self._template.task(
                self.task_id(step, g), group_size=self.config.group_size, instruction=self._instruction(step, g)
            )
            reply = await self._client.submit(task, task_timeout_s=self.config.task_timeout_s)
            if reply.already_existed and not self._resume:
                raise FailedPrecondition(f"task {reply.task_id} already exists: use a new run_dir for a new run")
            results: list[session_pb2.SessionResult] = []
            watcher = asyncio.create_task(self._watch(reply.task_id, results), name=f"watch-{reply.task_id}")
            groups.append(_Group(reply.task_id, step, results, watcher))
        self._groups[step] = groups
        _log.info("step %d: submitted %d groups under version %d", step, len(groups), self.version)

    def _instruction(self, step: int, group: int) -> str | None:
        """The instruction of group ``group`` of step ``step`` (None: the template's)."""
        choices = self.config.instructions
        return choices[(step * self.config.groups_per_step + group) % len(choices)] if choices else None

    async def _watch(self, task_id: str, into: list[session_pb2.SessionResult]) -> None:
        async for result in self._client.watch(task_id):
            into.append(result)

    async def _cancel_pending(self) -> None:
        for groups in self._groups.values():
            for group in groups:
                if not group.watcher.done():
                    group.watcher.cancel()
                    with contextlib.suppress(grpc.aio.AioRpcError):  # e.g. it finished meanwhile
                        await self._client.cancel(group.task_id, "training run ended")
        await asyncio.gather(*(g.watcher for gs in self._groups.values() for g in gs), return_exceptions=True)

    async def _step(self, step: int) -> StepMetrics:
        started = time.monotonic()
        groups = self._groups.pop(step)
        await asyncio.gather(*(g.watcher for g in groups))
        waited = time.monotonic() - started
        sessions = [SessionSample.from_result(r) for g in groups for r in g.results]
        if self._on_sessions is not None:
            self._on_sessions(step, sessions)
        batch = build_batch(sessions, current_version=self.version, max_policy_lag=self.config.max_policy_lag)
        t0 = time.monotonic()
        loss = await asyncio.to_thread(train_on_batch, self._model, self._optimizer, batch, self._settings)
        step_s = time.monotonic() - t0
        if self.config.submit_next == "before_update":
            await self._submit(step + 1)
        new_version = self.version + 1
        t0 = time.monotonic()
        path = await asyncio.to_thread(
            save_checkpoint, self._model, self._tokenizer, checkpoint_dir(self.config.run_dir, new_version).resolve()
        )
        save_s = time.monotonic() - t0
        t0 = time.monotonic()
        await self._updater.update(new_version, path)
        update_s = time.monotonic() - t0
        row = _metrics(step, batch, loss, wait_s=waited, step_s=step_s, save_s=save_s, update_s=update_s)
        self.version = new_version
        if self.config.submit_next == "after_update":
            await self._submit(step + 1)
        self._evaluate(step)
        return row


def _metrics(
    step: int, batch: Batch, loss: dict[str, float], *, wait_s: float, step_s: float, save_s: float, update_s: float
) -> StepMetrics:
    rewards = batch.rewards()
    by_group: dict[str, list[float]] = defaultdict(list)
    for s in batch.sessions:
        if s.status not in ("infra_error", "cancelled"):
            by_group[s.task_id].append(s.reward)
    versions = sorted({parse_version(v) for t in batch.traces for v in t.policy_versions})
    return StepMetrics(
        step=step,
        version=batch.current_version,
        sampled_versions=versions,
        reward_mean=statistics.fmean(rewards) if rewards else 0.0,
        reward_std=statistics.pstdev(rewards) if rewards else 0.0,
        group_reward_std=group_spread(list(by_group.values())),
        sessions=batch.status_counts(),
        policy_lag=batch.lag_summary(),
        stale_traces=batch.stale_traces,
        stale_tokens=batch.stale_tokens,
        max_trained_lag=max(batch.lags, default=0),
        trainable_tokens=batch.trainable_tokens,
        wait_seconds=round(wait_s, 3),
        step_seconds=round(step_s, 3),
        save_seconds=round(save_s, 3),
        update_seconds=round(update_s, 3),
        loss={k: round(v, 6) for k, v in loss.items()},
    )
