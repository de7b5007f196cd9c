"""The mutable record of one session while the pipeline drives it, and the table of them the gateway keeps.

Only the pipeline's modules touch a :class:`Session`; :class:`SessionTable` holds the running sessions and the
last finished ones (for GetSession and watchers), dropping what grows with a session once it is done.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace

from gateway.models import (
    AgentRun,
    Artifacts,
    Evaluation,
    PipelineConfig,
    Reconstruction,
    SessionResult,
    SessionSpec,
    Stage,
)
from gateway.ports import PreparedAgent
from polar_core.records import CompletionRecord, TerminalStatus
from runtimes.base import Runtime

__all__ = ["Session", "SessionTable", "settle"]


@dataclasses.dataclass(eq=False)
class Session:
    """One session's progress: stage, status, what it holds (runtime, proxy session, evaluation handle)."""

    spec: SessionSpec
    deadline: float
    admitted_at: float
    stage: Stage = Stage.INIT
    stage_entered_at: float = 0.0
    queued: bool = True
    status: TerminalStatus | None = None
    reward: float = 0.0
    error: str = ""
    dependency_unavailable: bool = False
    run_started_at: float | None = None
    run_ended_at: float | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    driver: asyncio.Task[None] | None = None
    work: asyncio.Task[None] | None = None
    cancel_requested: bool = False
    cancel_reason: str = ""
    handed_back: bool = False
    """Stopped because the gateway shuts down: it ends as an outage the rollout server runs again, not cancelled."""
    runtime: Runtime | None = None
    runtime_stopped: bool = False
    prepared: PreparedAgent | None = None
    proxy_open: bool = False
    proxy_used: bool = False
    listed: bool = False
    agent_run: AgentRun | None = None
    artifacts: Artifacts | None = None
    evaluation: Evaluation | None = None
    prewarm: asyncio.Task[str] | None = None
    eval_handle: str = ""
    completions: list[CompletionRecord] = dataclasses.field(default_factory=list)
    reconstruction: Reconstruction | None = None
    result: SessionResult | None = None
    trace_context: otel_context.Context | None = None
    stage_span: trace.Span | None = None


def settle(s: Session, status: TerminalStatus, message: str = "") -> None:
    """Fix the session's terminal status; the first one wins."""
    if s.status is None:
        s.status = status
        s.error = message


class SessionTable:
    """The sessions a gateway knows: every one not yet done, and the last ``retained_results`` finished ones.

    Args:
        config: How many finished sessions keep their results (``retained_results``) and their traces
            (``retained_traces``).
    """

    def __init__(self, config: PipelineConfig) -> None:
        self._config = config
        self._sessions: dict[str, Session] = {}
        self._done_order: collections.deque[str] = collections.deque()

    def get(self, session_id: str) -> Session | None:
        """The session with ``session_id``, or ``None``."""
        return self._sessions.get(session_id)

    def add(self, s: Session) -> None:
        """Add ``s``, in place of a finished session with the same id."""
        self.forget(s.spec.session_id)
        self._sessions[s.spec.session_id] = s

    def __iter__(self) -> Iterator[Session]:
        """Every session known, as a snapshot (sessions may be added or forgotten meanwhile)."""
        return iter(list(self._sessions.values()))

    def active(self) -> int:
        """How many sessions are not done."""
        return sum(1 for s in self._sessions.values() if s.stage is not Stage.DONE)

    def retain(self, s: Session) -> None:
        """``s`` is DONE: keep its result, and forget the oldest finished sessions beyond the bounds."""
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
            self.forget(self._done_order.popleft())

    def forget(self, session_id: str) -> None:
        """Drop the session with ``session_id`` if it is done."""
        old = self._sessions.get(session_id)
        if old is not None and old.stage is Stage.DONE:
            del self._sessions[session_id]
