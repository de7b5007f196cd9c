"""The slime bridge's configuration: Polar settings plus the slime arguments it depends on, checked up front.

slime calls the rollout function with its parsed ``args``; ``--custom-config-path FILE.yaml`` sets every key of
that YAML file as an attribute of ``args``, so the bridge reads its settings from ``args.polar_<name>`` first,
then from the environment (``POLAR_SLIME_<NAME>``), then the defaults below. From slime it takes
``rollout_batch_size``, ``n_samples_per_prompt`` and ``save`` (the default home of the journal).

Everything that can be refused is refused here, by :func:`bridge_config`, before a single task is submitted.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from polar_core.errors import InvalidArgument

__all__ = ["BridgeConfig", "BridgeConfigError", "SlimeBridgeSettings", "bridge_config"]

MultiTrace = Literal["longest", "last"]


class BridgeConfigError(InvalidArgument):
    """The bridge cannot run as configured (raised before anything is submitted)."""


class SlimeBridgeSettings(BaseSettings):
    """Polar settings of the slime bridge (``args.polar_<name>`` > ``POLAR_SLIME_<NAME>`` > default).

    Attributes:
        server: ``host:port`` of the rollout server.
        token: The control-plane token.
        task: The task template (a TASK.yaml); each group's task is this template with the prompt as its
            instruction and ``n_samples_per_prompt`` samples.
        max_async_level: How many rollouts' worth of groups are kept in flight: the prefetch window holds
            ``rollout_batch_size * max_async_level`` groups, kept warm across rollout boundaries.
        max_policy_lag: The staleness bound set on every task and checked again when a group is handed to slime.
            It must be at least ``max_async_level``: the last group of a full window is trained that many
            versions after it was reserved.
        stale_policy: What the rollout server does with a session beyond the bound: ``keep`` (the bridge masks
            it out and counts it) or ``resample``.
        journal: The append-only reservations journal; default ``<args.save>/polar_slime_journal.jsonl``.
        run_id: Prefix of the task ids; empty: a random one, generated once and kept in the journal.
        multi_trace: Which trace of a session that reconstruction split in several becomes its sample:
            ``longest`` (most trainable tokens; ties go to the later trace) or ``last``.
        sample_type: ``module:Class`` of slime's ``Sample`` (rebuilds journaled prompts after a restart).
        task_timeout_s: Deadline of each task (0: the rollout server's default).
        rpc_timeout_s: Deadline of each unary call to the rollout server.
        stamp_versions: At the start of each rollout, stamp the fleet's policy version = ``rollout_id`` when it is
            above the fleet's (``UpdatePolicy`` with ``weights_synced``): for slime's synchronous loop, which syncs
            the new weights into its SGLang servers right before asking for the next rollout. Off: the trainer
            stamps versions itself (:func:`polar_train.bridges.fleet_version.stamp_fleet_version` after each
            sync), or every call keeps version 0 and the lag bound never acts.
    """

    model_config = SettingsConfigDict(env_prefix="POLAR_SLIME_", frozen=True, extra="forbid")

    server: str = "127.0.0.1:50051"
    token: str = ""
    task: Path | None = None
    max_async_level: int = 1
    max_policy_lag: int = 1
    stale_policy: Literal["keep", "resample"] = "keep"
    journal: Path | None = None
    run_id: str = ""
    multi_trace: MultiTrace = "longest"
    sample_type: str = "slime.utils.types:Sample"
    task_timeout_s: float = 0.0
    rpc_timeout_s: float = 60.0
    stamp_versions: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class BridgeConfig:
    """Everything the bridge runs with, checked.

    Attributes:
        settings: The Polar settings.
        rollout_batch_size: Groups per rollout (slime's ``--rollout-batch-size``).
        n_samples_per_prompt: Samples per group (slime's ``--n-samples-per-prompt``): one task's ``num_samples``.
        journal: The reservations journal's path.
    """

    settings: SlimeBridgeSettings
    rollout_batch_size: int
    n_samples_per_prompt: int
    journal: Path

    @property
    def window(self) -> int:
        """Groups kept in flight: ``rollout_batch_size * max_async_level``."""
        return self.rollout_batch_size * self.settings.max_async_level


def _settings_from(args: Any) -> SlimeBridgeSettings:
    overrides = {
        name: getattr(args, f"polar_{name}")
        for name in SlimeBridgeSettings.model_fields
        if getattr(args, f"polar_{name}", None) is not None
    }
    try:
        return SlimeBridgeSettings(**overrides)
    except ValidationError as exc:
        raise BridgeConfigError(f"slime bridge settings: {exc}") from None


def _positive_int(args: Any, name: str) -> int:
    value = getattr(args, name, None)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BridgeConfigError(f"slime's args.{name} must be an integer, got {value!r}")
    return value


def bridge_config(args: Any) -> BridgeConfig:
    """Read and check the bridge's configuration from slime's ``args`` and the environment.

    Raises:
        BridgeConfigError: No task template; a task without samples (``n_samples_per_prompt`` < 1) or a group
            of one (GRPO's group-relative advantage needs at least two samples); ``rollout_batch_size`` < 1;
            ``max_async_level`` < 1; a lag bound the window cannot honour (``max_policy_lag`` <
            ``max_async_level``); no place for the journal.
    """
    settings = _settings_from(args)
    batch = _positive_int(args, "rollout_batch_size")
    samples = _positive_int(args, "n_samples_per_prompt")
    if settings.task is None:
        raise BridgeConfigError("set polar_task (a TASK.yaml template) in --custom-config-path or POLAR_SLIME_TASK")
    if samples < 1:
        raise BridgeConfigError(f"n_samples_per_prompt is {samples}: a task without samples has nothing to train on")
    if samples == 1:
        raise BridgeConfigError(
            "n_samples_per_prompt is 1: a group of one has no group-relative advantage (its reward minus the "
            "group mean is always 0); use at least 2"
        )
    if batch < 1:
        raise BridgeConfigError(f"rollout_batch_size must be at least 1, got {batch}")
    if settings.max_async_level < 1:
        raise BridgeConfigError(f"polar_max_async_level must be at least 1, got {settings.max_async_level}")
    if settings.max_policy_lag < settings.max_async_level:
        raise BridgeConfigError(
            f"polar_max_policy_lag {settings.max_policy_lag} cannot be honoured with polar_max_async_level "
            f"{settings.max_async_level}: a window of {settings.max_async_level} rollouts ahead hands slime groups "
            f"reserved up to {settings.max_async_level} policy versions earlier; raise the bound or lower the level"
        )
    if settings.rpc_timeout_s <= 0 or settings.task_timeout_s < 0:
        raise BridgeConfigError("polar_rpc_timeout_s must be positive and polar_task_timeout_s not negative")
    journal = settings.journal
    if journal is None:
        save = getattr(args, "save", None)
        if not save:
            raise BridgeConfigError("set polar_journal, or slime's --save (the journal then lives under it)")
        journal = Path(save) / "polar_slime_journal.jsonl"
    return BridgeConfig(settings=settings, rollout_batch_size=batch, n_samples_per_prompt=samples, journal=journal)
