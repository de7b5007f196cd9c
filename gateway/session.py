"""The mutable record of one session while the pipeline drives it (only the pipeline's modules touch it)."""

from __future__ import annotations

import asyncio
import dataclasses

from opentelemetry import context as otel_context
from opentelemetry import trace

from gateway.models import AgentRun, Artifacts, Evaluation, Reconstruction, SessionResult, SessionSpec, Stage
from gateway.ports import PreparedAgent
from polar_core.records import CompletionRecord, TerminalStatus
from runtimes.base import Runtime

__all__ = ["Session", "settle"]


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
