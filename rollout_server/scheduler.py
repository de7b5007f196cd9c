"""Dispatching sessions onto gateways, watching deadlines and leases, and reconciling after a restart.

A dispatch turn reads the free capacity of every live gateway (capacity minus the sessions the store says are
starting or running there), takes that many due sessions in priority order, persists each assignment as
``starting`` in one transaction, and only then calls StartSession. A gateway that answers RESOURCE_EXHAUSTED
gets no sessions until its hinted delay has passed, and the refused session goes back to ``pending`` without
using up an attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import logging
from collections.abc import Sequence

from opentelemetry import context as otel_context
from opentelemetry import propagate

from polar_core.records import TerminalStatus
from rollout_server.core import RolloutCore
from rollout_server.errors import GatewayBusy, GatewayRejected, GatewaySessionUnknown, GatewayUnreachable
from rollout_server.models import (
    GatewayRecord,
    ResultRecord,
    SchedulerConfig,
    SessionRecord,
    SessionState,
    TaskRecord,
)
from rollout_server.ports import SessionDispatch

__all__ = ["Scheduler"]

_log = logging.getLogger(__name__)


class Scheduler:
    """The dispatch loop and the watchdog of one rollout server."""

    def __init__(self, core: RolloutCore, config: SchedulerConfig | None = None) -> None:
        self.core = core
        self.config = config or SchedulerConfig()
        self.busy_until: dict[str, float] = {}
        self._starts: set[asyncio.Task[None]] = set()
        self._specs: dict[str, TaskRecord] = {}
        self._last_static_refresh = float("-inf")

    # Dispatch --------------------------------------------------------------------------------------------
    async def _free_slots(self, now: float) -> dict[str, tuple[GatewayRecord, int]]:
        # Counted by the database: reading every in-flight row made each turn O(active sessions) in Python.
        counts = await self.core.store.in_flight_counts()
        free: dict[str, tuple[GatewayRecord, int]] = {}
        for g in await self.core.store.list_gateways():
            if g.draining or g.lease_expires_at <= now or self.busy_until.get(g.gateway_id, 0.0) > now:
                continue
            slots = g.capacity - counts.get(g.gateway_id, 0)
            if slots > 0:
                free[g.gateway_id] = (g, slots)
        return free

    async def _task_record(self, task_id: str) -> TaskRecord | None:
        task = self._specs.get(task_id)
        if task is None:
            task = await self.core.store.get_task(task_id)
            if task is not None:
                if len(self._specs) > 4096:
                    self._specs.clear()
                self._specs[task_id] = task
        return task

    async def dispatch_once(self) -> int:
        """Run one dispatch turn; return how many sessions were assigned (their StartSession calls run on)."""
        now = self.core.clock()
        free = await self._free_slots(now)
        total = sum(slots for _, slots in free.values())
        if total == 0:
            return 0
        due = await self.core.store.dispatchable_sessions(now, min(total, self.config.dispatch_batch))
        if not due:
            return 0
        heap = [(-slots, gid) for gid, (_, slots) in free.items()]
        heapq.heapify(heap)
        plan: list[tuple[SessionRecord, SessionRecord, GatewayRecord, TaskRecord]] = []
        for session in due:
            task = await self._task_record(session.task_id)
            if task is None or not heap:
                continue
            neg, gid = heapq.heappop(heap)
            if neg < -1:
                heapq.heappush(heap, (neg + 1, gid))
            started = dataclasses.replace(
                session,
                state=SessionState.STARTING,
                attempt=session.attempt + 1,
                gateway_id=gid,
                dispatched_at=now,
                deadline=now + task.session_timeout_s + self.core.config.session_grace_s,
            )
            plan.append((session, started, free[gid][0], task))
        applied = await self.core.store.update_sessions([(new, old.state, old.attempt) for old, new, _, _ in plan])
        accepted = [(new, gateway, task) for ok, (_, new, gateway, task) in zip(applied, plan, strict=True) if ok]
        if accepted:
            t = asyncio.create_task(self._start_batch(accepted))
            self._starts.add(t)
            t.add_done_callback(self._starts.discard)
        await self.core.mark_running({new.task_id for new, _, _ in accepted})
        return len(accepted)

    async def wait_for_starts(self) -> None:
        """Wait until every StartSession call launched so far has been answered (tests, benchmarks)."""
        while self._starts:
            await asyncio.gather(*list(self._starts), return_exceptions=True)

    async def _start_batch(self, batch: list[tuple[SessionRecord, GatewayRecord, TaskRecord]]) -> None:
        """Call StartSession for a turn's sessions concurrently, then persist the accepted ones as running at once."""
        accepted = await asyncio.gather(*(self._start(*item) for item in batch))
        running = [
            (dataclasses.replace(session, state=SessionState.RUNNING), SessionState.STARTING, session.attempt)
            for ok, (session, _, _) in zip(accepted, batch, strict=True)
            if ok
        ]
        # A fast gateway may have reported already: then the session is done and its update is a no-op.
        await self.core.store.update_sessions(running)

    async def _start(self, session: SessionRecord, gateway: GatewayRecord, task: TaskRecord) -> bool:
        """Call StartSession once; return whether the gateway accepted (failures are handled here)."""
        assert session.deadline is not None
        dispatch = SessionDispatch(
            session.session_id, session.task_id, session.sample_index, session.attempt, session.deadline, task.spec
        )
        # StartSession joins the trace of the task's SubmitTask call (the gRPC client span is its child).
        carrier = task.trace_context
        token = otel_context.attach(propagate.extract(carrier)) if carrier else None
        try:
            await self.core.gateways.start_session(gateway.address, dispatch)
        except GatewayBusy as exc:
            delay = exc.retry_after_s if exc.retry_after_s is not None else self.config.busy_backoff_s
            self.busy_until[gateway.gateway_id] = self.core.clock() + delay
            self.core.metrics.session_retried("gateway_busy")
            await self._unassign(session)
        except GatewayRejected as exc:
            if exc.draining:
                # A placement failure (draining, or this task cannot run there, e.g. its harness CLI is not
                # installed): the session waits for another gateway, or this one, without using an attempt.
                _log.warning("gateway %s refused session %s: %s", gateway.gateway_id, session.session_id, exc.message)
                self.busy_until[gateway.gateway_id] = self.core.clock() + self.core.config.heartbeat_interval_s
                self.core.metrics.session_retried("gateway_refused")
                await self._unassign(session)
            else:
                await self._attempt_failed(session, f"gateway {gateway.gateway_id} rejected the session: {exc.message}")
        except GatewayUnreachable as exc:
            self.busy_until[gateway.gateway_id] = self.core.clock() + self.config.busy_backoff_s
            await self._attempt_failed(session, f"gateway {gateway.gateway_id} unreachable: {exc.message}")
            with contextlib.suppress(GatewayUnreachable, GatewaySessionUnknown):
                await self.core.gateways.cancel_session(gateway.address, session.session_id, "start timed out")
        else:
            # Dispatchable since submission, or since its retry backoff ended.
            self.core.metrics.dispatched(self.core.clock() - max(task.submitted_at, session.not_before))
            return True
        finally:
            if token is not None:
                otel_context.detach(token)
        return False

    async def _unassign(self, session: SessionRecord) -> None:
        """Put a session the gateway never started back in the queue without using up an attempt."""
        back = dataclasses.replace(
            session,
            state=SessionState.PENDING,
            attempt=session.attempt - 1,
            gateway_id="",
            dispatched_at=None,
            deadline=None,
        )
        await self.core.store.update_sessions([(back, session.state, session.attempt)])
        self.core.dispatch_wakeup.set()

    async def _attempt_failed(
        self, session: SessionRecord, message: str, *, suffix: str = "lost", outage: bool = False
    ) -> None:
        """End the current attempt as ``infra_error`` (retried per policy; with ``outage``, not using an attempt)."""
        result = ResultRecord(
            session_id=session.session_id,
            task_id=session.task_id,
            sample_index=session.sample_index,
            status=TerminalStatus.INFRA_ERROR,
            reward=0.0,
            attempt=session.attempt,
            gateway_id=session.gateway_id,
            idempotency_key=f"{session.session_id}#{session.attempt}:{suffix}",
            error_message=message,
            dependency_unavailable=outage,
        )
        _log.warning("session %s attempt %d: %s", session.session_id, session.attempt, message)
        await self.core.apply_outcome(session, result)

    async def run_dispatch(self) -> None:
        """Dispatch forever: after every wakeup, and at least every ``dispatch_interval_s``."""
        while True:
            self.core.dispatch_wakeup.clear()
            try:
                launched = await self.dispatch_once()
            except Exception:
                _log.exception("dispatch turn failed; retrying")
                launched = 0
            if launched:
                continue
            now = self.core.clock()
            timeout = self.config.dispatch_interval_s
            upcoming = [t - now for t in self.busy_until.values() if t > now]
            if upcoming:
                timeout = min(timeout, min(upcoming))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.core.dispatch_wakeup.wait(), max(timeout, 0.001))

    # Watchdog and reconciliation -------------------------------------------------------------------------
    async def reconcile_session(self, session: SessionRecord) -> None:
        """Ask the session's gateway about an in-flight session and re-attach, record, or declare it lost."""
        gateway = await self.core.store.get_gateway(session.gateway_id)
        if gateway is None:
            await self._attempt_failed(session, f"gateway {session.gateway_id!r} is unknown")
            return
        try:
            view = await self.core.gateways.get_session(gateway.address, session.session_id)
        except GatewaySessionUnknown:
            if session.state is SessionState.STARTING:
                # The server stopped between persisting the assignment and learning the gateway's answer, so the
                # gateway may have accepted this attempt and lost it since: its number is never handed out again
                # (the gateway records each attempt into its own model-proxy session, and a result's idempotency
                # key names the attempt). A fresh attempt follows, not counted against ``max_attempts``.
                await self._attempt_failed(
                    session,
                    f"gateway {gateway.gateway_id} does not know the session, whose start a restart interrupted",
                    suffix="interrupted",
                    outage=True,
                )
            else:
                await self._attempt_failed(session, f"gateway {gateway.gateway_id} lost the session")
            return
        except GatewayUnreachable as exc:
            # A gateway whose lease lapsed too has left the pool (its node died, its job was cancelled): the
            # attempt went with it, which is no fault of the session, so it does not use up an attempt.
            gone = gateway.lease_expires_at <= self.core.clock()
            await self._attempt_failed(session, f"gateway {gateway.gateway_id} unreachable: {exc.message}", outage=gone)
            return
        if view.attempt != session.attempt:
            if session.state is SessionState.STARTING and view.attempt < session.attempt:
                await self._unassign(session)
            else:
                await self._attempt_failed(session, f"gateway {gateway.gateway_id} runs attempt {view.attempt}")
            return
        if view.done:
            if view.result is None:
                await self._attempt_failed(session, f"gateway {gateway.gateway_id} finished without a result")
                return
            result = view.result
            result.gateway_id = session.gateway_id
            result.task_id, result.sample_index = session.task_id, session.sample_index
            if not result.idempotency_key:
                result.idempotency_key = f"{session.session_id}#{session.attempt}"
            if not await self.core.store.find_report(result.idempotency_key):
                await self.core.apply_outcome(session, result)
            return
        if session.state is SessionState.STARTING:
            running = dataclasses.replace(session, state=SessionState.RUNNING)
            await self.core.store.update_sessions([(running, SessionState.STARTING, session.attempt)])

    async def reconcile(self) -> int:
        """Reconcile every in-flight session with its gateway (after a restart); return how many were checked."""
        sessions = await self.core.store.in_flight_sessions()
        await asyncio.gather(*(self.reconcile_session(s) for s in sessions))
        return len(sessions)

    async def refresh_static_gateways(self, addresses: Sequence[str]) -> None:
        """Read id and capacity of configured gateways with GetCapacity and renew their leases."""
        for address in addresses:
            try:
                view = await self.core.gateways.get_capacity(address)
            except GatewayUnreachable:
                _log.warning("configured gateway %s is unreachable", address)
                continue
            existing = await self.core.store.get_gateway(view.gateway_id or address)
            gateway = GatewayRecord(
                gateway_id=view.gateway_id or address,
                address=address,
                capacity=view.capacity,
                draining=view.draining or (existing is not None and existing.draining),
                lease_expires_at=self.core.clock() + self.core.config.lease_ttl_s,
                active_sessions=view.active_sessions,
                stage_metrics=view.stage_metrics,
            )
            await self.core.store.upsert_gateway(gateway)
        self.core.dispatch_wakeup.set()

    async def watchdog_once(self) -> None:
        """Expire tasks past their deadline, check overdue sessions and sessions on gateways whose lease lapsed."""
        now = self.core.clock()
        if self.config.static_gateways and now - self._last_static_refresh >= self.core.config.heartbeat_interval_s:
            self._last_static_refresh = now
            await self.refresh_static_gateways(self.config.static_gateways)
        for task in await self.core.store.active_tasks():
            if task.deadline <= now:
                await self.core.expire_task(task.task_id)
        gateways = {g.gateway_id: g for g in await self.core.store.list_gateways()}
        checks = []
        for session in await self.core.store.in_flight_sessions():
            gateway = gateways.get(session.gateway_id)
            overdue = session.deadline is not None and session.deadline + self.config.deadline_slack_s <= now
            lapsed = gateway is None or gateway.lease_expires_at <= now
            if overdue:
                checks.append(self._overdue(session))
            elif lapsed and session.state is SessionState.RUNNING:
                checks.append(self.reconcile_session(session))
        await asyncio.gather(*checks)

    async def _overdue(self, session: SessionRecord) -> None:
        """A session past its deadline: take its result if it has one, else stop it and retry per policy."""
        gateway = await self.core.store.get_gateway(session.gateway_id)
        if gateway is not None:
            with contextlib.suppress(GatewayUnreachable, GatewaySessionUnknown):
                view = await self.core.gateways.get_session(gateway.address, session.session_id)
                if view.done and view.result is not None and view.attempt == session.attempt:
                    await self.reconcile_session(session)
                    return
            with contextlib.suppress(GatewayUnreachable, GatewaySessionUnknown):
                await self.core.gateways.cancel_session(gateway.address, session.session_id, "deadline passed")
        await self._attempt_failed(session, "session overran its deadline", suffix="overdue")

    async def run_watchdog(self) -> None:
        """Run :meth:`watchdog_once` every ``watchdog_interval_s``."""
        while True:
            try:
                await self.watchdog_once()
            except Exception:
                _log.exception("watchdog turn failed; retrying")
            await asyncio.sleep(self.config.watchdog_interval_s)

    async def close(self) -> None:
        """Cancel the StartSession calls in flight; :meth:`reconcile` on the next start settles their sessions."""
        for t in list(self._starts):
            t.cancel()
        await asyncio.gather(*self._starts, return_exceptions=True)
