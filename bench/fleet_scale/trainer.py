"""The trainer side of the fleet bench: submit groups of samples, watch each task with WatchTask, keep N active.

:func:`closed_loop` keeps ``active`` sessions outstanding (submitted and not yet seen by the trainer): it submits
tasks of ``group`` samples at once up to ``active``, then one more group whenever a group's worth of results has
come back, until the window ends; then it waits for everything it submitted. :func:`backlog` submits a large
queue at once. Every result the trainer sees is timestamped by session id, and each one is counted, so a result
delivered twice shows up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter

import grpc
from google.protobuf import struct_pb2
from polar.common.v1 import task_pb2
from polar.rollout.v1 import rollout_service_pb2 as rpb
from polar.rollout.v1 import rollout_service_pb2_grpc

__all__ = ["Trainer", "Workload"]

_SUBMITTERS = 16


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """What a phase's tasks ask the simulated gateways for (passed in the task's metadata)."""

    median_s: float
    sigma: float
    large_fraction: float
    small_tokens: int


@dataclasses.dataclass
class Trainer:
    """Submits tasks and watches them; records, by session id, when each was submitted and seen."""

    stub: rollout_service_pb2_grpc.RolloutServiceAsyncStub
    submitted_at: dict[str, float] = dataclasses.field(default_factory=dict)
    received_at: dict[str, float] = dataclasses.field(default_factory=dict)
    statuses: Counter[str] = dataclasses.field(default_factory=Counter)
    deliveries: Counter[str] = dataclasses.field(default_factory=Counter)
    outstanding: int = 0
    _seen: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _watchers: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)

    async def submit(self, task_id: str, samples: int, workload: Workload) -> None:
        """Submit one task and start watching it."""
        metadata = struct_pb2.Struct()
        metadata.update(dataclasses.asdict(workload))
        task = task_pb2.Task(
            task_id=task_id, instruction="simulated", num_samples=samples, timeout_seconds=3600, metadata=metadata
        )
        now = time.time()
        for i in range(samples):
            self.submitted_at[f"{task_id}-{i:04d}"] = now
        self.outstanding += samples
        await self.stub.SubmitTask(rpb.SubmitTaskRequest(task=task), timeout=120, wait_for_ready=True)
        watcher = asyncio.create_task(self._watch(task_id))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch(self, task_id: str) -> None:
        next_index = 0
        while True:
            try:
                async for reply in self.stub.WatchTask(
                    rpb.WatchTaskRequest(task_id=task_id, from_result_index=next_index)
                ):
                    if not reply.HasField("session_result"):
                        continue
                    result = reply.session_result
                    self.received_at.setdefault(result.session_id, time.time())
                    self.deliveries[result.session_id] += 1
                    self.statuses[result.status] += 1
                    self.outstanding -= 1
                    next_index = reply.result_index + 1
                    self._seen.set()
                return
            except grpc.aio.AioRpcError as exc:  # a dropped stream resumes where it stopped, as a trainer does
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                await asyncio.sleep(0.5)

    async def closed_loop(self, prefix: str, active: int, group: int, window_s: float, workload: Workload) -> float:
        """Keep ``active`` sessions outstanding for ``window_s``; return when the ramp to ``active`` ended."""
        count = 0
        limit = asyncio.Semaphore(_SUBMITTERS)

        async def one() -> None:
            nonlocal count
            async with limit:
                count += 1
                await self.submit(f"{prefix}-{count:06d}", group, workload)

        await asyncio.gather(*(one() for _ in range(active // group)))
        ramped = time.time()
        end = time.monotonic() + window_s
        while time.monotonic() < end:
            self._seen.clear()
            free = active - self.outstanding
            if free >= group:
                await asyncio.gather(*(one() for _ in range(free // group)))
                continue
            try:
                await asyncio.wait_for(self._seen.wait(), max(0.0, end - time.monotonic()))
            except TimeoutError:
                break
        return ramped

    async def backlog(self, prefix: str, sessions: int, per_task: int, workload: Workload) -> None:
        """Submit ``sessions`` samples in tasks of ``per_task`` (a queue far beyond the fleet's capacity)."""
        limit = asyncio.Semaphore(_SUBMITTERS)

        async def one(k: int) -> None:
            async with limit:
                await self.submit(f"{prefix}-{k:06d}", per_task, workload)

        await asyncio.gather(*(one(k) for k in range(sessions // per_task)))

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every watched task ended; return whether that happened within ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while self._watchers:
            left = end - time.monotonic()
            if left <= 0:
                return False
            await asyncio.wait(list(self._watchers), timeout=left)
        return True

    async def close(self) -> None:
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
