"""Running a training job: against a rollout server, or on the embedded stack started in this process."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from polar_client import RolloutClient
from polar_train.batch import SessionSample
from polar_train.checkpoints import initial_checkpoint, load_policy_model
from polar_train.config import TrainConfig
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
        task_roots=(prepared.task_dir.absolute(),),
        read_only_roots=(prepared.task_dir.absolute(),),
    )
    async with (
        EmbeddedStack.start(options) as stack,
        RolloutClient(stack.rollout_address, token=stack.token, timeout_s=60.0) as client,
    ):
        yield client, stack


async def run_training(
    config: TrainConfig,
    *,
    updater_factory: UpdaterFactory | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    on_sessions: Callable[[int, list[SessionSample]], None] | None = None,
) -> list[StepMetrics]:
    """Train as ``config`` says; write ``metrics.jsonl`` and ``reward_curve.png`` to ``config.run_dir``.

    Args:
        config: The run.
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
    weights = initial_checkpoint(config.model, config.run_dir, seed=config.seed)
    tokenizer, model = load_policy_model(weights)
    factory = updater_factory or _default_updater(config)
    async with _connect(config, template, weights) as (client, stack):
        updater = factory(client, stack)
        trainer = Trainer(
            config,
            client=client,
            updater=updater,
            template=template,
            model=model,
            tokenizer=tokenizer,
            start_version=await updater.current_version(),
            on_step=on_step,
            on_sessions=on_sessions,
        )
        rows = await trainer.run()
    curve = config.run_dir / "reward_curve.png"
    plot_reward_curve(read_metrics(trainer.metrics_path), curve, title=f"{config.task.parent.name} ({config.model})")
    return rows
