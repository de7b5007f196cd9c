"""The session pipeline: a plain-async engine that runs sessions through staged pools.

Every session is driven by one coroutine through an explicit state machine (:data:`gateway.models.TRANSITIONS`)::

    INIT ──► READY ──► RUNNING ──► POSTRUN ──► DONE(terminal status)
      └────────┴──────────────────────►┘   (failure or cancellation before the agent ends)

Each stage has its own pool of slots (:class:`gateway.pools.StagePool`): INIT creates the runtime, opens the
proxy session and prepares the harness (waiting sessions are served by task priority); READY is a bounded
buffer of prepared runtimes (a prepared session keeps its INIT slot while READY is full); RUNNING holds the
scarce slots in which harnesses run; POSTRUN collects completions, evaluates, reconstructs and reports. A
session's deadline bounds everything from INIT; the agent budget runs from RUNNING. Every side effect is an
idempotent step with its own time limit, retried when its dependency is UNAVAILABLE. Cancellation interrupts
whatever phase runs, frees its slot, and the session still tears down and reports ``cancelled``.

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from gateway.errors import (
    GatewayBusy,
    GatewayDraining,
    SessionConflict,
    SessionDeadlinePassed,
    SessionNotFound,
    StepTimedOut,
)
from gateway.events import EventBus, Subscription
from gateway.metrics import GatewayMetrics
from gateway.models import (
    TRANSITIONS,
    AgentRun,
    Evaluation,
    Reconstruction,
    SessionEvent,
    SessionResult,
    SessionSpec,
    SessionState,
    Stage,
    completion_totals,
)
from gateway.pools import Slot, StagePool, StageSnapshot
from gateway.ports import (
    AgentRunner,
    EvaluatorClient,
    PreparedAgent,
    ProxyClient,
    ReconstructorClient,
    ResultSink,
    RuntimeFactory,
)
from gateway.settings import GatewaySettings
from polar_core.errors import DeadlineExceeded, Internal, PolarError, Unavailable
from polar_core.records import AgentStatus, CompletionRecord, TerminalStatus
from runtimes.base import Runtime

__all__ = ["Capacity", "SessionPipeline"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
# Extra time a harness gets past its budget to be killed and reaped before the pipeline stops waiting.
_KILL_GRACE_S = 10.0
_STAGES = (Stage.INIT, Stage.READY, Stage.RUNNING, Stage.POSTRUN)


@dataclasses.dataclass(frozen=True, slots=True)
class Capacity:
    """The gateway's capacity and load.

    Attributes:
        capacity: Sessions accepted at once.
        active: Sessions accepted and not done.
        available: Further sessions StartSession would accept now.
        stages: Load of each stage's pool.
        draining: Whether new sessions are refused.
    """

    gateway_id: str
    capacity: int
    active: int
    available: int
    stages: list[StageSnapshot]
    draining: bool


@dataclasses.dataclass(eq=False)
class _Session:
    """The mutable record of one session; only the pipeline touches it."""

    spec: SessionSpec
    deadline: float
    admitted_at: float
    stage: Stage = Stage.INIT
    stage_entered_at: float = 0.0
    queued: bool = True
    status: TerminalStatus | None = None
    reward: float = 0.0
    error: str = ""
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    driver: asyncio.Task[None] | None = None
    work: asyncio.Task[None] | None = None
    cancel_requested: bool = False
    cancel_reason: str = ""
    runtime: Runtime | None = None
    runtime_stopped: bool = False
    prepared: PreparedAgent | None = None
    proxy_open: bool = False
    proxy_used: bool = False
    listed: bool = False
    agent_run: AgentRun | None = None
    prewarm: asyncio.Task[str] | None = None
    eval_handle: str = ""
    completions: list[CompletionRecord] = dataclasses.field(default_factory=list)
    reconstruction: Reconstruction | None = None
    result: SessionResult | None = None
    trace_context: otel_context.Context | None = None
    stage_span: trace.Span | None = None


class SessionPipeline:
    """Runs sessions through the staged pools; the GatewayService's servicer is a thin layer over it.

    Args:
        settings: Worker counts, bounds and time limits.
        gateway_id: This gateway's id, written on states and results.
        runtimes: Creates each session's runtime.
        agents: Prepares and runs harnesses in runtimes.
        proxy: The model proxy's session management.
        reconstructor: Builds traces; ``None`` reports results without traces.
        evaluator: Scores work; ``None`` fails sessions whose task asks for an evaluator (infra_error).
        sink: Receives every result; ``None`` keeps results only for GetSession and watchers.
        metrics: Records stage metrics; ``None`` records nothing.
        clock: Unix time, for deadlines and timestamps.
        tracer: Makes one span per stage of each session, children of the context StartSession ran in; every
            side effect (proxy, evaluator, reconstructor calls) runs inside its stage's span.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        gateway_id: str,
        runtimes: RuntimeFactory,
        agents: AgentRunner,
        proxy: ProxyClient,
        reconstructor: ReconstructorClient | None = None,
        evaluator: EvaluatorClient | None = None,
        sink: ResultSink | None = None,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.time,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._tracer = tracer or trace.get_tracer("gateway")
        self._settings = settings
        self.gateway_id = gateway_id
        self._runtimes = runtimes
        self._agents = agents
        self._proxy = proxy
        self._reconstructor = reconstructor
        self._evaluator = evaluator
        self._sink = sink
        self._metrics = metrics
        self._clock = clock
        workers = {
            Stage.INIT: settings.init_workers,
            Stage.READY: settings.ready_capacity,
            Stage.RUNNING: settings.running_workers,
            Stage.POSTRUN: settings.postrun_workers,
        }
        self._pools = {stage: StagePool(stage, n, observer=metrics) for stage, n in workers.items()}
        if metrics is not None:
            metrics.bind(self.stage_snapshots)
        self._sessions: dict[str, _Session] = {}
        self._done_order: collections.deque[str] = collections.deque()
        self._bus = EventBus(settings.watch_buffer)
        self._draining = False
        self._mean_session_s = 0.0

    # ----------------------------------------------------------------------------------------- public API

    async def start_session(self, spec: SessionSpec) -> tuple[SessionState, bool]:
        """Accept ``spec`` and start running it in the background.

        Returns:
            The session's state and whether this (session_id, attempt) had already been accepted.

        Raises:
            InvalidArgument: The harness is unknown, or its options or the runtime table are malformed.
            SessionConflict: The session runs with a different attempt.
            GatewayDraining: The gateway accepts no new sessions.
            GatewayBusy: The gateway is full or POSTRUN is backed up (with a retry delay).
        """
        existing = self._sessions.get(spec.session_id)
        if existing is not None:
            if existing.spec.attempt == spec.attempt:
                return self._state(existing), True
            if existing.stage is not Stage.DONE:
                raise SessionConflict(
                    f"session {spec.session_id} is running attempt {existing.spec.attempt}",
                    details={"session_id": spec.session_id, "attempt": str(existing.spec.attempt)},
                )
        if self._draining:
            raise GatewayDraining("the gateway is draining and accepts no new sessions")
        self._agents.validate(spec)
        self._runtimes.validate(spec)
        self._admit_or_refuse()
        now = self._clock()
        deadline = spec.deadline if spec.deadline is not None else now + self._settings.session_timeout_s
        session = _Session(spec=spec, deadline=deadline, admitted_at=now, stage_entered_at=now)
        session.trace_context = otel_context.get_current()
        self._start_stage_span(session)
        if existing is not None:
            self._forget(spec.session_id)
        self._sessions[spec.session_id] = session
        self._publish(session, previous=None)
        session.driver = asyncio.create_task(self._drive(session), name=f"session-{spec.session_id}")
        return self._state(session), False

    def get_session(self, session_id: str) -> tuple[SessionState, SessionResult | None]:
        """Return a session's state and, once done, its result.

        Raises:
            SessionNotFound: The session is unknown.
        """
        session = self._get(session_id)
        return self._state(session), session.result

    def cancel_session(self, session_id: str, reason: str = "") -> SessionState:
        """Ask a session to stop; it tears down and ends ``cancelled``. A finished session is left unchanged.

        Raises:
            SessionNotFound: The session is unknown.
        """
        session = self._get(session_id)
        if session.stage is Stage.DONE or session.cancel_requested:
            return self._state(session)
        session.cancel_requested = True
        session.cancel_reason = reason or "cancelled by request"
        if session.work is not None:
            session.work.cancel()
        return self._state(session)

    def watch(
        self, task_id: str = "", session_ids: Collection[str] = (), include_current: bool = False
    ) -> Subscription:
        """Subscribe to state changes; with ``include_current`` the current state of each match comes first.

        The caller must ``close()`` the subscription.
        """
        sub = self._bus.subscribe(task_id, session_ids)
        if include_current:
            now = self._clock()
            for session in list(self._sessions.values()):
                sub.offer(SessionEvent(self._state(session), now, None, session.result))
        return sub

    def capacity(self) -> Capacity:
        """Return the gateway's capacity and per-stage load."""
        active = sum(1 for s in self._sessions.values() if s.stage is not Stage.DONE)
        try:
            self._admit_or_refuse()
            available = self._settings.max_sessions - active
        except GatewayBusy:
            available = 0
        return Capacity(
            self.gateway_id,
            self._settings.max_sessions,
            active,
            0 if self._draining else available,
            self.stage_snapshots(),
            self._draining,
        )

    def stage_snapshots(self) -> list[StageSnapshot]:
        """Return the counters of every stage's pool."""
        return [self._pools[stage].snapshot() for stage in _STAGES]

    async def wait_done(self, session_id: str) -> SessionResult:
        """Wait until a session is done and return its result (for embedded callers and tests)."""
        session = self._get(session_id)
        if session.driver is not None:
            await asyncio.wait({session.driver})
        if session.result is None:
            raise Internal(f"session {session_id} finished without a result")
        return session.result

    def drain(self) -> None:
        """Refuse new sessions from now on; running sessions finish (the rollout server asked us to drain)."""
        self._draining = True

    async def close(self, grace_s: float = 30.0) -> None:
        """Refuse new sessions, cancel the running ones and wait (up to ``grace_s``) for their teardown."""
        self._draining = True
        for session in list(self._sessions.values()):
            if session.stage is not Stage.DONE:
                self.cancel_session(session.spec.session_id, "gateway shutting down")
        drivers = {s.driver for s in self._sessions.values() if s.driver is not None and not s.driver.done()}
        if not drivers:
            return
        _, pending = await asyncio.wait(drivers, timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    # ----------------------------------------------------------------------------------------- admission

    def _admit_or_refuse(self) -> None:
        postrun = self._pools[Stage.POSTRUN]
        backlog = postrun.queue_length
        if backlog > self._settings.postrun_backlog_limit:
            mean = postrun.snapshot().mean_residence_s or 1.0
            excess = backlog - self._settings.postrun_backlog_limit
            retry = min(max(excess * mean / postrun.workers, 0.5), 300.0)
            raise GatewayBusy(
                f"POSTRUN is backed up ({backlog} sessions waiting, limit {self._settings.postrun_backlog_limit})",
                retry_after_s=retry,
                details={"stage": Stage.POSTRUN.value, "queue_length": str(backlog)},
            )
        active = sum(1 for s in self._sessions.values() if s.stage is not Stage.DONE)
        if active >= self._settings.max_sessions:
            retry = min(max((self._mean_session_s or 1.0) / self._settings.max_sessions, 0.5), 60.0)
            raise GatewayBusy(
                f"the gateway runs {active} sessions, its capacity",
                retry_after_s=retry,
                details={"capacity": str(self._settings.max_sessions)},
            )

    # ----------------------------------------------------------------------------------------- the driver

    async def _drive(self, s: _Session) -> None:
        try:
            await self._phase(s, self._front(s))
            self._transition(s, Stage.POSTRUN)
            if s.status is None:
                await self._phase(s, self._score(s))
            if s.status in (TerminalStatus.CANCELLED, TerminalStatus.INFRA_ERROR):
                await self._salvage(s)
        finally:
            # Cancellation by request never reaches here (it cancels only ``s.work``); shutdown might, and the
            # session must still tear down, so the wrap-up is shielded.
            await asyncio.shield(self._wrap_up(s))

    async def _phase(self, s: _Session, coro: Coroutine[Any, Any, None]) -> None:
        """Run one cancellable phase; its exceptions settle the session's status."""
        if s.cancel_requested:
            coro.close()
            self._settle(s, TerminalStatus.CANCELLED, s.cancel_reason)
            return
        task = asyncio.create_task(coro)
        s.work = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait({task})
            self._settle(s, TerminalStatus.CANCELLED, "the gateway stopped")
            raise
        finally:
            s.work = None
        if task.cancelled():
            self._settle(s, TerminalStatus.CANCELLED, s.cancel_reason or "cancelled")
            return
        exc = task.exception()
        if exc is not None:
            self._fail(s, exc)

    def _fail(self, s: _Session, exc: BaseException) -> None:
        where = f"{s.stage.value}{'' if not s.queued else ' (queued)'}"
        if isinstance(exc, TimeoutError):
            message = f"session deadline passed in {where}"
        elif isinstance(exc, PolarError):
            message = f"{where}: {exc.message}"
        else:
            _log.error("session %s failed in %s", s.spec.session_id, where, exc_info=exc)
            message = f"{where}: internal error ({type(exc).__name__})"
        self._settle(s, TerminalStatus.INFRA_ERROR, message)

    async def _front(self, s: _Session) -> None:
        """INIT, READY and RUNNING, under the session deadline; slots are released however it ends."""
        held: list[Slot] = []
        priority = s.spec.priority
        try:
            async with asyncio.timeout(max(s.deadline - self._clock(), 0.0)):
                held.append(await self._pools[Stage.INIT].acquire(priority))
                s.queued = False
                await self._prepare(s)
                s.queued = True
                held.append(await self._pools[Stage.READY].acquire(priority))
                held[0].release()
                self._transition(s, Stage.READY)
                held.append(await self._pools[Stage.RUNNING].acquire(priority))
                held[1].release()
                self._transition(s, Stage.RUNNING)
                await self._run_agent(s)
        except TimeoutError:
            if s.stage is not Stage.RUNNING:
                raise
            # The session deadline cut the agent short: that is the agent's budget running out.
            s.agent_run = AgentRun(AgentStatus.TIMEOUT, duration_s=self._clock() - s.stage_entered_at)
        except asyncio.CancelledError:
            if s.stage is Stage.RUNNING and s.agent_run is None:
                s.agent_run = AgentRun(AgentStatus.CANCELLED, duration_s=self._clock() - s.stage_entered_at)
            raise
        finally:
            for slot in held:
                slot.release()

    async def _prepare(self, s: _Session) -> None:
        spec = s.spec
        s.runtime = self._runtimes.create(spec)
        runtime = s.runtime
        await self._step(s, "runtime.start", runtime.start, self._settings.runtime_start_timeout_s)
        model = spec.model or self._settings.default_model
        endpoints = await self._step(
            s,
            "proxy.open_session",
            lambda: self._proxy.open_session(spec, model, timeout_s=self._settings.step_timeout_s),
            self._settings.step_timeout_s,
        )
        s.proxy_open = s.proxy_used = True
        s.prepared = await self._step(
            s,
            "harness.prepare",
            lambda: self._agents.prepare(runtime, spec, endpoints),
            self._settings.runtime_start_timeout_s,
        )

    async def _run_agent(self, s: _Session) -> None:
        spec = s.spec
        if self._evaluator is not None and spec.evaluator.enabled and spec.evaluator.clean_runtime:
            # Prewarm: build the clean evaluation runtime while the agent runs, so POSTRUN does not wait for it.
            s.prewarm = asyncio.create_task(self._prepare_evaluation(s), name=f"prewarm-{spec.session_id}")
        budget = min(spec.agent_timeout_s or self._settings.agent_timeout_s, s.deadline - self._clock())
        if s.runtime is None or s.prepared is None:
            raise Internal("RUNNING without a prepared runtime")
        runtime, prepared = s.runtime, s.prepared
        started = self._clock()
        try:
            async with asyncio.timeout(max(budget, 0.0) + _KILL_GRACE_S):
                s.agent_run = await self._agents.run(runtime, prepared, timeout_s=max(budget, 0.0))
        except TimeoutError:
            s.agent_run = AgentRun(AgentStatus.TIMEOUT, duration_s=self._clock() - started)

    async def _prepare_evaluation(self, s: _Session) -> str:
        evaluator = self._evaluator
        if evaluator is None:
            raise Internal("evaluation without an evaluator client")
        request_id = f"{s.spec.session_id}/{s.spec.attempt}"
        return await self._step(
            s,
            "evaluator.prepare",
            lambda: evaluator.prepare(s.spec, request_id=request_id, timeout_s=self._settings.runtime_start_timeout_s),
            self._settings.runtime_start_timeout_s,
            deadline=False,
        )

    async def _score(self, s: _Session) -> None:
        """POSTRUN for a session whose agent ran: collect, evaluate, reconstruct (holding a POSTRUN slot)."""
        slot = await self._pools[Stage.POSTRUN].acquire(s.spec.priority)
        try:
            s.queued = False
            await self._close_proxy(s)
            await self._list_completions(s)
            run = s.agent_run or AgentRun(AgentStatus.ERROR)
            evaluation = await self._evaluate(s, run)
            s.reward = evaluation.reward
            self._settle(s, evaluation.status, evaluation.error_message)
            try:
                await self._reconstruct(s)
            except (PolarError, TimeoutError) as exc:
                # Without traces the session carries no learning signal, whatever the verdict was.
                s.status, s.error = TerminalStatus.INFRA_ERROR, f"reconstruction failed: {exc}"
        finally:
            slot.release()

    async def _evaluate(self, s: _Session, run: AgentRun) -> Evaluation:
        spec = s.spec
        if run.outcome is AgentStatus.TIMEOUT:
            # The captured calls stay trainable with reward 0; a timed-out attempt is not scored.
            return Evaluation(0.0, TerminalStatus.AGENT_TIMEOUT, error_message="the agent ran past its budget")
        if not spec.evaluator.enabled:
            return Evaluation(0.0, TerminalStatus.UNRESOLVED)
        evaluator = self._evaluator
        if evaluator is None:
            return Evaluation(
                0.0,
                TerminalStatus.INFRA_ERROR,
                error_message=f"the task asks for evaluator {spec.evaluator.strategy!r} but none is configured",
            )
        runtime = s.runtime
        if runtime is None:
            raise Internal("POSTRUN without a runtime")
        artifacts = await self._step(
            s, "harness.collect", lambda: self._agents.collect(runtime, spec, run), self._settings.step_timeout_s
        )
        await self._stop_runtime(s)  # the evaluator works on the artifacts; free the sandbox now
        if s.prewarm is not None:
            # Shielded: if this phase is cancelled, teardown still gets the handle to release.
            s.eval_handle = await asyncio.shield(s.prewarm)
        else:
            s.eval_handle = await self._prepare_evaluation(s)
        handle = s.eval_handle
        limit = spec.evaluator.timeout_s or self._settings.eval_timeout_s
        try:
            return await self._step(
                s,
                "evaluator.evaluate",
                lambda: evaluator.evaluate(handle, artifacts, run, timeout_s=limit),
                limit + self._settings.step_timeout_s,
            )
        except DeadlineExceeded as exc:
            return Evaluation(0.0, TerminalStatus.EVAL_TIMEOUT, error_message=exc.message)

    async def _reconstruct(self, s: _Session) -> None:
        if not s.completions or self._reconstructor is None or s.status is None:
            return
        reconstructor, status = self._reconstructor, s.status
        s.reconstruction = await self._step(
            s,
            "reconstructor.reconstruct",
            lambda: reconstructor.reconstruct(
                s.completions,
                task_id=s.spec.task_id,
                reward=s.reward,
                status=status,
                builder=s.spec.builder,
                timeout_s=self._settings.step_timeout_s,
            ),
            self._settings.step_timeout_s,
            deadline=False,
        )

    async def _salvage(self, s: _Session) -> None:
        """Keep what a failed or cancelled session captured; best effort, and it needs no POSTRUN slot."""
        if not s.proxy_used:
            return
        try:
            await self._close_proxy(s)
            if not s.listed:
                await self._list_completions(s)
            if s.status is not TerminalStatus.CANCELLED and s.reconstruction is None:
                await self._reconstruct(s)
        except (PolarError, TimeoutError) as exc:
            _log.warning("session %s: could not salvage its completions: %s", s.spec.session_id, exc)

    # ----------------------------------------------------------------------------------------- steps

    async def _step(
        self,
        s: _Session,
        name: str,
        call: Callable[[], Awaitable[_T]],
        timeout_s: float,
        *,
        deadline: bool = True,
    ) -> _T:
        """Run one idempotent side effect with a time limit, retrying it while its dependency is UNAVAILABLE.

        Raises:
            StepTimedOut: The step ran past ``timeout_s``.
            SessionDeadlinePassed: The session deadline (when ``deadline``) ended the step first.
        """
        attempts = 1 + self._settings.step_retries
        for attempt in range(attempts):
            budget, bounded = timeout_s, False
            if deadline:
                left = s.deadline - self._clock()
                if left <= 0:
                    raise SessionDeadlinePassed(f"{name}: the session deadline passed", details={"step": name})
                if left < budget:
                    budget, bounded = left, True
            try:
                async with asyncio.timeout(budget):
                    return await self._traced(s, call)
            except TimeoutError:
                if bounded:
                    raise SessionDeadlinePassed(
                        f"{name}: the session deadline passed", details={"step": name}
                    ) from None
                raise StepTimedOut(f"{name} ran past {timeout_s:g} s", details={"step": name}) from None
            except Unavailable as exc:
                if attempt + 1 >= attempts:
                    raise
                delay = exc.retry_after_s if exc.retry_after_s is not None else 0.2 * 2**attempt
                _log.info("session %s: %s unavailable, retry in %.1f s", s.spec.session_id, name, delay)
                await asyncio.sleep(min(delay, 5.0))
        raise Internal("unreachable")

    async def _close_proxy(self, s: _Session) -> None:
        if not s.proxy_open:
            return
        await self._step(
            s,
            "proxy.close_session",
            lambda: self._proxy.close_session(s.spec.proxy_session_id, timeout_s=self._settings.step_timeout_s),
            self._settings.step_timeout_s,
            deadline=False,
        )
        s.proxy_open = False

    async def _list_completions(self, s: _Session) -> None:
        records = await self._step(
            s,
            "proxy.list_completions",
            lambda: self._proxy.list_completions(s.spec.proxy_session_id, timeout_s=self._settings.step_timeout_s),
            self._settings.step_timeout_s,
            deadline=False,
        )
        for record in records:  # a retried attempt's proxy session still belongs to the logical session
            record.session_id = s.spec.session_id
        s.completions = records
        s.listed = True

    async def _stop_runtime(self, s: _Session) -> None:
        runtime = s.runtime
        if runtime is None or s.runtime_stopped:
            return
        s.runtime_stopped = True
        if s.status is TerminalStatus.CANCELLED:
            await self._step(s, "runtime.cancel", runtime.cancel, self._settings.teardown_timeout_s, deadline=False)
        await self._step(s, "runtime.stop", runtime.stop, self._settings.teardown_timeout_s, deadline=False)

    # ----------------------------------------------------------------------------------------- wrap-up

    async def _wrap_up(self, s: _Session) -> None:
        """Tear everything down, record the result, move to DONE and report; never interrupted by a cancel."""
        await self._teardown(s)
        if s.status is None:
            self._settle(s, TerminalStatus.INFRA_ERROR, "the session ended without a status")
        if s.stage is not Stage.POSTRUN:
            self._transition(s, Stage.POSTRUN)
        status = s.status or TerminalStatus.INFRA_ERROR
        prompt_tokens, response_tokens = completion_totals(s.completions)
        now = self._clock()
        self._add_timing(s, now)
        s.timings["total"] = now - s.admitted_at
        traces = s.reconstruction.traces if s.reconstruction is not None else []
        s.result = SessionResult(
            session_id=s.spec.session_id,
            task_id=s.spec.task_id,
            sample_index=s.spec.sample_index,
            attempt=s.spec.attempt,
            gateway_id=self.gateway_id,
            status=status,
            reward=s.reward if status not in (TerminalStatus.INFRA_ERROR, TerminalStatus.CANCELLED) else 0.0,
            traces=traces,
            timings=dict(s.timings),
            completions=len(s.completions),
            prompt_tokens=prompt_tokens,
            response_tokens=response_tokens,
            reconstruction=s.reconstruction.stats if s.reconstruction is not None else None,
            error_message=s.error,
        )
        self._mean_session_s = (
            s.timings["total"] if not self._mean_session_s else (0.9 * self._mean_session_s + 0.1 * s.timings["total"])
        )
        self._transition(s, Stage.DONE, result=s.result)
        if self._metrics is not None:
            self._metrics.session_finished(status)
        self._remember_done(s)
        await self._report(s, s.result)

    async def _teardown(self, s: _Session) -> None:
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("evaluator.release", lambda: self._release_evaluation(s)),
            ("proxy.close_session", lambda: self._close_proxy(s)),
            ("runtime.stop", lambda: self._stop_runtime(s)),
        ]
        for name, call in steps:
            try:
                await call()
            except (PolarError, TimeoutError, OSError) as exc:
                _log.warning("session %s: teardown step %s failed: %s", s.spec.session_id, name, exc)

    async def _release_evaluation(self, s: _Session) -> None:
        if s.prewarm is not None:
            # Let a prewarm in flight finish (briefly) so its environment can be released rather than leaked.
            await asyncio.wait({s.prewarm}, timeout=self._settings.step_timeout_s)
            if not s.prewarm.done():
                s.prewarm.cancel()
                await asyncio.wait({s.prewarm})
            if not s.prewarm.cancelled() and s.prewarm.exception() is None:
                s.eval_handle = s.prewarm.result()
            s.prewarm = None
        if s.eval_handle and self._evaluator is not None:
            evaluator, handle = self._evaluator, s.eval_handle
            await self._step(
                s,
                "evaluator.release",
                lambda: evaluator.release(handle, timeout_s=self._settings.step_timeout_s),
                self._settings.step_timeout_s,
                deadline=False,
            )
            s.eval_handle = ""

    async def _report(self, s: _Session, result: SessionResult) -> None:
        sink = self._sink
        if sink is None:
            return
        try:
            await self._step(
                s, "sink.report", lambda: sink.report(result), self._settings.step_timeout_s, deadline=False
            )
        except (PolarError, TimeoutError, OSError) as exc:
            # The result stays readable through GetSession and WatchSessions; delivery is the sink's retry.
            _log.warning("session %s: reporting the result failed: %s", s.spec.session_id, exc)

    # ----------------------------------------------------------------------------------------- bookkeeping

    def _settle(self, s: _Session, status: TerminalStatus, message: str = "") -> None:
        """Fix the session's terminal status; the first one wins."""
        if s.status is None:
            s.status = status
            s.error = message

    def _transition(self, s: _Session, stage: Stage, *, result: SessionResult | None = None) -> None:
        if stage not in TRANSITIONS[s.stage]:
            raise Internal(f"illegal session transition {s.stage.value} -> {stage.value}")
        now = self._clock()
        self._add_timing(s, now)
        previous = s.stage
        s.stage, s.stage_entered_at, s.queued = stage, now, stage is not Stage.DONE
        self._end_stage_span(s)
        self._start_stage_span(s)
        self._publish(s, previous=previous, result=result)

    # ----------------------------------------------------------------------------------------- tracing

    def _start_stage_span(self, s: _Session) -> None:
        if s.stage is Stage.DONE:
            return
        s.stage_span = self._tracer.start_span(
            f"gateway.{s.stage.value}",
            context=s.trace_context,
            attributes={
                "polar.session_id": s.spec.session_id,
                "polar.task_id": s.spec.task_id,
                "polar.attempt": s.spec.attempt,
                "polar.stage": s.stage.value,
            },
        )

    def _end_stage_span(self, s: _Session) -> None:
        span, s.stage_span = s.stage_span, None
        if span is None:
            return
        if s.stage is Stage.DONE and s.status is not None:
            span.set_attribute("polar.status", s.status.value)
            if s.status is TerminalStatus.INFRA_ERROR:
                span.set_status(trace.Status(trace.StatusCode.ERROR, s.error))
        span.end()

    async def _traced(self, s: _Session, call: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``call`` with the session's current stage span (else its StartSession context) as the parent."""
        parent = s.trace_context
        if s.stage_span is not None:
            parent = trace.set_span_in_context(s.stage_span, parent)
        if parent is None:
            return await call()
        token = otel_context.attach(parent)
        try:
            return await call()
        finally:
            otel_context.detach(token)

    def _add_timing(self, s: _Session, now: float) -> None:
        if s.stage is not Stage.DONE:
            key = s.stage.value
            s.timings[key] = s.timings.get(key, 0.0) + now - s.stage_entered_at

    def _publish(self, s: _Session, *, previous: Stage | None, result: SessionResult | None = None) -> None:
        self._bus.publish(SessionEvent(self._state(s), self._clock(), previous, result))

    def _state(self, s: _Session) -> SessionState:
        return SessionState(
            session_id=s.spec.session_id,
            task_id=s.spec.task_id,
            sample_index=s.spec.sample_index,
            attempt=s.spec.attempt,
            stage=s.stage,
            gateway_id=self.gateway_id,
            stage_entered_at=s.stage_entered_at,
            deadline=s.deadline,
            status=s.status if s.stage is Stage.DONE else None,
            error_message=s.error if s.stage is Stage.DONE else "",
            queued=s.queued,
        )

    def _get(self, session_id: str) -> _Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"unknown session {session_id!r}", details={"session_id": session_id}) from None

    def _remember_done(self, s: _Session) -> None:
        self._done_order.append(s.spec.session_id)
        while len(self._done_order) > self._settings.retained_results:
            self._forget(self._done_order.popleft())

    def _forget(self, session_id: str) -> None:
        old = self._sessions.get(session_id)
        if old is not None and old.stage is Stage.DONE:
            del self._sessions[session_id]
