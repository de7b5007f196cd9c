"""The slime bridge's prefetch window: groups reserved, submitted to Polar and followed across rollouts.

One :class:`SlimeBridge` lives as long as slime's rollout process and runs on one event loop. A rollout takes
``rollout_batch_size`` finished groups out of a window of ``rollout_batch_size * max_async_level`` groups in
flight, then tops the window up again *before* returning, so the next groups sample while slime trains. Every
step that changes what a restart must know is journaled (fsynced) before it is acted on
(:mod:`polar_train.bridges.slime_journal`): a reservation before its task is submitted, a rollout's groups
before they are returned.

Groups leave the window in the order they finish (ties: reservation order), the fully asynchronous way: a slow
group does not hold a rollout back, and the lag bound (checked at hand-off, and on the rollout server when the
task says ``resample``) keeps a group that waited too long out of the loss.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import importlib
import logging
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

import grpc
from polar.common.v1 import session_pb2, task_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb

from polar_core.errors import FailedPrecondition
from polar_train.bridges.fleet_version import PolicyUpdater, stamp_with
from polar_train.bridges.slime_convert import BridgeCounters, fill_group
from polar_train.bridges.slime_journal import Reservation, ReservationJournal, compact_samples
from polar_train.bridges.slime_settings import BridgeConfig, BridgeConfigError

__all__ = ["GroupsUnusable", "PolarRollouts", "SampleCodec", "SlimeBridge", "instruction_of"]

_log = logging.getLogger(__name__)
_STALE = {"keep": task_pb2.STALE_POLICY_KEEP, "resample": task_pb2.STALE_POLICY_RESAMPLE}


class GroupsUnusable(FailedPrecondition):
    """Group after group ends without a usable trace: the task or the fleet is broken, not the policy."""


def _first_error(group: _Group) -> str:
    errors = [r.error_message or r.status for r in group.results.values()]
    return errors[0] if errors else "no session result"


class PolarRollouts(PolicyUpdater, Protocol):
    """The part of :class:`polar_client.RolloutClient` the bridge uses (a fake stands in for it in unit tests)."""

    async def submit(self, task: Any, *, task_timeout_s: float | None = None) -> pb.SubmitTaskResponse: ...

    def watch(self, task_id: str) -> AsyncIterator[session_pb2.SessionResult]: ...

    async def get_policy(self) -> pb.GetPolicyResponse: ...


class DataSource(Protocol):
    """slime's data source, as far as the bridge uses it."""

    def get_samples(self, num_samples: int) -> list[list[Any]]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class SampleCodec:
    """slime ``Sample`` ↔ the journal's JSON (``Sample.to_dict`` / ``Sample.from_dict``)."""

    sample_type: Any  # slime's Sample class (or a stand-in): has to_dict() and a static from_dict()

    @classmethod
    def named(cls, path: str) -> SampleCodec:
        """The codec of the class at ``module:Class`` (``module.Class`` is accepted too).

        Raises:
            BridgeConfigError: It cannot be imported.
        """
        module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
        try:
            return cls(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError, ValueError) as exc:
            raise BridgeConfigError(f"cannot import slime's Sample type {path!r} (polar_sample_type): {exc}") from None

    @staticmethod
    def encode(sample: Any) -> dict[str, Any]:
        """The sample's dictionary."""
        return dict(sample.to_dict())

    def decode(self, data: Mapping[str, Any]) -> Any:
        """A sample from its dictionary."""
        return self.sample_type.from_dict(copy.deepcopy(dict(data)))  # no state shared between copies


def instruction_of(prompt: Any) -> str:
    """The task instruction of a slime prompt: the string itself, or a chat list's last user message.

    Raises:
        BridgeConfigError: Neither (or an empty instruction).
    """
    text: Any = prompt
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        text = users[-1] if users else None
    if not isinstance(text, str) or not text.strip():
        raise BridgeConfigError(f"a slime prompt must be a string or a chat with a user message, got {prompt!r:.200}")
    return text


@dataclasses.dataclass(slots=True)
class _Group:
    reservation: Reservation
    results: dict[int, session_pb2.SessionResult] = dataclasses.field(default_factory=dict)
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    finished: int = -1  # the order in which it finished
    watcher: asyncio.Task[None] | None = None


