"""The end of every session: salvage what a failed one captured, tear down, record the result, report it.

:meth:`WrapUp.finish` runs once per session however it ended (the driver shields it from cancellation):
it releases the evaluation environment, closes the proxy session and stops the runtime (each failure only
logged), settles a missing status as ``infra_error`` and moves the session to DONE with its
:class:`~gateway.models.SessionResult`; :meth:`WrapUp.report` then delivers that to the result sink. The driver
(:mod:`gateway.driver`) calls both; nothing here calls back into it.

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from gateway.kept import kept_artifacts
from gateway.models import PipelineConfig, SessionResult, Stage, completion_totals
from gateway.observer import StageObserver
from gateway.ports import ResultSink
from gateway.session import Session, settle
from gateway.steps import SessionSteps
from polar_core.errors import PolarError
from polar_core.records import AgentStatus, TerminalStatus

__all__ = ["WrapUp"]

_log = logging.getLogger(__name__)
# Results that carry no reward whatever the evaluator said.
_UNREWARDED = (TerminalStatus.INFRA_ERROR, TerminalStatus.CANCELLED)


def _exit_code(s: Session) -> int | None:
    """The harness's exit code, when it ran to an exit of its own (not killed at its budget, not cancelled)."""
    run = s.agent_run
    if run is None or run.outcome in (AgentStatus.TIMEOUT, AgentStatus.CANCELLED):
        return None
    return run.exit_code


class WrapUp:
    """Salvages, tears down and reports sessions.

    Args:
        config: The report's time limit.
        steps: Runs the teardown's side effects.
        observer: Moves sessions to DONE.
        sink: Receives every result; ``None`` keeps results only for GetSession and watchers.
        clock: Unix time.
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        steps: SessionSteps,
        observer: StageObserver,
        sink: ResultSink | None,
        clock: Callable[[], float],
    ) -> None:
        self._config = config
        self._steps = steps
        self._observer = observer
        self._sink = sink
        self._clock = clock
        self.mean_session_s = 0.0
        """Moving average of session durations (for the retry delay of a full gateway)."""

    async def salvage(self, s: Session) -> None:
        """Keep what a failed or cancelled session captured; best effort, and it needs no POSTRUN slot."""
        if not s.proxy_used:
            return
        try:
            await self._steps.close_proxy(s)
            if not s.listed:
                await self._steps.list_completions(s)
            if s.status is not TerminalStatus.CANCELLED and s.reconstruction is None:
                await self._steps.reconstruct(s)
        except (PolarError, TimeoutError) as exc:
            _log.warning("session %s: could not salvage its completions: %s", s.spec.session_id, exc)

    async def finish(self, s: Session) -> SessionResult:
        """Tear everything down, settle the status and move to DONE with the session's result (returned)."""
        await self._teardown(s)
        if s.handed_back and not (s.status is TerminalStatus.INFRA_ERROR and s.dependency_unavailable):
            # The gateway is going away: whatever this session settled on meanwhile is suspect (a signal to the
            # whole job, e.g. Slurm's scancel, also reaches the agent and the runtime), so it is handed back.
            was = f"{s.status.value}: {s.error}" if s.status is not None else "no status"
            s.status, s.error = TerminalStatus.INFRA_ERROR, f"handed back: the gateway shut down (was {was})"
            s.dependency_unavailable = True
        if s.status is None:
            settle(s, TerminalStatus.INFRA_ERROR, "the session ended without a status")
        if s.stage is not Stage.POSTRUN:
            self._observer.transition(s, Stage.POSTRUN)
        now = self._clock()
        self._observer.add_timing(s, now)
        total = s.timings["total"] = now - s.admitted_at
        s.result = self._result(s)
        self.mean_session_s = total if not self.mean_session_s else 0.9 * self.mean_session_s + 0.1 * total
        self._observer.transition(s, Stage.DONE, result=s.result)
        self._observer.finished(s.result.status)
        return s.result

    def _result(self, s: Session) -> SessionResult:
        status = s.status or TerminalStatus.INFRA_ERROR
        prompt_tokens, response_tokens = completion_totals(s.completions)
        return SessionResult(
            session_id=s.spec.session_id,
            task_id=s.spec.task_id,
            sample_index=s.spec.sample_index,
            attempt=s.spec.attempt,
            gateway_id=self._observer.gateway_id,
            status=status,
            reward=s.reward if status not in _UNREWARDED else 0.0,
            traces=s.reconstruction.traces if s.reconstruction is not None else [],
            timings=dict(s.timings),
            completions=len(s.completions),
            prompt_tokens=prompt_tokens,
            response_tokens=response_tokens,
            reconstruction=s.reconstruction.stats if s.reconstruction is not None else None,
            error_message=s.error,
            artifacts=kept_artifacts(s, self._config),
            harness_exit_code=_exit_code(s),
            dependency_unavailable=s.dependency_unavailable and status is TerminalStatus.INFRA_ERROR,
        )

    async def _teardown(self, s: Session) -> None:
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("evaluator.release", lambda: self._steps.release_evaluation(s)),
            ("proxy.close_session", lambda: self._steps.close_proxy(s)),
            ("runtime.stop", lambda: self._steps.stop_runtime(s)),
        ]
        for name, call in steps:
            try:
                await call()
            except (PolarError, TimeoutError, OSError) as exc:
                _log.warning("session %s: teardown step %s failed: %s", s.spec.session_id, name, exc)

    async def report(self, s: Session, result: SessionResult) -> None:
        """Deliver ``result`` to the result sink; a failure is only logged (the sink retries delivery)."""
        sink = self._sink
        if sink is None:
            return
        try:
            await self._steps.run(
                s, "sink.report", functools.partial(sink.report, result), self._config.step_timeout_s, deadline=False
            )
        except (PolarError, TimeoutError, OSError) as exc:
            # The result stays readable through GetSession and WatchSessions; delivery is the sink's retry.
            _log.warning("session %s: reporting the result failed: %s", s.spec.session_id, exc)
