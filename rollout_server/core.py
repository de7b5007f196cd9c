"""The rollout server's domain: tasks in, session outcomes applied, tasks settled. No gRPC here.

:class:`RolloutCore` owns the task and session state machines. Every change is written to the store (with a
compare-and-set on the state it was read in) *before* anything acts on it, so after a crash the store alone says
what to do next; :meth:`RolloutCore.recover` (with the scheduler's reconciliation) picks up from there.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from opentelemetry import propagate

from polar_core.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from polar_core.records import TerminalStatus
from polar_core.version import check_same_version
from rollout_server.errors import GatewaySessionUnknown, GatewayUnreachable, StaleAttempt
from rollout_server.metrics import RolloutMetrics
from rollout_server.models import (
    CoreConfig,
    DeliveryRecord,
    GatewayRecord,
    NewTask,
    ResultRecord,
    SessionRecord,
    SessionState,
    TaskRecord,
    TaskState,
)
from rollout_server.outcome import RetryReason, RetrySession, decide_outcome
from rollout_server.ports import CurrentPolicyVersion, GatewayClient
from rollout_server.staleness import StaleDecision, StoreCurrentPolicyVersion
from rollout_server.stats import TaskSummary, summarize
from rollout_server.store import Store

__all__ = ["RolloutCore", "TaskPage"]

_log = logging.getLogger(__name__)
_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_MAX_PAGE = 1000
_DEFAULT_PAGE = 50
# Results a watcher reads from the store at a time: a stream holds a batch in memory, not a whole task.
_WATCH_BATCH = 8
# Reads of a session a report may take: the one concurrent change to an in-flight attempt (starting -> running)
# happens once, so a third read only guards against a writer this module does not know of.
_REPORT_READS = 3


@dataclasses.dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of tasks."""

    tasks: list[TaskSummary]
    next_page_token: str


def session_id_for(task_id: str, sample_index: int) -> str:
    """Return the id of sample ``sample_index`` of ``task_id`` (stable across attempts and restarts)."""
    return f"{task_id}-{sample_index:04d}"


def default_result_key(session_id: str, attempt: int) -> str:
    """The idempotency key of an attempt's result when the gateway sent none."""
    return f"{session_id}#{attempt}"


