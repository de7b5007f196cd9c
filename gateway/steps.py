"""The session pipeline's side effects: each an idempotent step with its own time limit, retried when UNAVAILABLE.

:class:`SessionSteps` runs every call the pipeline makes to its ports (proxy, evaluator, reconstructor,
runtime) inside the session's stage span (:meth:`gateway.observer.StageObserver.stage_context`), and holds the
steps both the POSTRUN work and the teardown need (close the proxy session, list completions, stop the runtime,
prepare and release the evaluation, reconstruct). Callers hand :meth:`SessionSteps.run` the port call itself
(``functools.partial``), so nothing of theirs runs inside a step.

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.errors import SessionDeadlinePassed, StepTimedOut
from gateway.models import PipelineConfig
from gateway.observer import StageObserver
from gateway.ports import EvaluatorClient, ProxyClient, ReconstructorClient
from gateway.session import Session
from polar_core.errors import Internal, Unavailable
from polar_core.records import TerminalStatus

__all__ = ["SessionSteps"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class SessionSteps:
    """Runs a session's side effects with time limits and retries.

    Args:
        config: Time limits and retry count.
        proxy: The model proxy's session management.
        reconstructor: Builds traces; ``None`` skips reconstruction.
        evaluator: Scores work; ``None`` means no evaluation environment is ever prepared.
        observer: Gives each call its stage span as the parent.
        clock: Unix time, for the session deadline.
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        proxy: ProxyClient,
        reconstructor: ReconstructorClient | None,
        evaluator: EvaluatorClient | None,
        observer: StageObserver,
        clock: Callable[[], float],
    ) -> None:
        self._config = config
        self._proxy = proxy
        self._reconstructor = reconstructor
        self._evaluator = evaluator
        self._observer = observer
        self._clock = clock

    async def run(
        self,
        s: Session,
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
        attempts = 1 + self._config.step_retries
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
                    with self._observer.stage_context(s):
                        return await call()
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

    async def close_proxy(self, s: Session) -> None:
        """Close the session's proxy session if it is open."""
        if not s.proxy_open:
            return
        await self.run(
            s,
            "proxy.close_session",
            functools.partial(
                self._proxy.close_session, s.spec.proxy_session_id, timeout_s=self._config.step_timeout_s
            ),
            self._config.step_timeout_s,
            deadline=False,
        )
        s.proxy_open = False

    async def list_completions(self, s: Session) -> None:
        """Read the session's completions from the proxy (attributed to the logical session)."""
        records = await self.run(
            s,
            "proxy.list_completions",
            functools.partial(
                self._proxy.list_completions, s.spec.proxy_session_id, timeout_s=self._config.step_timeout_s
            ),
            self._config.step_timeout_s,
            deadline=False,
        )
        for record in records:  # a retried attempt's proxy session still belongs to the logical session
            record.session_id = s.spec.session_id
        s.completions = records
        s.listed = True

    async def stop_runtime(self, s: Session) -> None:
        """Stop (after cancelling, for a cancelled session) the session's runtime, once."""
        runtime = s.runtime
        if runtime is None or s.runtime_stopped:
            return
        s.runtime_stopped = True
        if s.status is TerminalStatus.CANCELLED:
            await self.run(s, "runtime.cancel", runtime.cancel, self._config.teardown_timeout_s, deadline=False)
        await self.run(s, "runtime.stop", runtime.stop, self._config.teardown_timeout_s, deadline=False)

    async def prepare_evaluation(self, s: Session) -> str:
        """Build the session's evaluation environment and return its handle."""
        evaluator = self._evaluator
        if evaluator is None:
            raise Internal("evaluation without an evaluator client")
        request_id = f"{s.spec.session_id}/{s.spec.attempt}"
        return await self.run(
            s,
            "evaluator.prepare",
            functools.partial(
                evaluator.prepare, s.spec, request_id=request_id, timeout_s=self._config.runtime_start_timeout_s
            ),
            self._config.runtime_start_timeout_s,
            deadline=False,
        )

    async def release_evaluation(self, s: Session) -> None:
        """Release the session's evaluation environment, including one a prewarm in flight is building."""
        if s.prewarm is not None:
            # Let a prewarm in flight finish (briefly) so its environment can be released rather than leaked.
            await asyncio.wait({s.prewarm}, timeout=self._config.step_timeout_s)
            if not s.prewarm.done():
                s.prewarm.cancel()
                await asyncio.wait({s.prewarm})
            if not s.prewarm.cancelled() and s.prewarm.exception() is None:
                s.eval_handle = s.prewarm.result()
            s.prewarm = None
        if s.eval_handle and self._evaluator is not None:
            await self.run(
                s,
                "evaluator.release",
                functools.partial(self._evaluator.release, s.eval_handle, timeout_s=self._config.step_timeout_s),
                self._config.step_timeout_s,
                deadline=False,
            )
            s.eval_handle = ""

    async def reconstruct(self, s: Session, *, provisional: bool = False) -> None:
        """Build the session's traces from its completions (nothing to do without completions or a status).

        With ``provisional`` (before the evaluation, for an evaluator that needs the traces) the traces carry
        ``unresolved`` and reward 0 until the pipeline stamps the verdict on them (:mod:`gateway.rewards`).
        """
        if not s.completions or self._reconstructor is None or (s.status is None and not provisional):
            return
        status = TerminalStatus.UNRESOLVED if provisional or s.status is None else s.status
        reward = 0.0 if provisional else s.reward
        s.reconstruction = await self.run(
            s,
            "reconstructor.reconstruct",
            functools.partial(
                self._reconstructor.reconstruct,
                s.completions,
                task_id=s.spec.task_id,
                reward=reward,
                status=status,
                builder=s.spec.builder,
                timeout_s=self._config.step_timeout_s,
            ),
            self._config.step_timeout_s,
            deadline=False,
        )
