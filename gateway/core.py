"""The session pipeline: admission and the table of sessions; a driver coroutine runs each session's stages.

:class:`SessionPipeline` is what the GatewayService's servicer calls: it admits a session (harness, options,
runtime table, capacity, dependencies reachable, POSTRUN not backed up), keeps it in its
:class:`~gateway.session.SessionTable`, and starts :meth:`gateway.driver.SessionDriver.drive`, where the
session's stages (INIT → READY → RUNNING → POSTRUN → DONE) read top to bottom. It answers GetSession,
CancelSession, WatchSessions and capacity questions, and drains, hands back and closes on shutdown. It builds
the driver's collaborators (:mod:`gateway.observer`, :mod:`gateway.steps`, :mod:`gateway.scoring`,
:mod:`gateway.wrapup`) and passes them in.

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection

from opentelemetry import trace

from gateway.dependencies import DependencyMonitor
from gateway.driver import SessionDriver
from gateway.errors import GatewayBusy, GatewayDraining, SessionConflict, SessionNotFound
from gateway.events import Subscription
from gateway.metrics import GatewayMetrics
from gateway.models import (
    Capacity,
    PipelineConfig,
    SessionEvent,
    SessionResult,
    SessionSpec,
    SessionState,
    Stage,
    StageSnapshot,
)
from gateway.observer import StageObserver
from gateway.pools import StagePool
from gateway.ports import AgentRunner, EvaluatorClient, ProxyClient, ReconstructorClient, ResultSink, RuntimeFactory
from gateway.scoring import SessionScorer
from gateway.session import Session, SessionTable
from gateway.steps import SessionSteps
from gateway.wrapup import WrapUp
from polar_core.errors import FailedPrecondition, Internal

__all__ = ["Capacity", "SessionPipeline"]

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
        self._sessions = SessionTable(config)
        self._draining = False
        workers = {
            Stage.INIT: config.init_workers,
            Stage.READY: config.ready_capacity,
            Stage.RUNNING: config.running_workers,
            Stage.POSTRUN: config.postrun_workers,
        }
        self._pools = {stage: StagePool(stage, n, observer=metrics) for stage, n in workers.items()}
        if metrics is not None:
            metrics.bind(self.stage_snapshots)
        self._observer = StageObserver(
            gateway_id=gateway_id,
            tracer=tracer or trace.get_tracer("gateway"),
            metrics=metrics,
            watch_buffer=config.watch_buffer,
            clock=clock,
        )
        steps = SessionSteps(
            config, proxy=proxy, reconstructor=reconstructor, evaluator=evaluator, observer=self._observer, clock=clock
        )
        self._wrapup = WrapUp(config, steps=steps, observer=self._observer, sink=sink, clock=clock)
        self._driver = SessionDriver(
            config,
            pools=self._pools,
            runtimes=runtimes,
            agents=agents,
            proxy=proxy,
            evaluator=evaluator,
            steps=steps,
            observer=self._observer,
            scorer=SessionScorer(
                config, steps=steps, agents=agents, evaluator=evaluator, dependencies=dependencies, clock=clock
            ),
            wrapup=self._wrapup,
            sessions=self._sessions,
            clock=clock,
        )

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
        self._sessions.add(session)
        self._observer.admitted(session)
        session.driver = asyncio.create_task(self._driver.drive(session), name=f"session-{spec.session_id}")
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
            for session in self._sessions:
                sub.offer(SessionEvent(self._observer.state(session), now, None, session.result))
        return sub

    def capacity(self) -> Capacity:
        """Return the gateway's capacity and per-stage load."""
        active = self._sessions.active()
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
        drivers = {s.driver for s in self._sessions if s.driver is not None and not s.driver.done()}
        if drivers:
            await asyncio.wait(drivers, timeout=timeout_s)
        return self._sessions.active()

    def hand_back_all(self) -> None:
        """The gateway is going away: refuse new sessions, and every session not yet done will end handed back
        (``infra_error`` marked as an outage), whatever it settles on meanwhile. Call it first on shutdown."""
        self._draining = True
        for session in self._sessions:
            if session.stage is not Stage.DONE:
                session.handed_back = True

    async def close(self, grace_s: float = 30.0, *, hand_back: bool = False) -> None:
        """Refuse new sessions, cancel the running ones and wait (up to ``grace_s``) for their teardown.

        With ``hand_back`` (the gateway process is going away: a signal, the end of its allocation) a session
        stopped here ends ``infra_error`` marked as an outage (``dependency_unavailable``), so the rollout server
        runs it again elsewhere without using up an attempt and nobody scores it; otherwise it ends ``cancelled``.
        """
        self._draining = True
        for session in self._sessions:
            if session.stage is not Stage.DONE:
                session.handed_back = hand_back
                self.cancel_session(session.spec.session_id, "gateway shutting down")
        drivers = {s.driver for s in self._sessions if s.driver is not None and not s.driver.done()}
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
        active = self._sessions.active()
        if active >= self._config.max_sessions:
            retry = min(max((self._wrapup.mean_session_s or 1.0) / self._config.max_sessions, 0.5), 60.0)
            raise GatewayBusy(
                f"the gateway runs {active} sessions, its capacity",
                retry_after_s=retry,
                details={"capacity": str(self._config.max_sessions)},
            )

    # ----------------------------------------------------------------------------------------- sessions

    def _get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(f"unknown session {session_id!r}", details={"session_id": session_id})
        return session