class _Notifier:
    """Wakes watchers of a task; an event per watched task, replaced on every notification."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def event(self, task_id: str) -> asyncio.Event:
        return self._events.setdefault(task_id, asyncio.Event())

    def notify(self, task_id: str) -> None:
        event = self._events.pop(task_id, None)
        if event is not None:
            event.set()


class RolloutCore:
    """Tasks, sessions and gateways, as the RolloutService's RPCs and the background loops see them."""

    def __init__(
        self,
        store: Store,
        gateways: GatewayClient,
        config: CoreConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        current_policy: CurrentPolicyVersion | None = None,
        task_check: Callable[[bytes], None] | None = None,
        metrics: RolloutMetrics | None = None,
    ) -> None:
        self._task_check = task_check
        self.metrics = metrics or RolloutMetrics()
        self.store = store
        self.gateways = gateways
        self.config = config or CoreConfig()
        self.clock = clock
        self.current_policy = current_policy or StoreCurrentPolicyVersion(store)
        self.dispatch_wakeup = asyncio.Event()
        self.delivery_wakeup = asyncio.Event()
        self._notifier = _Notifier()
        self._task_locks: dict[str, asyncio.Lock] = {}
        self._pending_cancels: dict[str, set[str]] = {}
        self._background: set[asyncio.Task[None]] = set()

    # Tasks -----------------------------------------------------------------------------------------------
    async def submit_task(self, new: NewTask) -> tuple[TaskSummary, bool]:
        """Store a task and its sessions, or return the identical task submitted before.

        Returns:
            The task's summary and whether it already existed.

        Raises:
            InvalidArgument: Malformed task, or one the operator's policy refuses (``task_check``).
            AlreadyExists: The id is taken by a different task.
            ResourceExhausted: Too many active tasks.
        """
        if not _TASK_ID.match(new.task_id):
            raise InvalidArgument(
                "task_id must be 1-128 characters of letters, digits, '_', '.', ':' or '-'",
                details={"task_id": new.task_id[:200]},
            )
        if new.num_samples < 1:
            raise InvalidArgument("num_samples must be at least 1", details={"task_id": new.task_id})
        if new.early_stop_min_usable < 0 or new.early_stop_min_usable > new.num_samples:
            raise InvalidArgument("early_stop_min_usable_sessions must be between 0 and num_samples")
        if self._task_check is not None:
            self._task_check(new.spec)  # the operator's policy: paths under the task roots, no wider sandbox
        existing = await self.store.get_task(new.task_id)
        if existing is None:
            # Counted by the database: reading every active task (with its spec) made each submit O(active tasks).
            if await self.store.count_active_tasks() >= self.config.max_active_tasks:
                raise ResourceExhausted("too many active tasks; retry later", retry_after_s=5.0)
            now = self.clock()
            timeout = new.task_timeout_s or self.config.task_timeout_s
            # Stored with the task, so its sessions join the submitter's trace even after a restart.
            trace_context: dict[str, str] = {}
            propagate.inject(trace_context)
            record = TaskRecord(
                task_id=new.task_id,
                spec=new.spec,
                spec_hash=new.spec_hash,
                num_samples=new.num_samples,
                priority=new.priority,
                early_stop_min_usable=new.early_stop_min_usable,
                session_timeout_s=new.session_timeout_s,
                callback=new.callback,
                state=TaskState.PENDING,
                submitted_at=now,
                deadline=now + timeout,
                trace_context=trace_context,
                max_policy_lag=self.config.default_max_policy_lag if new.max_policy_lag is None else new.max_policy_lag,
                stale_policy=new.stale_policy or self.config.default_stale_policy,
            )
            sessions = [
                SessionRecord(session_id_for(new.task_id, i), new.task_id, i, priority=new.priority)
                for i in range(new.num_samples)
            ]
            stored, created = await self.store.insert_task(record, sessions)
            if created:
                self.dispatch_wakeup.set()
                return await self.summary(stored), False
            existing = stored
        if existing.spec_hash != new.spec_hash:
            raise AlreadyExists(f"task {new.task_id!r} exists with different content", details={"task_id": new.task_id})
        return await self.summary(existing), True

    async def _task(self, task_id: str) -> TaskRecord:
        if not task_id:
            raise InvalidArgument("task_id is required")
        task = await self.store.get_task(task_id)
        if task is None:
            raise NotFound(f"unknown task {task_id!r}", details={"task_id": task_id})
        return task

    async def summary(self, task: TaskRecord) -> TaskSummary:
        """Return a task's progress and statistics."""
        sessions = await self.store.task_sessions(task.task_id)
        results = await self.store.task_results(task.task_id, payload=False)
        versions = await self.store.policy_versions() if any(r.policy_versions for r in results) else []
        deliveries = await self.store.delivery_counts(task.task_id) if task.callback else {}
        return summarize(task, sessions, results, versions, deliveries)

    async def get_task(
        self, task_id: str, *, with_results: bool = True, from_index: int = 0, limit: int = 0
    ) -> tuple[TaskSummary, list[ResultRecord]]:
        """Return a task's summary and (unless ``with_results`` is false) its results from ``from_index`` on,
        in completion order, at most ``limit`` of them unless it is 0."""
        task = await self._task(task_id)
        results = await self.store.task_results(task_id, max(0, from_index), limit=limit) if with_results else []
        return await self.summary(task), results

    async def list_tasks(self, page_size: int, page_token: str, state: TaskState | None) -> TaskPage:
        """Return a page of tasks, newest first."""
        size = _DEFAULT_PAGE if page_size <= 0 else min(page_size, _MAX_PAGE)
        before: int | None = None
        if page_token:
            try:
                before = int(base64.urlsafe_b64decode(page_token.encode()).decode().removeprefix("seq:"))
            except (ValueError, binascii.Error, UnicodeDecodeError):
                raise InvalidArgument("malformed page_token") from None
        tasks = await self.store.list_tasks(size + 1, before, state)
        more = len(tasks) > size
        tasks = tasks[:size]
        token = base64.urlsafe_b64encode(f"seq:{tasks[-1].seq}".encode()).decode() if more else ""
        return TaskPage([await self.summary(t) for t in tasks], token)

    async def watch_task(
        self, task_id: str, from_index: int = 0
    ) -> AsyncIterator[tuple[ResultRecord | None, TaskSummary]]:
        """Yield the task's results from ``from_index`` on as they finish; end when the task is terminal.

        Already-finished results are replayed first. Each item carries the task's summary after it. A task that
        is terminal with nothing left to send yields one final ``(None, summary)``.
        """
        task = await self._task(task_id)
        next_index = max(0, from_index)
        while True:
            event = self._notifier.event(task_id)
            task = await self._task(task_id)
            results = await self.store.task_results(task_id, next_index, limit=_WATCH_BATCH)
            if results:
                summary = await self.summary(task)
                for r in results:
                    yield r, summary
                next_index = results[-1].result_index + 1
                continue
            if task.state.terminal:
                yield None, await self.summary(task)
                return
            # The timeout makes a watcher poll too: another host may have recorded a result.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), self.config.watch_poll_s)

    async def cancel_task(self, task_id: str, reason: str) -> TaskSummary:
        """Cancel a task: its unfinished sessions end ``cancelled``; a terminal task is returned unchanged."""
        task = await self._task(task_id)
        if not task.state.terminal:
            async with self._lock(task_id):
                task = await self._task(task_id)
                if not task.state.terminal:
                    await self._finish_unfinished(task, f"task cancelled: {reason or 'no reason given'}")
                    await self._set_task_state(task, TaskState.CANCELLED, reason)
        return await self.summary(await self._task(task_id))

    # Gateways --------------------------------------------------------------------------------------------
    async def register_gateway(self, gateway: GatewayRecord) -> GatewayRecord:
        """Add a gateway to the pool or refresh it (a re-registration clears draining)."""
        if not gateway.gateway_id or not gateway.address:
            raise InvalidArgument("gateway_id and address are required")
        if gateway.capacity < 0:
            raise InvalidArgument("capacity must not be negative")
        check_same_version(f"gateway {gateway.gateway_id}", gateway.version, self.config.server_version)
        gateway.lease_expires_at = self.clock() + self.config.lease_ttl_s
        await self.store.upsert_gateway(gateway)
        self.dispatch_wakeup.set()
        return gateway

    async def heartbeat(
        self,
        gateway_id: str,
        *,
        capacity: int,
        active_sessions: int,
        draining: bool,
        stage_metrics: dict[str, dict[str, int]],
    ) -> tuple[bool, list[str]]:
        """Renew a gateway's lease and record its load.

        Returns:
            Whether the server wants it to drain, and sessions it should stop.
        """
        gateway = await self.store.get_gateway(gateway_id)
        if gateway is None:
            raise NotFound(
                f"gateway {gateway_id!r} is not registered; register again", details={"gateway_id": gateway_id}
            )
        gateway.capacity = max(0, capacity)
        gateway.active_sessions = active_sessions
        gateway.draining = gateway.draining or draining
        gateway.stage_metrics = stage_metrics
        gateway.lease_expires_at = self.clock() + self.config.lease_ttl_s
        await self.store.upsert_gateway(gateway)
        self.dispatch_wakeup.set()
        return gateway.draining, sorted(self._pending_cancels.pop(gateway_id, set()))

    async def list_gateways(self) -> tuple[list[GatewayRecord], float]:
        """Every gateway of the pool, in id order, and the time of the reading (to judge their leases by)."""
        now = self.clock()
        return sorted(await self.store.list_gateways(), key=lambda g: g.gateway_id), now

    async def drain_gateway(self, gateway_id: str) -> int:
        """Stop scheduling onto a gateway; return how many sessions it still runs for us."""
        gateway = await self.store.get_gateway(gateway_id)
        if gateway is None:
            raise NotFound(f"unknown gateway {gateway_id!r}", details={"gateway_id": gateway_id})
        gateway.draining = True
        await self.store.upsert_gateway(gateway)
        return sum(1 for s in await self.store.in_flight_sessions() if s.gateway_id == gateway_id)

    # Results ---------------------------------------------------------------------------------------------
    async def report_result(self, result: ResultRecord) -> bool:
        """Apply a result a gateway reported; return whether it was a duplicate.

        The session is read, checked and written conditionally on the state read. The one change another writer
        makes to the same in-flight attempt is the dispatcher's ``starting`` -> ``running`` after StartSession,
        which a fast gateway's report can race: then the session is read again and the report applied to it.

        Raises:
            NotFound: Unknown session.
            StaleAttempt: The result is for an attempt that is no longer current, or the session has finished.
            PermissionDenied: The session's current attempt was not given to the reporting gateway.
        """
        if not result.idempotency_key:
            result.idempotency_key = default_result_key(result.session_id, result.attempt)
        for _ in range(_REPORT_READS):
            session = await self.store.get_session(result.session_id)
            if session is None:
                raise NotFound(f"unknown session {result.session_id!r}", details={"session_id": result.session_id})
            if await self.store.find_report(result.idempotency_key):
                return True
            if result.attempt < session.attempt:
                raise StaleAttempt(
                    f"session {session.session_id} is on attempt {session.attempt}, not {result.attempt}",
                    details={"session_id": session.session_id},
                )
            if result.gateway_id != session.gateway_id or result.attempt != session.attempt:
                raise PermissionDenied(
                    f"session {session.session_id} attempt {result.attempt} was not given to gateway "
                    f"{result.gateway_id!r}",
                    details={"session_id": session.session_id},
                )
            if not session.state.in_flight:
                raise StaleAttempt(
                    f"session {session.session_id} already finished", details={"session_id": session.session_id}
                )
            result.task_id = session.task_id
            result.sample_index = session.sample_index
            if await self.apply_outcome(session, result):
                return False
            # Lost a race with another writer: read again (a cancellation or a second report ends the loop above).
        if await self.store.find_report(result.idempotency_key):
            return True
        raise StaleAttempt(f"session {result.session_id} moved on while its result was recorded")

    async def apply_outcome(self, session: SessionRecord, result: ResultRecord) -> bool:
        """Apply an attempt's result to a session read in ``session``'s state: retry, resample or finish.

        The decision is :func:`rollout_server.outcome.decide_outcome` (only ``infra_error`` is retried; a
        result beyond its task's ``max_policy_lag`` is kept, resampled or dropped; outages and resamples use up
        no attempt). This step reads its inputs, writes the decision in one transaction conditional on the
        session's state as read (persist before act), and only then wakes the dispatcher, the deliverer and
        watchers.

        Returns:
            ``False`` when the session had moved on (nothing was changed).
        """
        now = self.clock()
        task = await self.store.get_task(session.task_id)
        current = await self.current_policy.current_version() if result.policy_versions else 0
        outcome = decide_outcome(
            session,
            result,
            task,
            current_version=current,
            now=now,
            max_attempts=self.config.max_attempts,
            retry_backoff_s=self.config.retry_backoff_s,
        )
        change = (outcome.session, session.state, session.attempt)
        if isinstance(outcome, RetrySession):
            if not await self.store.record_attempt(outcome.result, change):
                return False
            self.metrics.session_retried(outcome.reason.value)
            _log_retry(session, outcome)
            self.dispatch_wakeup.set()
            return True
        if outcome.staleness is not StaleDecision.FRESH:
            _log.info(
                "session %s attempt %d: policy lag %d beyond the bound: %s",
                session.session_id,
                session.attempt,
                outcome.result.policy_lag,
                outcome.staleness.value,
            )
        if await self.store.record_result(outcome.result, change, outcome.delivery) is None:
            return False
        self.metrics.session_finished(outcome.result)
        self._notifier.notify(session.task_id)
        if outcome.delivery is not None:
            self.delivery_wakeup.set()
        if session.state.in_flight:
            self.dispatch_wakeup.set()  # a slot freed up
        if outcome.settle_task:
            self._spawn(self.settle_task(session.task_id))
        return True

    # Settling --------------------------------------------------------------------------------------------
    async def mark_running(self, task_ids: set[str]) -> None:
        """Move tasks whose first session was dispatched from pending to running."""
        for task_id in task_ids:
            task = await self.store.get_task(task_id)
            if task is not None and task.state is TaskState.PENDING:
                await self._set_task_state(task, TaskState.RUNNING, "")

    def _lock(self, task_id: str) -> asyncio.Lock:
        return self._task_locks.setdefault(task_id, asyncio.Lock())

    async def settle_task(self, task_id: str) -> None:
        """Move a task on once its sessions allow: start it, complete it, or stop it early."""
        async with self._lock(task_id):
            task = await self.store.get_task(task_id)
            if task is None or task.state.terminal:
                self._task_locks.pop(task_id, None)
                return
            sessions = await self.store.task_sessions(task_id)
            if all(s.state is SessionState.DONE for s in sessions):
                await self._set_task_state(task, TaskState.COMPLETED, "")
                return
            if task.early_stop_min_usable > 0:
                results = await self.store.task_results(task_id, payload=False)
                usable = sum(1 for r in results if r.status.trainable)
                if usable >= task.early_stop_min_usable:
                    await self._finish_unfinished(task, f"early stop: {usable} usable sessions")
                    await self._set_task_state(task, TaskState.COMPLETED, "")
                    return
            if task.state is TaskState.PENDING and any(s.attempt > 0 for s in sessions):
                await self._set_task_state(task, TaskState.RUNNING, "")

    async def expire_task(self, task_id: str) -> None:
        """End a task whose deadline passed: unfinished sessions are cancelled, the task completes."""
        async with self._lock(task_id):
            task = await self.store.get_task(task_id)
            if task is None or task.state.terminal:
                return
            unfinished = await self._finish_unfinished(task, "task deadline passed")
            message = f"task deadline passed; {unfinished} unfinished sessions cancelled" if unfinished else ""
            await self._set_task_state(task, TaskState.COMPLETED, message)

    async def _set_task_state(self, task: TaskRecord, new: TaskState, message: str) -> None:
        finished = self.clock() if new.terminal else None
        if await self.store.set_task_state(task.task_id, task.state, new, finished_at=finished, error_message=message):
            task.state = new
            self._notifier.notify(task.task_id)
            if new.terminal:
                self._task_locks.pop(task.task_id, None)

    async def _finish_unfinished(self, task: TaskRecord, reason: str) -> int:
        """Give every unfinished session of ``task`` a ``cancelled`` result, then stop it on its gateway."""
        count = 0
        for _ in range(5):  # re-read after losing a race with a concurrent report
            pending = [s for s in await self.store.task_sessions(task.task_id) if s.state is not SessionState.DONE]
            if not pending:
                break
            for session in pending:
                result = ResultRecord(
                    session_id=session.session_id,
                    task_id=task.task_id,
                    sample_index=session.sample_index,
                    status=TerminalStatus.CANCELLED,
                    reward=0.0,
                    attempt=session.attempt,
                    gateway_id="",
                    idempotency_key=f"{session.session_id}#{session.attempt}:cancelled",
                    error_message=reason,
                    recorded_at=self.clock(),
                )
                done = dataclasses.replace(session, state=SessionState.DONE)
                delivery = None
                if task.callback is not None:
                    delivery = DeliveryRecord(result.idempotency_key, task.task_id, session.session_id, task.callback)
                    delivery.next_attempt_at = self.clock()
                recorded = await self.store.record_result(result, (done, session.state, session.attempt), delivery)
                if recorded is None:
                    continue
                self.metrics.session_finished(result)
                count += 1
                if session.state.in_flight and session.gateway_id:
                    self._spawn(self._cancel_on_gateway(session, reason))
        self._notifier.notify(task.task_id)
        self.delivery_wakeup.set()
        self.dispatch_wakeup.set()
        return count

    async def _cancel_on_gateway(self, session: SessionRecord, reason: str) -> None:
        gateway = await self.store.get_gateway(session.gateway_id)
        if gateway is None:
            return
        try:
            await self.gateways.cancel_session(gateway.address, session.session_id, reason)
        except GatewaySessionUnknown:
            pass  # never started or already forgotten: nothing to stop
        except GatewayUnreachable:
            # Ask again through the gateway's next heartbeat.
            self._pending_cancels.setdefault(session.gateway_id, set()).add(session.session_id)

    # Background helpers ----------------------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("background step failed", exc_info=task.exception())

    async def recover(self) -> None:
        """Settle every active task once (finishes steps a crash interrupted between two writes)."""
        for task in await self.store.active_tasks():
            await self.settle_task(task.task_id)

    async def close(self) -> None:
        """Cancel background steps."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


def _log_retry(session: SessionRecord, outcome: RetrySession) -> None:
    """Say why a session goes back to the queue."""
    if outcome.reason is RetryReason.STALE_POLICY:
        _log.info(
            "session %s attempt %d: policy lag %d is beyond the bound, sampling again",
            session.session_id,
            session.attempt,
            outcome.result.policy_lag,
        )
        return
    _log.info(
        "session %s attempt %d: %s, retrying: %s",
        session.session_id,
        session.attempt,
        "a dependency was unreachable" if outcome.reason is RetryReason.DEPENDENCY_UNAVAILABLE else "infra_error",
        outcome.result.error_message,
    )
