"""POSTRUN for a session whose agent ran: collect its work, evaluate it, reconstruct its traces, stamp rewards.

:class:`SessionScorer` is called by the driver (:mod:`gateway.driver`) while the session holds a POSTRUN slot;
every side effect goes through :class:`gateway.steps.SessionSteps`. A failure it does not turn into a status
itself (a step past its time limit, a dependency that stays unreachable) propagates to the driver, which
settles the session with it.

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable

from gateway.agent_failures import agent_failure
from gateway.dependencies import PROXY, DependencyMonitor, Outage
from gateway.errors import PatchTooLarge, SessionDeadlinePassed
from gateway.models import AgentRun, Artifacts, Evaluation, PipelineConfig
from gateway.ports import AgentRunner, EvaluatorClient
from gateway.rewards import stamp_traces
from gateway.session import Session, settle
from gateway.steps import SessionSteps
from polar_core.errors import DeadlineExceeded, Internal, InvalidArgument, PolarError, Unavailable
from polar_core.records import AgentStatus, TerminalStatus
from runtimes.errors import DiskQuotaExceeded

__all__ = ["SessionScorer"]


class SessionScorer:
    """Scores the work of a session whose agent ran.

    Args:
        config: Time limits.
        steps: Runs every side effect.
        agents: Collects the agent's work from its runtime.
        evaluator: Scores work; ``None`` fails sessions whose task asks for an evaluator (infra_error).
        dependencies: Whether the proxy was reachable while the agent ran; ``None`` assumes it always was.
        clock: Unix time.
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        steps: SessionSteps,
        agents: AgentRunner,
        evaluator: EvaluatorClient | None,
        dependencies: DependencyMonitor | None,
        clock: Callable[[], float],
    ) -> None:
        self._config = config
        self._steps = steps
        self._agents = agents
        self._evaluator = evaluator
        self._dependencies = dependencies
        self._clock = clock

    async def score(self, s: Session) -> None:
        """Collect, evaluate and reconstruct; settle the session's status.

        A task whose evaluator ``needs_traces`` is reconstructed first and its traces go to the evaluator;
        otherwise the evaluation comes first (the traces then carry its verdict from the reconstructor). Either
        way the verdict and any per-trace rewards are stamped on the traces last (:mod:`gateway.rewards`).
        """
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
        s.artifacts = await self._steps.run(
            s,
            "harness.collect",
            functools.partial(self._agents.collect, runtime, s.spec, run),
            self._config.step_timeout_s,
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
        evaluator = self._evaluator
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
        limit = spec.evaluator.timeout_s or self._config.eval_timeout_s
        try:
            return await self._steps.run(
                s,
                "evaluator.evaluate",
                functools.partial(evaluator.evaluate, s.eval_handle, artifacts, run, timeout_s=limit),
                limit + self._config.step_timeout_s,
            )
        except DeadlineExceeded as exc:
            return Evaluation(0.0, TerminalStatus.EVAL_TIMEOUT, error_message=exc.message)
