"""Stage bookkeeping of the session pipeline: transitions, per-stage timings, spans, metrics and events.

:class:`StageObserver` is the one place a session changes stage (checked against
:data:`gateway.models.TRANSITIONS`); each change ends the old stage's span, starts the next one's, adds the time
spent to the session's timings and publishes a :class:`~gateway.models.SessionEvent` to watchers. It calls
nothing of the pipeline's: the driver tells it what happened, and the steps run their calls in its
:meth:`StageObserver.stage_context`.

Domain code only: no grpc, no protobuf.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace

from gateway.events import EventBus, Subscription
from gateway.metrics import GatewayMetrics
from gateway.models import TRANSITIONS, SessionEvent, SessionResult, SessionState, Stage
from gateway.session import Session
from polar_core.errors import Internal
from polar_core.records import TerminalStatus

__all__ = ["StageObserver"]


class StageObserver:
    """Records each session's stages as spans, timings, metrics and watcher events.

    Args:
        gateway_id: This gateway's id, written on states (the pipeline updates it once the port is known).
        tracer: Makes one span per stage of each session, children of the context StartSession ran in.
        metrics: Records finished sessions; ``None`` records nothing.
        watch_buffer: Events buffered per watcher.
        clock: Unix time.
    """

    def __init__(
        self,
        *,
        gateway_id: str,
        tracer: trace.Tracer,
        metrics: GatewayMetrics | None,
        watch_buffer: int,
        clock: Callable[[], float],
    ) -> None:
        self.gateway_id = gateway_id
        self._tracer = tracer
        self._metrics = metrics
        self._bus = EventBus(watch_buffer)
        self._clock = clock

    def admitted(self, s: Session) -> None:
        """A session was accepted in INIT: remember the caller's context, open its span, tell watchers."""
        s.trace_context = otel_context.get_current()
        self._start_span(s)
        self._publish(s, previous=None)

    def transition(self, s: Session, stage: Stage, *, result: SessionResult | None = None) -> None:
        """Move ``s`` to ``stage``.

        Raises:
            Internal: ``TRANSITIONS`` does not allow the change.
        """
        if stage not in TRANSITIONS[s.stage]:
            raise Internal(f"illegal session transition {s.stage.value} -> {stage.value}")
        now = self._clock()
        self.add_timing(s, now)
        previous = s.stage
        s.stage, s.stage_entered_at, s.queued = stage, now, stage is not Stage.DONE
        self._end_span(s)
        self._start_span(s)
        self._publish(s, previous=previous, result=result)

    def finished(self, status: TerminalStatus) -> None:
        """A session reached DONE with ``status``."""
        if self._metrics is not None:
            self._metrics.session_finished(status)

    def add_timing(self, s: Session, now: float) -> None:
        """Add the time since ``s`` entered its stage to that stage's timing."""
        if s.stage is not Stage.DONE:
            key = s.stage.value
            s.timings[key] = s.timings.get(key, 0.0) + now - s.stage_entered_at

    @contextlib.contextmanager
    def stage_context(self, s: Session) -> Iterator[None]:
        """Make the session's current stage span (else its StartSession context) the parent of what runs inside."""
        parent = s.trace_context
        if s.stage_span is not None:
            parent = trace.set_span_in_context(s.stage_span, parent)
        if parent is None:
            yield
            return
        token = otel_context.attach(parent)
        try:
            yield
        finally:
            otel_context.detach(token)

    def subscribe(self, task_id: str, session_ids: Collection[str]) -> Subscription:
        """Subscribe to the state changes of a task's sessions or of ``session_ids`` (all when both are empty)."""
        return self._bus.subscribe(task_id, session_ids)

    def state(self, s: Session) -> SessionState:
        """Return a snapshot of ``s``."""
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

    def _publish(self, s: Session, *, previous: Stage | None, result: SessionResult | None = None) -> None:
        self._bus.publish(SessionEvent(self.state(s), self._clock(), previous, result))

    def _start_span(self, s: Session) -> None:
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

    def _end_span(self, s: Session) -> None:
        span, s.stage_span = s.stage_span, None
        if span is None:
            return
        if s.stage is Stage.DONE and s.status is not None:
            span.set_attribute("polar.status", s.status.value)
            if s.status is TerminalStatus.INFRA_ERROR:
                span.set_status(trace.Status(trace.StatusCode.ERROR, s.error))
        span.end()
