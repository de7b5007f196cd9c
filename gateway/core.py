"""The session pipeline: a plain-async engine that runs sessions through staged pools.

Every session is driven by one coroutine through an explicit state machine (:data:`gateway.models.TRANSITIONS`)::

    INIT ──► READY ──► RUNNING ──► POSTRUN ──► DONE(terminal status)
      └────────┴──────────────────────►┘   (failure or cancellation before the agent ends)

Each stage has its own pool of slots (:class:`gateway.pools.StagePool`): INIT creates the runtime, opens the
proxy session and prepares the harness (waiting sessions are served by task priority); READY is a bounded
buffer of prepared runtimes (a prepared session keeps its INIT slot while READY is full); RUNNING holds the
scarce slots in which harnesses run; POSTRUN collects completions, evaluates, reconstructs and reports. A
session's deadline bounds everything from INIT; the agent budget runs from RUNNING. Every side effect is an
idempotent step with its own time limit, retried when its dependency is UNAVAILABLE (:mod:`gateway.steps`).
Cancellation interrupts whatever phase runs, frees its slot, and the session still tears down and reports
``cancelled`` (:mod:`gateway.wrapup`). Stage changes, spans, metrics and watcher events are recorded by
:mod:`gateway.observer`.

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from typing import Any

from opentelemetry import trace

from gateway.agent_failures import agent_failure
from gateway.dependencies import PROXY, DependencyMonitor, Outage
from gateway.errors import (
    GatewayBusy,
    GatewayDraining,
    PatchTooLarge,
    SessionConflict,
    SessionDeadlinePassed,
    SessionNotFound,
)
from gateway.events import Subscription
from gateway.metrics import GatewayMetrics
from gateway.models import (
    AgentRun,
    Artifacts,
    Capacity,
    Evaluation,
    PipelineConfig,
    SessionEvent,
    SessionResult,
    SessionSpec,
    SessionState,
    Stage,
    StageSnapshot,
)
from gateway.observer import StageObserver
from gateway.pools import Slot, StagePool
from gateway.ports import AgentRunner, EvaluatorClient, ProxyClient, ReconstructorClient, ResultSink, RuntimeFactory
from gateway.rewards import stamp_traces
from gateway.session import Session, settle
from gateway.steps import SessionSteps
from gateway.wrapup import WrapUp
from polar_core.errors import DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, PolarError, Unavailable
from polar_core.records import AgentStatus, TerminalStatus
from runtimes.errors import DiskQuotaExceeded

__all__ = ["Capacity", "SessionPipeline"]

_log = logging.getLogger(__name__)
# Extra time a harness gets past its budget to be killed and reaped before the pipeline stops waiting.
_KILL_GRACE_S = 10.0
# How soon the rollout server may try again while a dependency is unreachable (the monitor probes every second).
_OUTAGE_RETRY_S = 1.0
_STAGES = (Stage.INIT, Stage.READY, Stage.RUNNING, Stage.POSTRUN)


class SessionPipeline:
    """Runs sessions through the staged pools; the GatewayService's servicer is a thin layer over it.

    Args:
        config: Worker counts, bounds and time limits.
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
        dependencies: Whether proxy, evaluator and reconstructor are reachable; while one is not, the gateway
            advertises no capacity and refuses new sessions, and a RUN the proxy's outage spoilt is not scored.
            ``None`` assumes they always are.
        cannot_run: Why this gateway can run no session at all (the host lacks the operator's minimum
            isolation); when set, StartSession raises FailedPrecondition with it and the capacity is 0.
    """

    def __init__(
        self,
        config: PipelineConfig,
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
        dependencies: DependencyMonitor | None = None,
        cannot_run: str = "",
    ) -> None:
        self._cannot_run = cannot_run
        self._config = config
        self._dependencies = dependencies
        self._runtimes = runtimes
        self._agents = agents
        self._clock = clock
        self._observer = StageObserver(
            gateway_id=gateway_id,
            tracer=tracer or trace.get_tracer("gateway"),
            metrics=metrics,
            watch_buffer=config.watch_buffer,
            clock=clock,
        )
        self._steps = SessionSteps(
            config,
            proxy=proxy,
            reconstructor=reconstructor,
            evaluator=evaluator,
            observer=self._observer,
            clock=clock,
        )
        self._wrapup = WrapUp(
            config, steps=self._steps, observer=self._observer, sink=sink, on_done=self._remember_done, clock=clock
        )
        workers = {
            Stage.INIT: config.init_workers,
            Stage.READY: config.ready_capacity,
            Stage.RUNNING: config.running_workers,
            Stage.POSTRUN: config.postrun_workers,
        }
        self._pools = {stage: StagePool(stage, n, observer=metrics) for stage, n in workers.items()}
        if metrics is not None:
            metrics.bind(self.stage_snapshots)
        self._sessions: dict[str, Session] = {}
        self._done_order: collections.deque[str] = collections.deque()
        self._draining = False

    @property
    def gateway_id(self) -> str:
        """This gateway's id, written on states and results."""
        return self._observer.gateway_id

    @gateway_id.setter
    def gateway_id(self, value: str) -> None:
        self._observer.gateway_id = value

    # ----------------------------------------------------------------------------------------- public API

    async def start_session(self, spec: SessionSpec) -> tuple[SessionState, bool]:
        """Accept ``spec`` and start running it in the background.

        Returns:
            The session's state and whether this (session_id, attempt) had already been accepted.

        Raises:
            InvalidArgument: The harness is unknown, or its options or the runtime table are malformed.
            SessionConflict: The session runs with a different attempt.
            GatewayDraining: The gateway accepts no new sessions.
            FailedPrecondition: The host cannot provide the operator's minimum isolation.
            GatewayBusy: The gateway is full or POSTRUN is backed up (with a retry delay).
        """
        existing = self._sessions.get(spec.session_id)
        if existing is not None:
            if existing.spec.attempt == spec.attempt:
                return self._observer.state(existing), True
            if existing.stage is not Stage.DONE:
                raise SessionConflict(
                    f"session {spec.session_id} is running attempt {existing.spec.attempt}",
                    details={"session_id": spec.session_id, "attempt": str(existing.spec.attempt)},
                )
        if self._draining:
            raise GatewayDraining("the gateway is draining and accepts no new sessions")
        if self._cannot_run:
            raise FailedPrecondition(self._cannot_run)
        self._agents.validate(spec)
        self._runtimes.validate(spec)
        self._admit_or_refuse()
        now = self._clock()
        deadline = spec.deadline if spec.deadline is not None else now + self._config.session_timeout_s
        session = Session(spec=spec, deadline=deadline, admitted_at=now, stage_entered_at=now)
        if existing is not None:
            self._forget(spec.session_id)
        self._sessions[spec.session_id] = session
        self._observer.admitted(session)
        session.driver = asyncio.create_task(self._drive(session), name=f"session-{spec.session_id}")
        return self._observer.state(session), False

    def get_session(self, session_id: str) -> tuple[SessionState, SessionResult | None]:
        """Return a session's state and, once done, its result.

        Raises:
            SessionNotFound: The session is unknown.
        """
        session = self._get(session_id)
        return self._observer.state(session), session.result

    def cancel_session(self, session_id: str, reason: str = "") -> SessionState:
        """Ask a session to stop; it tears down and ends ``cancelled``. A finished session is left unchanged.

        Raises:
            SessionNotFound: The session is unknown.
        """
        session = self._get(session_id)
        if session.stage is Stage.DONE or session.cancel_requested:
            return self._observer.state(session)
        session.cancel_requested = True
        session.cancel_reason = reason or "cancelled by request"
        if session.work is not None:
            session.work.cancel()
        return self._observer.state(session)

    def watch(
        self, task_id: str = "", session_ids: Collection[str] = (), include_current: bool = False
    ) -> Subscription:
        """Subscribe to state changes; with ``include_current`` the current state of each match comes first.

        The caller must ``close()`` the subscription.
        """
        sub = self._observer.subscribe(task_id, session_ids)
        if include_current:
            now = self._clock()
            for session in list(self._sessions.values()):
                sub.offer(SessionEvent(self._observer.state(session), now, None, session.result))
        return sub

    def capacity(self) -> Capacity:
        """Return the gateway's capacity and per-stage load."""
        active = sum(1 for s in self._sessions.values() if s.stage is not Stage.DONE)
        try:
            self._admit_or_refuse()
            available = self._config.max_sessions - active
        except GatewayBusy:
            available = 0
        return Capacity(
            self.gateway_id,
            self._config.max_sessions,
            active,
            0 if self._draining or self._cannot_run else available,
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

    async def wait_idle(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every admitted session to finish; return how many still run."""
        drivers = {s.driver for s in self._sessions.values() if s.driver is not None and not s.driver.done()}
        if drivers:
            await asyncio.wait(drivers, timeout=timeout_s)
        return sum(1 for s in self._sessions.values() if s.stage is not Stage.DONE)

    def hand_back_all(self) -> None:
        """The gateway is going away: refuse new sessions, and every session not yet done will end handed back
        (``infra_error`` marked as an outage), whatever it settles on meanwhile. Call it first on shutdown."""
        self._draining = True
        for session in self._sessions.values():
            if session.stage is not Stage.DONE:
                session.handed_back = True

    async def close(self, grace_s: float = 30.0, *, hand_back: bool = False) -> None:
        """Refuse new sessions, cancel the running ones and wait (up to ``grace_s``) for their teardown.

        With ``hand_back`` (the gateway process is going away: a signal, the end of its allocation) a session
        stopped here ends ``infra_error`` marked as an outage (``dependency_unavailable``), so the rollout server
        runs it again elsewhere without using up an attempt and nobody scores it; otherwise it ends ``cancelled``.
        """
        self._draining = True
        for session in list(self._sessions.values()):
            if session.stage is not Stage.DONE:
                session.handed_back = hand_back
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
        down = self._dependencies.unavailable() if self._dependencies is not None else []
        if down:
            raise GatewayBusy(
                f"the gateway's dependencies are unreachable: {', '.join(down)}",
                retry_after_s=_OUTAGE_RETRY_S,
                details={"unavailable": ",".join(down)},
            )
        postrun = self._pools[Stage.POSTRUN]
        backlog = postrun.queue_length
        if backlog > self._config.postrun_backlog_limit:
            mean = postrun.snapshot().mean_residence_s or 1.0
            excess = backlog - self._config.postrun_backlog_limit
            retry = min(max(excess * mean / postrun.workers, 0.5), 300.0)
            raise GatewayBusy(
                f"POSTRUN is backed up ({backlog} sessions waiting, limit {self._config.postrun_backlog_limit})",
                retry_after_s=retry,
                details={"stage": Stage.POSTRUN.value, "queue_length": str(backlog)},
            )
        active = sum(1 for s in self._sessions.values() if s.stage is not Stage.DONE)
        if active >= self._config.max_sessions:
            retry = min(max((self._wrapup.mean_session_s or 1.0) / self._config.max_sessions, 0.5), 60.0)
            raise GatewayBusy(
                f"the gateway runs {active} sessions, its capacity",
                retry_after_s=retry,
                details={"capacity": str(self._config.max_sessions)},
            )

    # ----------------------------------------------------------------------------------------- the driver

    async def _drive(self, s: Session) -> None:
        try:
            await self._phase(s, self._front(s))
            self._observer.transition(s, Stage.POSTRUN)
            if s.status is None:
                await self._phase(s, self._score(s))
            if s.status in (TerminalStatus.CANCELLED, TerminalStatus.INFRA_ERROR, TerminalStatus.INVALID_PATCH):
                await self._wrapup.salvage(s)
        finally:
            # Cancellation by request never reaches here (it cancels only ``s.work``); shutdown might, and the
            # session must still tear down, so the wrap-up is shielded.
            await asyncio.shield(self._wrapup.wrap_up(s))

    async def _phase(self, s: Session, coro: Coroutine[Any, Any, None]) -> None:
        """Run one cancellable phase; its exceptions settle the session's status."""
        if s.cancel_requested:
            coro.close()
            _settle_cancelled(s, s.cancel_reason)
            return
        task = asyncio.create_task(coro)
        s.work = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait({task})
            _settle_cancelled(s, "the gateway stopped")
            raise
        finally:
            s.work = None
        if task.cancelled():
            _settle_cancelled(s, s.cancel_reason or "cancelled")
            return
        exc = task.exception()
        if exc is not None:
            self._fail(s, exc)

    def _fail(self, s: Session, exc: BaseException) -> None:
        where = f"{s.stage.value}{'' if not s.queued else ' (queued)'}"
        if isinstance(exc, Unavailable):
            s.dependency_unavailable = True  # an outage, not the policy's failure (retried without using an attempt)
        if isinstance(exc, DiskQuotaExceeded):
            # The agent filled its workspace: its own doing, so a scored status with the reason, not infra.
            settle(s, TerminalStatus.INVALID_PATCH, exc.message)
            return
        if isinstance(exc, TimeoutError):
            message = f"session deadline passed in {where}"
        elif isinstance(exc, PolarError):
            message = f"{where}: {exc.message}"
        else:
            _log.error("session %s failed in %s", s.spec.session_id, where, exc_info=exc)
            message = f"{where}: internal error ({type(exc).__name__})"
        settle(s, TerminalStatus.INFRA_ERROR, message)

    async def _front(self, s: Session) -> None:
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
                self._observer.transition(s, Stage.READY)
                held.append(await self._pools[Stage.RUNNING].acquire(priority))
                held[1].release()
                self._observer.transition(s, Stage.RUNNING)
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

    async def _prepare(self, s: Session) -> None:
        spec = s.spec
        s.runtime = self._runtimes.create(spec)
        runtime = s.runtime
        await self._steps.run(s, "runtime.start", runtime.start, self._config.runtime_start_timeout_s)
        model = spec.model or self._config.default_model
        endpoints = await self._steps.run(
            s,
            "proxy.open_session",
            lambda: self._steps.proxy.open_session(spec, model, timeout_s=self._config.step_timeout_s),
            self._config.step_timeout_s,
        )
        s.proxy_open = s.proxy_used = True
        s.prepared = await self._steps.run(
            s,
            "harness.prepare",
            lambda: self._agents.prepare(runtime, spec, endpoints),
            self._config.runtime_start_timeout_s,
        )

    async def _run_agent(self, s: Session) -> None:
        spec = s.spec
        if self._steps.evaluator is not None and spec.evaluator.enabled and spec.evaluator.clean_runtime:
            # Prewarm: build the clean evaluation runtime while the agent runs, so POSTRUN does not wait for it.
            s.prewarm = asyncio.create_task(self._steps.prepare_evaluation(s), name=f"prewarm-{spec.session_id}")
        budget = min(spec.agent_timeout_s or self._config.agent_timeout_s, s.deadline - self._clock())
        if s.runtime is None or s.prepared is None:
            raise Internal("RUNNING without a prepared runtime")
        runtime, prepared = s.runtime, s.prepared
        started = s.run_started_at = self._clock()
        try:
            async with asyncio.timeout(max(budget, 0.0) + _KILL_GRACE_S):
                s.agent_run = await self._agents.run(runtime, prepared, timeout_s=max(budget, 0.0))
        except TimeoutError:
            s.agent_run = AgentRun(AgentStatus.TIMEOUT, duration_s=self._clock() - started)
        finally:
            s.run_ended_at = self._clock()

    async def _score(self, s: Session) -> None:
        """POSTRUN for a session whose agent ran: collect, evaluate, reconstruct (holding a POSTRUN slot).

        A task whose evaluator ``needs_traces`` is reconstructed first and its traces go to the evaluator;
        otherwise the evaluation comes first (the traces then carry its verdict from the reconstructor). Either
        way the verdict and any per-trace rewards are stamped on the traces last (:mod:`gateway.rewards`).
        """
        slot = await self._pools[Stage.POSTRUN].acquire(s.spec.priority)
        try:
            s.queued = False
            await self._steps.close_proxy(s)
            await self._steps.list_completions(s)
            run = s.agent_run or AgentRun(AgentStatus.ERROR)
            failure = agent_failure(run, s.completions, self._proxy_outage(s))
            if failure is not None:
                # Not the policy's doing: no verdict; the wrap-up salvages the captured calls.
                s.dependency_unavailable = failure.dependency_unavailable
                settle(s, TerminalStatus.INFRA_ERROR, failure.message)
                return
            traces_first = s.spec.evaluator.enabled and s.spec.evaluator.needs_traces
            if traces_first and not await self._reconstruct(s, provisional=True):
                return
            evaluation = await self._evaluate(s, run)
            s.evaluation = evaluation
            s.reward = evaluation.reward
            settle(s, evaluation.status, evaluation.error_message)
            if not traces_first and not await self._reconstruct(s):
                return
            self._stamp_rewards(s, evaluation)
        finally:
            slot.release()

    async def _reconstruct(self, s: Session, *, provisional: bool = False) -> bool:
        """Reconstruct; a failure ends the session ``infra_error`` (returns ``False``)."""
        try:
            await self._steps.reconstruct(s, provisional=provisional)
        except (PolarError, TimeoutError) as exc:
            # Without traces the session carries no learning signal, whatever the verdict was.
            s.status, s.error = TerminalStatus.INFRA_ERROR, f"reconstruction failed: {exc}"
            s.dependency_unavailable = isinstance(exc, Unavailable)
            return False
        return True

    def _proxy_outage(self, s: Session) -> Outage | None:
        """The latest proxy outage the gateway saw while the session's harness ran."""
        if self._dependencies is None or s.run_started_at is None:
            return None
        return self._dependencies.down_during(PROXY, s.run_started_at, s.run_ended_at or self._clock())

    def _stamp_rewards(self, s: Session, evaluation: Evaluation) -> None:
        status = s.status or TerminalStatus.INFRA_ERROR
        traces = s.reconstruction.traces if s.reconstruction is not None else []
        try:
            stamped = stamp_traces(traces, reward=s.reward, status=status, trace_rewards=evaluation.trace_rewards)
        except InvalidArgument as exc:
            # The evaluator's answer does not fit the session: its failure, told as such, not a silent drop.
            s.status, s.error, s.reward = TerminalStatus.INFRA_ERROR, exc.message, 0.0
            stamped = stamp_traces(traces, reward=0.0, status=TerminalStatus.INFRA_ERROR)
        if s.reconstruction is not None:
            s.reconstruction = dataclasses.replace(s.reconstruction, traces=stamped)

    async def _collect(self, s: Session, run: AgentRun) -> Artifacts:
        runtime = s.runtime
        if runtime is None:
            raise Internal("POSTRUN without a runtime")
        spec = s.spec
        s.artifacts = await self._steps.run(
            s, "harness.collect", lambda: self._agents.collect(runtime, spec, run), self._config.step_timeout_s
        )
        await self._steps.stop_runtime(s)  # the evaluator works on the artifacts; free the sandbox now
        return s.artifacts

    async def _evaluate(self, s: Session, run: AgentRun) -> Evaluation:
        """Collect the agent's work (also after a timeout, and kept on the result) and score it."""
        spec = s.spec
        timed_out = run.outcome is AgentStatus.TIMEOUT
        try:
            artifacts = await self._collect(s, run)
        except (PatchTooLarge, DiskQuotaExceeded) as exc:
            return Evaluation(0.0, TerminalStatus.INVALID_PATCH, error_message=exc.message)
        except SessionDeadlinePassed:
            if not timed_out:
                raise
            return Evaluation(
                0.0,
                TerminalStatus.AGENT_TIMEOUT,
                error_message="the agent ran past its budget and the session deadline passed before its work was "
                "collected",
            )
        if timed_out and not (spec.evaluator.enabled and spec.evaluator.score_on_timeout):
            # Opted out (score_on_timeout: false), or nothing scores it: the captured calls stay with reward 0.
            return Evaluation(0.0, TerminalStatus.AGENT_TIMEOUT, error_message="the agent ran past its budget")
        if not spec.evaluator.enabled:
            return Evaluation(0.0, TerminalStatus.UNRESOLVED)
        evaluator = self._steps.evaluator
        if evaluator is None:
            return Evaluation(
                0.0,
                TerminalStatus.INFRA_ERROR,
                error_message=f"the task asks for evaluator {spec.evaluator.strategy!r} but none is configured",
            )
        if spec.evaluator.needs_traces and s.reconstruction is not None:
            artifacts = dataclasses.replace(artifacts, traces=tuple(s.reconstruction.traces))
        if s.prewarm is not None:
            # Shielded: if this phase is cancelled, teardown still gets the handle to release.
            s.eval_handle = await asyncio.shield(s.prewarm)
        else:
            s.eval_handle = await self._steps.prepare_evaluation(s)
        handle = s.eval_handle
        limit = spec.evaluator.timeout_s or self._config.eval_timeout_s
        try:
            return await self._steps.run(
                s,
                "evaluator.evaluate",
                lambda: evaluator.evaluate(handle, artifacts, run, timeout_s=limit),
                limit + self._config.step_timeout_s,
            )
        except DeadlineExceeded as exc:
            return Evaluation(0.0, TerminalStatus.EVAL_TIMEOUT, error_message=exc.message)

    # ----------------------------------------------------------------------------------------- sessions

    def _get(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"unknown session {session_id!r}", details={"session_id": session_id}) from None

    def _remember_done(self, s: Session) -> None:
        # What grows with a long session is not kept past its end: the records stay in the proxy, and the traces
        # only in the results of the last ``retained_traces`` sessions (older ones keep every other field).
        s.completions = []
        s.reconstruction = None
        self._done_order.append(s.spec.session_id)
        if len(self._done_order) > self._config.retained_traces:
            old = self._sessions.get(self._done_order[-self._config.retained_traces - 1])
            if old is not None and old.result is not None and old.result.traces:
                old.result = dataclasses.replace(old.result, traces=[])
        while len(self._done_order) > self._config.retained_results:
            self._forget(self._done_order.popleft())

    def _forget(self, session_id: str) -> None:
        old = self._sessions.get(session_id)
        if old is not None and old.stage is Stage.DONE:
            del self._sessions[session_id]


def _settle_cancelled(s: Session, reason: str) -> None:
    """Settle a stopped session: ``cancelled``, or an outage handed back when the gateway itself is going away."""
    if s.handed_back:
        s.dependency_unavailable = True  # not the policy's failure: run again elsewhere without using an attempt
        settle(s, TerminalStatus.INFRA_ERROR, f"handed back: the gateway shut down ({reason})")
    else:
        settle(s, TerminalStatus.CANCELLED, reason)
