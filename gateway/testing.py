"""In-memory fakes of the pipeline's seams, for unit tests and the pipeline benchmark.

Each fake has known, configurable stage times (``asyncio.sleep``) and records what it was asked to do, so tests
can assert behaviour (teardown happened, the evaluator was prewarmed, ...) without processes or ports.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath

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
from gateway.ports import PreparedAgent
from polar_core.errors import DeadlineExceeded, InvalidArgument, NotFound
from polar_core.records import AgentStatus, CompletionRecord, ReconstructionStats, TerminalStatus, Trace
from runtimes.base import ExecResult, Runtime

__all__ = [
    "FakeAgentRunner",
    "FakeEvaluator",
    "FakeProxy",
    "FakeReconstructor",
    "FakeRuntime",
    "FakeRuntimeFactory",
    "RecordingSink",
]


class FakeRuntime:
    """A runtime that only records its lifecycle; ``start`` takes ``start_s`` seconds."""

    def __init__(self, session_id: str, start_s: float = 0.0, start_error: Exception | None = None) -> None:
        self._session_id = session_id
        self._start_s = start_s
        self._start_error = start_error
        self.started = False
        self.stopped = False
        self.cancelled = False

    @property
    def session_id(self) -> str:
        """The session this runtime belongs to."""
        return self._session_id

    @property
    def root(self) -> PurePosixPath:
        """A made-up session directory."""
        return PurePosixPath("/fake") / self._session_id

    async def start(self) -> None:
        """Pretend to boot (or raise the factory's ``start_error``)."""
        await asyncio.sleep(self._start_s)
        if self._start_error is not None:
            raise self._start_error
        self.started = True

    async def stop(self) -> None:
        """Pretend to destroy the sandbox."""
        self.stopped = True

    async def cancel(self) -> None:
        """Pretend to kill everything."""
        self.cancelled = True
        self.stopped = True

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,  # noqa: ASYNC109 (the Runtime protocol names it so)
    ) -> ExecResult:
        """Run nothing."""
        return ExecResult(0, "", "")

    async def upload(self, src: Path | bytes, dest: str | PurePosixPath, *, exclude: Sequence[str] = ()) -> None:
        """Accept nothing."""

    async def download(self, src: str | PurePosixPath) -> bytes:
        """There are no files."""
        raise NotFound(f"no file {src}")


@dataclasses.dataclass
class FakeRuntimeFactory:
    """Creates :class:`FakeRuntime` objects and keeps them for inspection."""

    start_s: float = 0.0
    start_error: Exception | None = None
    created: dict[str, FakeRuntime] = dataclasses.field(default_factory=dict)

    def validate(self, spec: SessionSpec) -> None:
        """Accept every runtime table."""

    def create(self, spec: SessionSpec) -> FakeRuntime:
        """Return a new fake runtime for ``spec``."""
        runtime = FakeRuntime(spec.session_id, self.start_s, self.start_error)
        self.created[spec.session_id] = runtime
        return runtime


