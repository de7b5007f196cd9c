"""The seams the session pipeline is parameterised by; each has a real implementation and a fake.

Real implementations: :mod:`gateway.clients` (gRPC clients of the proxy, reconstructor and evaluator),
:mod:`gateway.agent` (harness adapters in a runtime) and the runtime factory of :mod:`runtimes`. Fakes for unit
tests and benchmarks live in :mod:`gateway.testing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.models import (
    AgentRun,
    Artifacts,
    BuilderConfig,
    Evaluation,
    ProxyEndpoints,
    Reconstruction,
    SessionResult,
    SessionSpec,
)
from polar_core.records import CompletionRecord, TerminalStatus
from runtimes.base import Runtime

__all__ = [
    "AgentRunner",
    "EvaluatorClient",
    "HealthProbe",
    "PreparedAgent",
    "ProxyClient",
    "ReconstructorClient",
    "ResultSink",
    "RuntimeFactory",
]


class RuntimeFactory(Protocol):
    """Creates (but does not start) the runtime a session's agent runs in."""

    def validate(self, spec: SessionSpec) -> None:
        """Raise ``InvalidArgument`` when ``spec``'s runtime table is malformed (checked at admission)."""
        ...

    def create(self, spec: SessionSpec) -> Runtime:
        """Return a new, unstarted runtime for ``spec``."""
        ...


class PreparedAgent(Protocol):
    """A harness prepared in a runtime and ready to launch; opaque to the pipeline."""

    @property
    def harness(self) -> str:
        """The harness name."""
        ...


class AgentRunner(Protocol):
    """Prepares and runs harnesses inside runtimes (the harness adapter registry sits behind it)."""

    def validate(self, spec: SessionSpec) -> None:
        """Raise ``InvalidArgument`` when ``spec``'s harness is unknown or its options are malformed (checked at
        admission, so a bad task is refused rather than failing at INIT)."""
        ...

    async def prepare(self, runtime: Runtime, spec: SessionSpec, endpoints: ProxyEndpoints) -> PreparedAgent:
        """Write the harness's configuration and the workspace into ``runtime``; idempotent."""
        ...

    async def run(self, runtime: Runtime, prepared: PreparedAgent, *, timeout_s: float) -> AgentRun:
        """Run the harness to completion; on ``timeout_s`` kill it and return outcome ``timeout``."""
        ...

    async def collect(self, runtime: Runtime, spec: SessionSpec, run: AgentRun) -> Artifacts:
        """Return what the agent produced (patch, files) for the evaluator."""
        ...


class ProxyClient(Protocol):
    """The model proxy's session management."""

    async def open_session(self, spec: SessionSpec, model: str, *, timeout_s: float) -> ProxyEndpoints:
        """Open (or reopen; idempotent) the session's proxy session and return its endpoints."""
        ...

    async def close_session(self, session_id: str, *, timeout_s: float) -> int:
        """Stop accepting calls for the session (idempotent) and return its completion count."""
        ...

    async def list_completions(self, session_id: str, *, timeout_s: float) -> list[CompletionRecord]:
        """Return every completion of the session in seq order."""
        ...


class ReconstructorClient(Protocol):
    """Turns completions into traces."""

    async def reconstruct(
        self,
        completions: Sequence[CompletionRecord],
        *,
        task_id: str,
        reward: float,
        status: TerminalStatus,
        builder: BuilderConfig,
        timeout_s: float,
    ) -> Reconstruction:
        """Return the traces of ``completions`` carrying ``reward`` and ``status``; idempotent."""
        ...


class EvaluatorClient(Protocol):
    """Scores a session's work in an evaluation environment."""

    async def prepare(self, spec: SessionSpec, *, request_id: str, timeout_s: float) -> str:
        """Build the evaluation environment and return its handle; idempotent by ``request_id``."""
        ...

    async def evaluate(self, handle: str, artifacts: Artifacts, run: AgentRun, *, timeout_s: float) -> Evaluation:
        """Score ``artifacts``; raises ``DeadlineExceeded`` when the evaluation runs past ``timeout_s``."""
        ...

    async def release(self, handle: str, *, timeout_s: float) -> None:
        """Free the evaluation environment; idempotent."""
        ...


class HealthProbe(Protocol):
    """Asks a dependency whether it serves (the gRPC health service every Polar server registers)."""

    async def healthy(self, *, timeout_s: float) -> bool:
        """Return whether the dependency answered SERVING within ``timeout_s``; never raises for an outage."""
        ...


class ResultSink(Protocol):
    """Receives each finished session's result (the rollout server's ReportSessionResult)."""

    async def report(self, result: SessionResult) -> None:
        """Deliver ``result``; deliveries with the same ``idempotency_key`` are one result."""
        ...
