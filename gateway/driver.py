"""The session driver: one session's life, from INIT to DONE, read top to bottom in :meth:`SessionDriver.drive`.

Every session is driven by one coroutine through an explicit state machine (:data:`gateway.models.TRANSITIONS`)::

    INIT ──► READY ──► RUNNING ──► POSTRUN ──► DONE(terminal status)
      └────────┴──────────────────────►┘   (failure or cancellation before the agent ends)

Each stage has its own pool of slots (:class:`gateway.pools.StagePool`): INIT creates the runtime, opens the
proxy session and prepares the harness (waiting sessions are served by task priority); READY is a bounded
buffer of prepared runtimes (a prepared session keeps its INIT slot while READY is full); RUNNING holds the
scarce slots in which harnesses run; POSTRUN collects, evaluates and reconstructs (:mod:`gateway.scoring`); DONE
tears down and reports (:mod:`gateway.wrapup`). A session's deadline bounds everything from INIT; the agent
budget runs from RUNNING. Cancellation interrupts whatever phase runs, frees its slot, and the session still
tears down and reports ``cancelled``.

The driver calls its collaborators and none of them calls back: :class:`~gateway.observer.StageObserver` is
told of each stage change, :class:`~gateway.steps.SessionSteps` runs each side effect as an idempotent step with
its own time limit (retried while its dependency is UNAVAILABLE), :class:`~gateway.scoring.SessionScorer` does
the POSTRUN work, :class:`~gateway.wrapup.WrapUp` salvages, finishes and reports, and
:class:`~gateway.session.SessionTable` keeps the finished session.

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from gateway.models import AgentRun, PipelineConfig, Stage
from gateway.observer import StageObserver
from gateway.pools import Slot, StagePool
from gateway.ports import AgentRunner, EvaluatorClient, ProxyClient, RuntimeFactory
from gateway.scoring import SessionScorer
from gateway.session import Session, SessionTable, settle
from gateway.steps import SessionSteps
from gateway.wrapup import WrapUp
from polar_core.errors import Internal, PolarError, Unavailable
from polar_core.records import AgentStatus, TerminalStatus
from runtimes.errors import DiskQuotaExceeded

__all__ = ["SessionDriver"]

_log = logging.getLogger(__name__)
# Extra time a harness gets past its budget to be killed and reaped before the pipeline stops waiting.
_KILL_GRACE_S = 10.0
# Statuses after which what the session captured is salvaged (its calls kept, reconstructed if not cancelled).
_SALVAGED = (TerminalStatus.CANCELLED, TerminalStatus.INFRA_ERROR, TerminalStatus.INVALID_PATCH)


class SessionDriver:
    """Drives sessions through their stages, one :meth:`drive` coroutine per session.

    Args:
        config: Time limits.
        pools: Each stage's pool of slots (INIT, READY, RUNNING, POSTRUN).
        runtimes: Creates each session's runtime.
        agents: Prepares and runs harnesses in runtimes.
        proxy: Opens each session's proxy session.
        evaluator: Whether an evaluation environment can be prewarmed while the agent runs (``None``: never).
        steps: Runs every side effect.
        observer: Records each stage change.
        scorer: Does the POSTRUN work of a session whose agent ran.
        wrapup: Salvages, finishes and reports every session.
        sessions: Keeps each finished session for GetSession and watchers.
        clock: Unix time, for deadlines and budgets.
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        pools: Mapping[Stage, StagePool],
        runtimes: RuntimeFactory,
        agents: AgentRunner,
        proxy: ProxyClient,
        evaluator: EvaluatorClient | None,
        steps: SessionSteps,
        observer: StageObserver,
        scorer: SessionScorer,
        wrapup: WrapUp,
        sessions: SessionTable,
        clock: Callable[[], float],
    ) -> None:
        self._config = config
        self._pools = pools
        self._runtimes = runtimes
        self._agents = agents
        self._proxy = proxy
        self._evaluator = evaluator
        self._steps = steps
        self._observer = observer
        self._scorer = scorer
        self._wrapup = wrapup
        self._sessions = sessions
        self._clock = clock

    async def drive(self, s: Session) -> None:
        """Run ``s`` through INIT, READY, RUNNING and POSTRUN to DONE; it always ends with a reported result."""
        try:
            await self._phase(s, self._front(s))
            self._observer.transition(s, Stage.POSTRUN)
            if s.status is None:
                await self._phase(s, self._postrun(s))
            if s.status in _SALVAGED:
                await self._wrapup.salvage(s)
        finally:
            # Cancellation by request never reaches here (it cancels only ``s.work``); shutdown might, and the
            # session must still tear down, so the end is shielded.
            await asyncio.shield(self._done(s))

    # ----------------------------------------------------------------------------------------- the stages

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
        """INIT: create and start the runtime, open the proxy session, prepare the harness."""
        spec = s.spec
        s.runtime = self._runtimes.create(spec)
        runtime = s.runtime
        await self._steps.run(s, "runtime.start", runtime.start, self._config.runtime_start_timeout_s)
        model = spec.model or self._config.default_model
        endpoints = await self._steps.run(
            s,
            "proxy.open_session",
            functools.partial(self._proxy.open_session, spec, model, timeout_s=self._config.step_timeout_s),
            self._config.step_timeout_s,
        )
        s.proxy_open = s.proxy_used = True
        s.prepared = await self._steps.run(
            s,
            "harness.prepare",
            functools.partial(self._agents.prepare, runtime, spec, endpoints),
            self._config.runtime_start_timeout_s,
        )

    async def _run_agent(self, s: Session) -> None:
        """RUNNING: run the harness under the agent budget (prewarming the evaluation meanwhile)."""
        spec = s.spec
        if self._evaluator is not None and spec.evaluator.enabled and spec.evaluator.clean_runtime:
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

    async def _postrun(self, s: Session) -> None:
        """POSTRUN for a session whose agent ran: score it while holding a POSTRUN slot."""
        slot = await self._pools[Stage.POSTRUN].acquire(s.spec.priority)
        try:
            s.queued = False
            await self._scorer.score(s)
        finally:
            slot.release()

    async def _done(self, s: Session) -> None:
        """DONE: tear down and record the result, keep the session, then report the result."""
        result = await self._wrapup.finish(s)
        self._sessions.retain(s)
        await self._wrapup.report(s, result)

    # ----------------------------------------------------------------------------------------- phases

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
            _fail(s, exc)


def _fail(s: Session, exc: BaseException) -> None:
    """Settle a session whose phase raised ``exc``."""
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


def _settle_cancelled(s: Session, reason: str) -> None:
    """Settle a stopped session: ``cancelled``, or an outage handed back when the gateway itself is going away."""
    if s.handed_back:
        s.dependency_unavailable = True  # not the policy's failure: run again elsewhere without using an attempt
        settle(s, TerminalStatus.INFRA_ERROR, f"handed back: the gateway shut down ({reason})")
    else:
        settle(s, TerminalStatus.CANCELLED, reason)
