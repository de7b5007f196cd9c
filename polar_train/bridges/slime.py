"""slime's ``--rollout-function-path polar_train.bridges.slime.generate_rollout``: slime trains, Polar samples.

Built against slime's documented rollout-function contract at THUDM/slime commit
``624b824a898ab0ec1fcb4d373004c7f3852bf515`` (``slime/rollout/base_types.py``, ``slime/ray/rollout.py``):
``generate_rollout(args, rollout_id, data_source, evaluation=False)`` returns ``RolloutFnTrainOutput(samples,
metrics)`` whose ``samples`` are ``rollout_batch_size`` groups of ``n_samples_per_prompt`` ``Sample`` objects
(a bare list of groups when slime is not importable, which slime's ``call_rollout_fn`` also accepts). slime is not
on the package index, so this is tested against that interface with a stand-in of ``Sample``
(``polar_train/bridges/tests/slime_sample_standin.py``), not against the package.

slime calls the function synchronously, once per rollout, from its rollout manager. The bridge it configures on
the first call (:func:`~polar_train.bridges.slime_settings.bridge_config`: every refusal happens there, before
any submission) lives on for the process with its own event loop in a thread, so the groups it submitted keep
being followed between calls (:mod:`polar_train.bridges.slime_window`), and is keyed by its journal.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from polar.common.v1 import task_pb2

from polar_client import RolloutClient, load_task
from polar_train.bridges.slime_convert import BridgeCounters
from polar_train.bridges.slime_journal import ReservationJournal
from polar_train.bridges.slime_settings import BridgeConfig, BridgeConfigError, bridge_config
from polar_train.bridges.slime_window import SampleCodec, SlimeBridge

__all__ = ["BridgeConfigError", "BridgeCounters", "close_bridges", "generate_rollout", "running_bridge"]

_T = TypeVar("_T")


class _LoopThread:
    """An event loop in a daemon thread: the bridge's gRPC channel and watchers live on it between calls."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="polar-slime-bridge", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class _Running:
    """One configured bridge, its client and its loop."""

    def __init__(self, config: BridgeConfig, template: task_pb2.Task, codec: SampleCodec) -> None:
        self.thread = _LoopThread()
        try:
            self.bridge, self.client = self.thread.call(self._open(config, template, codec))
        except BaseException:
            self.thread.stop()
            raise

    @staticmethod
    async def _open(
        config: BridgeConfig, template: task_pb2.Task, codec: SampleCodec
    ) -> tuple[SlimeBridge, RolloutClient]:
        s = config.settings
        journal = ReservationJournal(config.journal)
        client = RolloutClient(s.server, token=s.token, timeout_s=s.rpc_timeout_s)
        try:
            return SlimeBridge(config, client, template, codec, journal), client
        except BaseException:
            journal.close()
            await client.close()
            raise

    def close(self) -> None:
        async def _close() -> None:
            await self.bridge.close()
            await self.client.close()

        self.thread.call(_close())
        self.thread.stop()


# slime's contract is a plain function called once per rollout; the window must outlive each call, so the
# process keeps its bridges here (one per journal), as slime's own fully-async rollout keeps its worker.
_BRIDGES: dict[Path, _Running] = {}
_LOCK = threading.Lock()


def _template(config: BridgeConfig) -> task_pb2.Task:
    assert config.settings.task is not None
    try:
        template = load_task(config.settings.task)
    except Exception as exc:
        raise BridgeConfigError(f"polar_task {config.settings.task}: {exc}") from exc
    if template.num_samples not in (0, config.n_samples_per_prompt):
        raise BridgeConfigError(
            f"the task template asks for num_samples {template.num_samples} but slime's n_samples_per_prompt is "
            f"{config.n_samples_per_prompt}: drop num_samples from the template (the bridge sets it)"
        )
    return template


def _running(args: Any) -> _Running:
    config = bridge_config(args)
    key = config.journal.resolve()
    with _LOCK:
        running = _BRIDGES.get(key)
        if running is None:
            template = _template(config)
            codec = SampleCodec.named(config.settings.sample_type)
            running = _BRIDGES[key] = _Running(config, template, codec)
        return running


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout function: ``rollout_batch_size`` groups of filled ``Sample`` objects sampled by Polar.

    Args:
        args: slime's arguments; the bridge's settings come from ``args.polar_*`` (``--custom-config-path``) or
            ``POLAR_SLIME_*`` (:class:`~polar_train.bridges.slime_settings.SlimeBridgeSettings`).
        rollout_id: The rollout; a restart that repeats recorded rollouts gets exactly their groups again.
        data_source: slime's data source (``get_samples(n)`` gives ``n`` groups of prompt samples).
        evaluation: Not supported: evaluation keeps slime's own rollout function.

    Returns:
        ``RolloutFnTrainOutput(samples, metrics)`` (``metrics``: the bridge's counters as ``polar/<name>``), or
        the bare list of groups when slime itself is not importable.

    Raises:
        BridgeConfigError: Bad configuration (before anything is submitted), or ``evaluation=True``.
    """
    if evaluation:
        raise BridgeConfigError(
            "the Polar bridge samples training rollouts only: set --eval-function-path to slime's own "
            "(slime.rollout.sglang_rollout.generate_rollout), or leave evaluation off"
        )
    running = _running(args)
    groups = running.thread.call(running.bridge.rollout(rollout_id, data_source))
    metrics = running.bridge.counters.as_metrics()
    try:  # by name: slime is optional, and not on the package index
        output_type = importlib.import_module("slime.rollout.base_types").RolloutFnTrainOutput
    except ImportError:
        return groups
    return output_type(samples=groups, metrics=metrics)


def running_bridge(journal: Path) -> SlimeBridge | None:
    """The bridge this process runs for ``journal`` (its :attr:`~SlimeBridge.counters`), if any."""
    with _LOCK:
        running = _BRIDGES.get(journal.resolve())
    return running.bridge if running is not None else None


def close_bridges() -> None:
    """Stop every bridge of this process (its tasks go on on the rollout server; a new call resumes them)."""
    with _LOCK:
        runnings = list(_BRIDGES.values())
        _BRIDGES.clear()
    for running in runnings:
        running.close()
