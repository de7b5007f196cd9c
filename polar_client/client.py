"""The trainer's client of the RolloutService."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc

from polar_client.policy import PauseModeName, PolicyUpdateResult, pause_mode_to_proto
from polar_client.taskfile import load_task, task_from_mapping
from polar_core.channels import open_channel
from polar_core.durations import duration
from polar_core.limits import DEFAULT_MAX_MESSAGE_BYTES, chunk_budget
from polar_core.tls import TlsFiles

__all__ = ["RolloutClient", "TaskLike"]

TaskLike = task_pb2.Task | Mapping[str, Any] | Path | str
_TERMINAL = frozenset(
    {status_pb2.TASK_STATUS_COMPLETED, status_pb2.TASK_STATUS_CANCELLED, status_pb2.TASK_STATUS_FAILED}
)
_RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL})


class RolloutClient:
    """Submit tasks to a rollout server and collect their session results.

    Use as an async context manager::

        async with RolloutClient("rollout:50051", token=TOKEN) as client:
            task_id = (await client.submit("TASK.yaml")).task_id
            async for result in client.watch(task_id):
                ...  # result.traces, result.reward, result.status, result.idempotency_key

    Errors are ``grpc.aio.AioRpcError`` with the server's status code (INVALID_ARGUMENT, NOT_FOUND,
    ALREADY_EXISTS, UNAUTHENTICATED, ...).

    Args:
        target: ``host:port`` of the RolloutService.
        token: The control-plane token (sent as ``authorization: Bearer <token>``).
        timeout_s: Deadline of each unary call.
        tracer_provider: Provider for client spans.
        tls: Client certificate and CA for mutual TLS; ``None`` for plaintext.
        max_message_bytes: The largest message the channel receives or sends (a task's results carry traces).
    """

    def __init__(
        self,
        target: str,
        *,
        token: str = "",
        timeout_s: float = 30.0,
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._channel = open_channel(
            target, tracer_provider=tracer_provider, auth_token=token, tls=tls, max_message_bytes=max_message_bytes
        )
        self._stub: rollout_service_pb2_grpc.RolloutServiceAsyncStub = rollout_service_pb2_grpc.RolloutServiceStub(
            self._channel
        )
        self._timeout = timeout_s
        self._chunk_bytes = chunk_budget(max_message_bytes)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)

    async def submit(self, task: TaskLike, *, task_timeout_s: float | None = None) -> pb.SubmitTaskResponse:
        """Submit a task (a Task message, a TASK.yaml mapping, or a path to one).

        Submitting the identical task with the same ``task_id`` again is safe: the response says
        ``already_existed``. Returns the task id (assigned by the server when the task had none) and its state.
        """
        message = (
            task
            if isinstance(task, task_pb2.Task)
            else (task_from_mapping(task) if isinstance(task, Mapping) else load_task(task))
        )
        request = pb.SubmitTaskRequest(task=message)
        if task_timeout_s:
            request.task_timeout.CopyFrom(duration(task_timeout_s))
        return await self._stub.SubmitTask(request, timeout=self._timeout)

    async def get(
        self,
        task_id: str,
        *,
        summary_only: bool = False,
        omit_traces: bool = False,
        from_index: int = 0,
        max_results: int = 0,
        max_page_bytes: int = 0,
        from_trace_index: int = 0,
        max_result_bytes: int = 0,
    ) -> pb.GetTaskResponse:
        """Return the task's state, statistics and (unless ``summary_only``) its finished session results.

        ``omit_traces`` leaves the traces out of every result; ``from_index``, ``max_results`` and
        ``max_page_bytes`` select one page (its ``next_result_index`` is the next page's ``from_index``, 0 after
        the last); with ``max_result_bytes`` a larger result is cut after the traces that fit and the page's
        ``next_trace_index`` is the next page's ``from_trace_index``; :meth:`results` pages through them all.
        """
        request = pb.GetTaskRequest(
            task_id=task_id,
            summary_only=summary_only,
            omit_traces=omit_traces,
            from_result_index=from_index,
            max_results=max_results,
            max_page_bytes=max_page_bytes,
            from_trace_index=from_trace_index,
            max_result_bytes=max_result_bytes,
        )
        return await self._stub.GetTask(request, timeout=self._timeout)

    async def results(
        self, task_id: str, *, omit_traces: bool = False, max_page_bytes: int | None = None
    ) -> AsyncIterator[session_pb2.SessionResult]:
        """Yield the task's finished session results, read with GetTask in pages of about ``max_page_bytes``.

        The default budget is half the channel's message limit (at most 4 MiB). A result larger than the budget
        comes in several pages and is yielded once, whole.
        """
        budget = self._chunk_bytes if max_page_bytes is None else max_page_bytes
        index, trace = 0, 0
        partial: session_pb2.SessionResult | None = None
        while True:
            reply = await self.get(
                task_id,
                omit_traces=omit_traces,
                from_index=index,
                max_page_bytes=budget,
                from_trace_index=trace,
                max_result_bytes=budget,
            )
            results = list(reply.session_results)
            if partial is not None and results:
                partial.traces.extend(results[0].traces)
                results[0], partial = partial, None
            if reply.next_trace_index and results:
                partial = results.pop()
            for result in results:
                yield result
            if not reply.next_result_index and not reply.next_trace_index:
                return
            index, trace = reply.next_result_index, reply.next_trace_index

    async def list(self, *, page_size: int = 50, page_token: str = "") -> pb.ListTasksResponse:
        """Return a page of tasks, newest first."""
        return await self._stub.ListTasks(
            pb.ListTasksRequest(page_size=page_size, page_token=page_token), timeout=self._timeout
        )

    async def cancel(self, task_id: str, reason: str = "") -> pb.TaskInfo:
        """Cancel a task; its unfinished sessions end ``cancelled``."""
        reply = await self._stub.CancelTask(pb.CancelTaskRequest(task_id=task_id, reason=reason), timeout=self._timeout)
        return reply.task

    async def watch(
        self, task_id: str, *, from_index: int = 0, reconnect: bool = True, omit_traces: bool = False
    ) -> AsyncIterator[session_pb2.SessionResult]:
        """Yield the task's session results as they finish (finished ones first), until the task is terminal.

        With ``reconnect``, a dropped stream is resumed from the next result index, so no result is seen twice
        or missed. ``omit_traces`` leaves the traces out of every result. A result larger than half the channel's
        message limit arrives in several messages and is yielded once, whole.
        """
        next_index = from_index
        while True:
            try:
                request = pb.WatchTaskRequest(
                    task_id=task_id,
                    from_result_index=next_index,
                    omit_traces=omit_traces,
                    max_result_bytes=self._chunk_bytes,
                )
                stream = self._stub.WatchTask(request)
                partial: session_pb2.SessionResult | None = None
                async for event in stream:
                    if not event.HasField("session_result"):
                        continue
                    if partial is not None and event.first_trace_index:
                        partial.traces.extend(event.session_result.traces)
                    else:
                        partial = event.session_result
                    if event.result_continues:
                        continue
                    next_index = event.result_index + 1
                    result, partial = partial, None
                    yield result
                return
            except grpc.aio.AioRpcError as exc:
                if not reconnect or exc.code() not in _RESUMABLE:
                    raise
                await asyncio.sleep(0.5)

    async def wait(self, task_id: str, *, poll_s: float = 1.0) -> pb.TaskInfo:
        """Poll until the task is terminal and return its final state."""
        while True:
            info = (await self.get(task_id, summary_only=True)).task
            if info.status in _TERMINAL:
                return info
            await asyncio.sleep(poll_s)

    async def update_policy(
        self,
        version: int,
        weights_path: str | Path = "",
        *,
        pause_mode: PauseModeName = "drain",
        drain_timeout_s: float | None = None,
        timeout_s: float | None = None,
        weights_synced: bool = False,
    ) -> PolicyUpdateResult:
        """Move every model proxy of the fleet to policy ``version`` served from the checkpoint ``weights_path``.

        With ``weights_synced=True`` (and no path) the trainer has already pushed the weights into the inference
        servers the proxies use as backends (verl, slime: their own servers, synced outside Polar): every proxy
        is paused, stamps ``version`` on the calls it records from then on, and resumes; nothing is loaded.

        ``pause_mode="drain"`` lets calls in flight finish on the old weights (for up to ``drain_timeout_s``,
        default the server's); ``"abort"`` cuts them (the harness gets its provider's retryable error). Safe to
        repeat: the same version and weights return the stored outcome (``replayed``), after retrying proxies
        that had failed. The call waits for the whole update unless ``timeout_s`` is given; the update goes on
        when the caller goes away, so calling again with the same version picks up its outcome.

        Raises:
            grpc.aio.AioRpcError: INVALID_ARGUMENT (version < 1, an empty path without ``weights_synced`` or a
                path with it), FAILED_PRECONDITION (version not above the current one, no proxy registered,
                checkpoint rejected before anything was paused), ALREADY_EXISTS (version applied with other
                weights), ABORTED (another version's update runs).
            ValueError: An unknown ``pause_mode``.
        """
        request = pb.UpdatePolicyRequest(
            version=version,
            weights_path=str(weights_path),
            pause_mode=pause_mode_to_proto(pause_mode),
            weights_synced=weights_synced,
        )
        if drain_timeout_s is not None:
            request.drain_timeout.CopyFrom(duration(drain_timeout_s))
        reply = await self._stub.UpdatePolicy(request, timeout=timeout_s)
        return PolicyUpdateResult.from_proto(reply)

    async def get_policy(self) -> pb.GetPolicyResponse:
        """Return the fleet's current policy (version 0 before the first update) and every proxy's state."""
        return await self._stub.GetPolicy(pb.GetPolicyRequest(), timeout=self._timeout)
