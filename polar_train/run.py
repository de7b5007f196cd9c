"""Running a training job: against a rollout server, or on the embedded stack started in this process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from polar_client import RolloutClient
from polar_core.errors import FailedPrecondition
from polar_train.batch import SessionSample
from polar_train.checkpoints import initial_checkpoint, load_policy_model
from polar_train.config import TrainConfig
from polar_train.evaluation import build_eval_lane, eval_task_dirs, eval_tasks
from polar_train.loop import PolicyUpdater, RolloutUpdater, Trainer
from polar_train.metrics import StepMetrics, plot_reward_curve, read_metrics
from polar_train.tasks import GroupTemplate, load_template

__all__ = ["UpdaterFactory", "run_training"]

_log = logging.getLogger(__name__)

# Builds the updater from the client and, on the embedded stack, the stack (None against a remote server).
UpdaterFactory = Callable[[RolloutClient, Any], PolicyUpdater]


def _default_updater(config: TrainConfig) -> UpdaterFactory:
    return lambda client, _stack: RolloutUpdater(client, pause_mode=config.pause_mode)


@contextlib.asynccontextmanager
async def _connect(
    config: TrainConfig, template: GroupTemplate, weights: Path
) -> AsyncIterator[tuple[RolloutClient, Any]]:
    """A client of the configured rollout server, or of an embedded stack serving ``weights``."""
    if config.rollout_address:
        async with RolloutClient(config.rollout_address, token=config.token, timeout_s=60.0) as client:
            yield client, None
        return
    from polar_run.embedded import EmbeddedStack, StackOptions

    prepared = template.prepared
    options = StackOptions(
        state_dir=config.run_dir / "state",
        model=str(weights),
        backend=prepared.backend,
        backend_options=prepared.backend_options,
        harness_bin_dir=prepared.harness_bin_dir,
        running_workers=config.workers,
        # The trainer is this stack's operator: its task template's directory holds the repository and the
        # files the sandboxes read (polar_train.tasks makes it a read-only path of every local runtime).
        task_roots=(prepared.task_dir.absolute(), *eval_task_dirs(config)),
        read_only_roots=(prepared.task_dir.absolute(), *eval_task_dirs(config)),
    )
    async with (
        EmbeddedStack.start(options) as stack,
        RolloutClient(stack.rollout_address, token=stack.token, timeout_s=60.0) as client,
    ):
        yield client, stack


async def _fleet_policy(client: RolloutClient, initial: Path) -> tuple[int, Path]:
    """The version the fleet serves and the checkpoint the trainer starts from: the stored policy's
    (``GetPolicy``) once an update was made, else ``initial``.

    Raises:
        FailedPrecondition: The fleet serves a version whose checkpoint this trainer cannot read.
    """
    policy = (await client.get_policy()).policy
    version = int(policy.version)
    if version <= 0:
        return 0, initial
    path = Path(policy.weights_path)
    if not (path / "config.json").is_file():
        raise FailedPrecondition(
            f"the fleet serves policy v{version} from {policy.weights_path}, which this trainer cannot read: "
            "train where that checkpoint is, or start a new fleet (a new run directory)"
        )
    return version, path


async def run_training(
    config: TrainConfig,
    *,
    resume: bool = False,
    updater_factory: UpdaterFactory | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    on_sessions: Callable[[int, list[SessionSample]], None] | None = None,
) -> list[StepMetrics]:
    """Train as ``config`` says; write ``metrics.jsonl`` and ``reward_curve.png`` to ``config.run_dir``.

    The trainer starts from the policy the fleet serves (``GetPolicy``): on a fresh embedded stack the initial
    checkpoint at version 0; against a fleet, or on a run directory whose ``state/`` holds an earlier run's
    updates (``resume``), the stored version and its checkpoint, which the embedded proxy reloads at start.

    Args:
        config: The run.
        resume: Continue the run in ``config.run_dir``: start at the step after those ``metrics.jsonl`` holds
            and follow groups the earlier run had submitted. The optimiser's moments start afresh (they are not
            checkpointed).
        updater_factory: How the fleet is moved after each step; default ``UpdatePolicy`` on the rollout
            server.
        on_step: Called with each step's metrics.
        on_sessions: Called with each step's index and the sessions it considered.
    """
    import torch

    torch.manual_seed(config.seed)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    template = load_template(config.task, max_policy_lag=config.max_policy_lag, stale_policy=config.stale_policy)
    held_out = eval_tasks(config, template)  # a malformed eval task file fails here, before anything starts
    weights = initial_checkpoint(config.model, config.run_dir, seed=config.seed)
    factory = updater_factory or _default_updater(config)
    metrics_path = config.run_dir / "metrics.jsonl"
    first_step = len(read_metrics(metrics_path)) if resume and metrics_path.is_file() else 0
    async with _connect(config, template, weights) as (client, stack):
        updater = factory(client, stack)
        version, start_from = await _fleet_policy(client, weights)
        if version:
            _log.info("starting from the fleet's policy v%d (%s) at step %d", version, start_from, first_step)
        tokenizer, model = await asyncio.to_thread(load_policy_model, start_from)
        trainer = Trainer(
            config,
            client=client,
            updater=updater,
            template=template,
            model=model,
            tokenizer=tokenizer,
            start_version=max(version, await updater.current_version()),
            first_step=first_step,
            resume=resume,
            on_step=on_step,
            on_sessions=on_sessions,
            evaluation=build_eval_lane(config, client, held_out),
        )
        rows = await trainer.run()
    curve = config.run_dir / "reward_curve.png"
    plot_reward_curve(read_metrics(trainer.metrics_path), curve, title=f"{config.task.parent.name} ({config.model})")
    return rows