@dataclasses.dataclass
class FakeProxy:
    """An in-memory model proxy: the fake agent records completions through :meth:`record_call`."""

    opened: dict[str, ProxyEndpoints] = dataclasses.field(default_factory=dict)
    closed: set[str] = dataclasses.field(default_factory=set)
    calls: dict[str, list[CompletionRecord]] = dataclasses.field(default_factory=dict)

    async def open_session(self, spec: SessionSpec, model: str, *, timeout_s: float) -> ProxyEndpoints:
        """Open (idempotently) and return made-up endpoints."""
        endpoints = self.opened.setdefault(
            spec.proxy_session_id,
            ProxyEndpoints(token=f"tok-{spec.proxy_session_id}", openai_base_url="http://fake/v1"),
        )
        self.calls.setdefault(spec.proxy_session_id, [])
        return endpoints

    async def close_session(self, session_id: str, *, timeout_s: float) -> int:
        """Close and count."""
        self.closed.add(session_id)
        return len(self.calls.get(session_id, []))

    async def list_completions(self, session_id: str, *, timeout_s: float) -> list[CompletionRecord]:
        """Return the recorded calls."""
        if session_id not in self.calls:
            raise NotFound(f"unknown proxy session {session_id}")
        return list(self.calls[session_id])

    def record_call(self, session_id: str) -> None:
        """Record one model call of a session (refused after close, like the real proxy)."""
        if session_id in self.closed:
            return
        calls = self.calls.setdefault(session_id, [])
        seq = len(calls)
        now = time.time()
        calls.append(
            CompletionRecord(
                session_id=session_id,
                call_id=f"{session_id}-{seq}",
                seq=seq,
                prompt_token_ids=[1, 2, 3 + seq],
                response_token_ids=[7, 8],
                response_logprobs=[-0.1, -0.2],
                started_at=now,
                ended_at=now,
            )
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Prepared:
    harness: str
    session_id: str


@dataclasses.dataclass
class FakeAgentRunner:
    """A harness that makes ``calls`` model calls spread over ``run_s`` seconds.

    Attributes:
        proxy: Where the calls are recorded.
        prepare_s: Time to prepare the harness (part of INIT).
        run_s: Time the agent runs; a per-session override can be given in harness option ``run_s``.
        calls: Model calls per run.
        backend: When set, each call holds this semaphore for ``call_s`` seconds (a capacity-limited "GPU").
        call_s: Time one call holds the backend.
        exit_code: Exit code of a run; nonzero gives outcome ``error``.
    """

    proxy: FakeProxy
    prepare_s: float = 0.0
    run_s: float = 0.0
    calls: int = 2
    backend: asyncio.Semaphore | None = None
    call_s: float = 0.0
    exit_code: int = 0
    known: frozenset[str] = frozenset({"fake"})
    ran: list[str] = dataclasses.field(default_factory=list)
    backend_busy_s: float = 0.0

    def validate(self, spec: SessionSpec) -> None:
        """Refuse a harness that is not one of ``known``."""
        if spec.harness.name not in self.known:
            raise InvalidArgument(f"unknown harness {spec.harness.name!r}", details={"harness": spec.harness.name})

    async def prepare(self, runtime: Runtime, spec: SessionSpec, endpoints: ProxyEndpoints) -> _Prepared:
        """Pretend to write configuration."""
        await asyncio.sleep(self.prepare_s)
        return _Prepared(spec.harness.name, spec.proxy_session_id)

    async def run(self, runtime: Runtime, prepared: PreparedAgent, *, timeout_s: float) -> AgentRun:
        """Make the calls, honouring ``timeout_s`` like a real harness run."""
        self.ran.append(runtime.session_id)
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                await self._work(prepared.session_id if isinstance(prepared, _Prepared) else runtime.session_id)
        except TimeoutError:
            return AgentRun(AgentStatus.TIMEOUT, exit_code=-9, duration_s=time.monotonic() - started)
        outcome = AgentStatus.COMPLETED if self.exit_code == 0 else AgentStatus.ERROR
        return AgentRun(outcome, exit_code=self.exit_code, stdout="done", duration_s=time.monotonic() - started)

    async def _work(self, session_id: str) -> None:
        gap = self.run_s / (self.calls + 1) if self.calls else self.run_s
        for _ in range(self.calls):
            await asyncio.sleep(gap)
            if self.backend is not None:
                async with self.backend:
                    t0 = time.monotonic()
                    await asyncio.sleep(self.call_s)
                    self.backend_busy_s += time.monotonic() - t0
            self.proxy.record_call(session_id)
        await asyncio.sleep(gap if self.calls else self.run_s)

    async def collect(self, runtime: Runtime, spec: SessionSpec, run: AgentRun) -> Artifacts:
        """Return a fixed patch."""
        return Artifacts(patch=b"diff --git a/x b/x\n")


@dataclasses.dataclass
class FakeReconstructor:
    """Builds one trace per completion (per-request), carrying the session's reward and status."""

    reconstruct_s: float = 0.0

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
        """Return per-request traces."""
        await asyncio.sleep(self.reconstruct_s)
        traces = [
            Trace(
                session_id=c.session_id,
                task_id=task_id,
                trace_index=i,
                call_ids=[c.call_id],
                prompt_token_ids=list(c.prompt_token_ids),
                response_token_ids=list(c.response_token_ids),
                loss_mask=[1 if status.trainable else 0] * len(c.response_token_ids),
                response_logprobs=list(c.response_logprobs),
                reward=reward,
                weight=1.0 / len(completions),
                status=status.value,
            )
            for i, c in enumerate(completions)
        ]
        stats = ReconstructionStats(calls=len(completions), chains=len(completions))
        return Reconstruction(traces, stats)


@dataclasses.dataclass
class FakeEvaluator:
    """Scores every session with ``reward`` after ``evaluate_s`` seconds; preparing takes ``prepare_s``."""

    prepare_s: float = 0.0
    evaluate_s: float = 0.0
    reward: float = 1.0
    prepared: dict[str, float] = dataclasses.field(default_factory=dict)
    released: list[str] = dataclasses.field(default_factory=list)
    evaluated: list[str] = dataclasses.field(default_factory=list)
    status_for: Callable[[float], TerminalStatus] = lambda r: (
        TerminalStatus.RESOLVED if r > 0 else TerminalStatus.UNRESOLVED
    )
    trace_rewards: Callable[[Artifacts], tuple[float, ...]] = lambda a: ()
    artifacts: list[Artifacts] = dataclasses.field(default_factory=list)

    async def prepare(self, spec: SessionSpec, *, request_id: str, timeout_s: float) -> str:
        """Build (pretend) and return a handle; remembers when preparation began."""
        self.prepared.setdefault(request_id, time.monotonic())
        await asyncio.sleep(self.prepare_s)
        return f"h-{request_id}"

    async def evaluate(self, handle: str, artifacts: Artifacts, run: AgentRun, *, timeout_s: float) -> Evaluation:
        """Score, or raise ``DeadlineExceeded`` past ``timeout_s`` like the real evaluator."""
        if self.evaluate_s > timeout_s:
            await asyncio.sleep(timeout_s)
            raise DeadlineExceeded(f"evaluation ran past {timeout_s} s")
        await asyncio.sleep(self.evaluate_s)
        self.evaluated.append(handle)
        self.artifacts.append(artifacts)
        status = self.status_for(self.reward)
        if run.outcome is AgentStatus.TIMEOUT and status in (TerminalStatus.RESOLVED, TerminalStatus.UNRESOLVED):
            status = TerminalStatus.AGENT_TIMEOUT  # as the real evaluator: the verdict of a timed-out agent
        return Evaluation(self.reward, status, self.trace_rewards(artifacts))

    async def release(self, handle: str, *, timeout_s: float) -> None:
        """Record the release."""
        self.released.append(handle)


@dataclasses.dataclass
class RecordingSink:
    """Keeps every reported result, in order."""

    results: list[SessionResult] = dataclasses.field(default_factory=list)

    async def report(self, result: SessionResult) -> None:
        """Record ``result``."""
        self.results.append(result)