class SlimeBridge:
    """Reserve, submit and follow groups; hand finished ones to slime as filled samples.

    Args:
        config: The checked configuration.
        client: The rollout server.
        template: The task template every group's task is stamped from.
        codec: How prompt samples go into the journal and come back.
        journal: The opened reservations journal.
    """

    def __init__(
        self,
        config: BridgeConfig,
        client: PolarRollouts,
        template: task_pb2.Task,
        codec: SampleCodec,
        journal: ReservationJournal,
    ) -> None:
        self.config = config
        self.counters = BridgeCounters()
        self._client = client
        self._template = template
        self._codec = codec
        self._journal = journal
        self._followed: dict[int, _Group] = {}  # every group with a watcher, by number
        self._window: dict[int, _Group] = {}  # those reserved and not yet handed to slime
        self._finished = 0
        self._wakeup = asyncio.Event()
        self._replay: dict[int, list[int]] | None = None
        wanted = config.settings.run_id
        if not journal.state.run_id:
            journal.append({"kind": "run", "run_id": wanted or f"slime-{secrets.token_hex(4)}"})
        elif wanted and wanted != journal.state.run_id:
            raise BridgeConfigError(
                f"polar_run_id {wanted!r} differs from the run {journal.state.run_id!r} that {journal.path} records: "
                "a new run wants a new journal"
            )

    @property
    def run_id(self) -> str:
        """The run id every task id starts with."""
        return self._journal.state.run_id

    @property
    def in_flight(self) -> int:
        """Groups reserved and not yet handed to slime."""
        return len(self._window)

    # -- rollouts -------------------------------------------------------------------------------------------

    async def rollout(self, rollout_id: int, data_source: DataSource) -> list[list[Any]]:
        """The ``rollout_batch_size`` groups of rollout ``rollout_id``, filled; the window is full again after."""
        if self.config.settings.stamp_versions and rollout_id > await self._version():
            await stamp_with(self._client, rollout_id)
        if self._replay is None:
            await self._recover(rollout_id)
        assert self._replay is not None
        if rollout_id in self._replay:
            groups = await self._replayed(rollout_id, self._replay.pop(rollout_id))
        else:
            await self._fill(rollout_id, data_source)
            groups = await self._take(rollout_id, data_source)
        await self._fill(rollout_id, data_source)
        return groups

    async def _replayed(self, rollout_id: int, numbers: Sequence[int]) -> list[list[Any]]:
        """A rollout the journal records, handed over again with exactly its groups (read back, not resampled)."""
        version = await self._version()
        out = []
        for number in numbers:
            group = self._follow(self._journal.state.reserved[number])
            await group.done.wait()
            del self._followed[number]
            samples = self._filled(group, version)
            if samples is None:
                raise GroupsUnusable(f"journaled group {number} of rollout {rollout_id} has no usable trace now")
            out.append(samples)
            self.counters.replayed_groups += 1
        _log.info("slime bridge: replayed rollout %d (%d groups) from the journal", rollout_id, len(out))
        return out

    async def _take(self, rollout_id: int, data_source: DataSource) -> list[list[Any]]:
        """Wait for ``rollout_batch_size`` usable finished groups, journal them, return them filled."""
        chosen: list[tuple[int, list[Any]]] = []
        discarded = 0
        while len(chosen) < self.config.rollout_batch_size:
            ready = sorted((g for g in self._window.values() if g.done.is_set()), key=lambda g: g.finished)
            if not ready:
                if not self._window:
                    raise BridgeConfigError("the data source ran dry: no group left to sample")
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            version = await self._version()
            for group in ready[: self.config.rollout_batch_size - len(chosen)]:
                number = group.reservation.group
                del self._window[number]
                del self._followed[number]
                samples = self._filled(group, version)
                if samples is None:
                    self._journal.append({"kind": "discard", "group": number, "reason": "no usable trace"})
                    self.counters.discarded_groups += 1
                    discarded += 1
                    if discarded > 2 * self.config.window:  # a broken task or fleet, not bad luck: stop
                        raise GroupsUnusable(
                            f"{discarded} groups in a row ended without a usable trace (the last, task "
                            f"{group.reservation.task_id}: {_first_error(group)}); check the task template and "
                            "the fleet"
                        )
                    await self._fill(rollout_id, data_source)
                    continue
                chosen.append((number, samples))
        chosen.sort()
        self._journal.append({"kind": "consume", "rollout_id": rollout_id, "groups": [n for n, _ in chosen]})
        self.counters.consumed_groups += len(chosen)
        return [samples for _, samples in chosen]

    def _filled(self, group: _Group, version: int) -> list[Any] | None:
        samples = [self._codec.decode(d) for d in group.reservation.samples]
        settings = self.config.settings
        usable = fill_group(
            samples,
            group.results,
            group_id=group.reservation.group,
            task_id=group.reservation.task_id,
            current_version=version,
            max_policy_lag=settings.max_policy_lag,
            multi_trace=settings.multi_trace,
            counters=self.counters,
        )
        return samples if usable else None

    async def _version(self) -> int:
        return int((await self._client.get_policy()).policy.version)

    # -- reserving ------------------------------------------------------------------------------------------

    async def _fill(self, rollout_id: int, data_source: DataSource) -> None:
        """Reserve and submit groups until the window holds ``rollout_batch_size * max_async_level``."""
        while len(self._window) < self.config.window:
            batch = data_source.get_samples(self.config.window - len(self._window))
            if not batch:
                return
            for prompt_group in batch:
                await self._reserve(rollout_id, list(prompt_group))

    async def _reserve(self, rollout_id: int, prompt_group: list[Any]) -> None:
        n = self.config.n_samples_per_prompt
        if len(prompt_group) != n:
            raise BridgeConfigError(f"the data source gave a group of {len(prompt_group)} samples, expected {n}")
        index = prompt_group[0].group_index
        if index is not None and index in self._journal.state.data_group_indices:
            self.counters.skipped_reservations += 1  # handed out again after a restart rolled the source back
            return
        number = self._journal.state.next_group
        record = {
            "kind": "reserve",
            "group": number,
            "task_id": f"{self.run_id}-g{number:08d}",
            "data_group_index": index,
            "instruction": instruction_of(prompt_group[0].prompt),
            **compact_samples([self._codec.encode(s) for s in prompt_group]),
            "rollout_id": rollout_id,
        }
        self._journal.append(record)  # before the submission: a restart follows it up
        reservation = self._journal.state.reserved[number]
        try:  # submitted here, so the window is full when the rollout returns
            await self._submit(reservation)
            submitted = True
        except Exception:
            _log.warning("slime bridge: submitting %s failed; retrying once", reservation.task_id, exc_info=True)
            submitted = False
        self._window[number] = self._follow(reservation, submitted=submitted)
        self.counters.submitted_groups += 1

    async def _submit(self, reservation: Reservation) -> None:
        timeout = self.config.settings.task_timeout_s or None
        await self._client.submit(self.task_of(reservation), task_timeout_s=timeout)

    def task_of(self, reservation: Reservation) -> task_pb2.Task:
        """The group's task: the template with its id, instruction, samples and staleness bound."""
        task = task_pb2.Task()
        task.CopyFrom(self._template)
        task.task_id = reservation.task_id
        task.instruction = reservation.instruction
        task.num_samples = self.config.n_samples_per_prompt
        task.max_policy_lag = self.config.settings.max_policy_lag
        task.stale_policy = _STALE[self.config.settings.stale_policy]
        task.metadata.update({"slime_group": reservation.group})
        return task

    # -- following ------------------------------------------------------------------------------------------

    def _follow(self, reservation: Reservation, *, submitted: bool = False) -> _Group:
        """Collect the group's results as they finish, submitting its task first unless ``submitted``
        (submitting again is safe: the rollout server answers ``already_existed`` for the same task id)."""
        group = self._followed.get(reservation.group)
        if group is None:
            group = self._followed[reservation.group] = _Group(reservation)
            group.watcher = asyncio.get_running_loop().create_task(self._watch(group, submitted))
        return group

    async def _watch(self, group: _Group, submitted: bool) -> None:
        task_id = group.reservation.task_id
        try:
            if not submitted:
                try:
                    await self._submit(group.reservation)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                        raise
                    # Submitted before a restart from a template changed since: follow what was sampled.
                    _log.warning("slime bridge: %s exists with another spec; following it", task_id)
            async for result in self._client.watch(task_id):
                group.results[int(result.sample_index)] = result
        except asyncio.CancelledError:
            raise
        except Exception:  # the group ends with what it has: missing sessions are FAILED and zeroed
            _log.exception("slime bridge: following task %s failed", task_id)
        group.finished = self._finished
        self._finished += 1
        group.done.set()
        self._wakeup.set()

    async def _recover(self, rollout_id: int) -> None:
        """Replay rollouts ``>= rollout_id`` the journal records; follow the open groups again."""
        state = self._journal.state
        self._replay = {r: groups for r, groups in state.rollouts.items() if r >= rollout_id}
        for number in state.open_groups():
            self._window[number] = self._follow(state.reserved[number])
            self.counters.reattached_groups += 1
        if self._replay or self._window:
            _log.info(
                "slime bridge: resuming at rollout %d: %d rollouts to replay, %d open groups followed again",
                rollout_id,
                len(self._replay),
                len(self._window),
            )

    async def close(self) -> None:
        """Stop following (the tasks go on on the rollout server) and close the journal."""
        watchers = [g.watcher for g in self._followed.values() if g.watcher is not None]
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        self._journal.close()
