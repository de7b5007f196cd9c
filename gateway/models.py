"""Plain records of the gateway's domain: session specs, stages, states, results and events.

The servicer converts protobuf messages to and from these; the pipeline never sees protobuf.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from polar_core.errors import InvalidArgument
from polar_core.records import (
    AgentStatus,
    CompletionRecord,
    ReconstructionStats,
    ReconstructionStrategy,
    TerminalStatus,
    Trace,
)

__all__ = [
    "AgentRun",
    "Artifacts",
    "BuilderConfig",
    "Capacity",
    "Evaluation",
    "EvaluatorConfig",
    "HarnessConfig",
    "PipelineConfig",
    "ProxyEndpoints",
    "Reconstruction",
    "RuntimeConfig",
    "SessionArtifacts",
    "SessionEvent",
    "SessionResult",
    "SessionSpec",
    "SessionState",
    "Stage",
    "StageSnapshot",
    "TestResult",
    "completion_totals",
    "proxy_session_id",
]


def proxy_session_id(session_id: str, attempt: int) -> str:
    """The model proxy's session of a session's ``attempt``: a retried attempt records into a fresh one.

    The proxy refuses to reopen a closed session, and a retry must not mix its calls with the failed
    attempt's; whoever reads an attempt's records (the gateway, ``polar run``, ``polar generate``) reads them
    under this id and maps them back to ``session_id``.
    """
    return session_id if attempt <= 1 else f"{session_id}~attempt{attempt}"


class Stage(enum.StrEnum):
    """The pipeline stage a session is in; ``DONE`` is the only final one."""

    INIT = "init"
    READY = "ready"
    RUNNING = "running"
    POSTRUN = "postrun"
    DONE = "done"


# The state machine: every stage change the pipeline makes must be listed here. A session leaves INIT or
# READY straight for POSTRUN when it fails or is cancelled there (POSTRUN then only tears down and reports).
TRANSITIONS: Mapping[Stage, frozenset[Stage]] = {
    Stage.INIT: frozenset({Stage.READY, Stage.POSTRUN}),
    Stage.READY: frozenset({Stage.RUNNING, Stage.POSTRUN}),
    Stage.RUNNING: frozenset({Stage.POSTRUN}),
    Stage.POSTRUN: frozenset({Stage.DONE}),
    Stage.DONE: frozenset(),
}


@dataclasses.dataclass(frozen=True, slots=True)
class PipelineConfig:
    """What the session pipeline is configured by (``gateway.app`` builds it from :class:`GatewaySettings`).

    The fields mean what the settings of the same names mean (see ``gateway.settings.GatewaySettings``).
    """

    max_sessions: int = 64
    init_workers: int = 4
    ready_capacity: int = 4
    running_workers: int = 8
    postrun_workers: int = 4
    postrun_backlog_limit: int = 16
    session_timeout_s: float = 1800.0
    agent_timeout_s: float = 600.0
    eval_timeout_s: float = 600.0
    step_timeout_s: float = 60.0
    runtime_start_timeout_s: float = 300.0
    teardown_timeout_s: float = 60.0
    step_retries: int = 2
    retained_results: int = 10_000
    retained_traces: int = 16
    watch_buffer: int = 1024
    default_model: str = "policy"
    result_patch_limit_bytes: int = 1 << 20
    result_log_limit_bytes: int = 64 << 10


@dataclasses.dataclass(frozen=True, slots=True)
class HarnessConfig:
    """The harness (agent program) and its options."""

    name: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """The sandbox kind (``local``, ``docker``, ``apptainer``; empty means the gateway default)."""

    kind: str = ""
    image: str = ""
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class EvaluatorConfig:
    """How a session's work is scored; an empty or ``none`` strategy skips evaluation."""

    strategy: str = ""
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        """Whether the session is evaluated at all."""
        return self.strategy not in ("", "none")

    @property
    def clean_runtime(self) -> bool:
        """Whether the evaluator scores in a fresh runtime, which is then prepared while the agent runs."""
        return bool(self.options.get("clean_runtime", self.options.get("refresh_runtime", False)))

    @property
    def timeout_s(self) -> float | None:
        """The evaluation time limit from the options, if any."""
        value = self.options.get("timeout_seconds", self.options.get("timeout_s"))
        return float(value) if value else None

    @property
    def score_on_timeout(self) -> bool:
        """Whether a timed-out agent's patch is still scored (option ``score_on_timeout``, default true).

        With ``false`` a session whose agent ran past its budget ends ``agent_timeout`` with reward 0 (its patch
        and logs are still kept on the result).
        """
        return bool(self.options.get("score_on_timeout", True))

    @property
    def needs_traces(self) -> bool:
        """Whether the evaluator is given the session's traces (option ``needs_traces``, default false).

        Then the session is reconstructed before it is evaluated, instead of after.
        """
        return bool(self.options.get("needs_traces", False))


@dataclasses.dataclass(frozen=True, slots=True)
class BuilderConfig:
    """How completions become traces; ``None`` strategy means the reconstructor's default."""

    strategy: ReconstructionStrategy | None = None
    end_of_turn_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class SessionSpec:
    """One session to run: a sample of a task.

    Attributes:
        session_id: Unique id, stable across attempts.
        task_id: The task (group id).
        sample_index: Index of this sample within the task.
        attempt: Attempt number, from 1.
        instruction: The instruction given to the agent.
        agent_timeout_s: Agent budget from RUN; 0 means the gateway's default.
        deadline: Unix time by which the session must be done; ``None`` means the gateway's session budget.
        priority: Higher goes first in the INIT queue and for RUNNING slots.
        model: Model name the harness asks for; empty means the gateway's default.
        harness: The harness to run.
        runtime: The sandbox to run it in.
        evaluator: How to score the work.
        builder: How to reconstruct traces.
        metadata: Free-form task metadata, passed through to the evaluator.
    """

    session_id: str
    task_id: str
    harness: HarnessConfig
    instruction: str = ""
    sample_index: int = 0
    attempt: int = 1
    agent_timeout_s: float = 0.0
    deadline: float | None = None
    priority: int = 0
    model: str = ""
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    evaluator: EvaluatorConfig = dataclasses.field(default_factory=EvaluatorConfig)
    builder: BuilderConfig = dataclasses.field(default_factory=BuilderConfig)
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def proxy_session_id(self) -> str:
        """The model proxy's session for this attempt (:func:`proxy_session_id`)."""
        return proxy_session_id(self.session_id, self.attempt)

    def __post_init__(self) -> None:
        if not self.session_id:
            raise InvalidArgument("session_id is required")
        if not self.harness.name:
            raise InvalidArgument("harness.name is required", details={"session_id": self.session_id})
        if self.attempt < 1:
            raise InvalidArgument("attempt counts from 1", details={"session_id": self.session_id})
        if self.agent_timeout_s < 0:
            raise InvalidArgument("timeout_seconds must not be negative", details={"session_id": self.session_id})


@dataclasses.dataclass(frozen=True, slots=True)
class ProxyEndpoints:
    """How a harness reaches the model proxy for one session."""

    token: str
    anthropic_base_url: str = ""
    openai_base_url: str = ""
    google_base_url: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class AgentRun:
    """The result of running a harness once."""

    outcome: AgentStatus
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Artifacts:
    """What the agent produced, for the evaluator; ``traces`` only for a task whose evaluator needs them."""

    patch: bytes | None = None
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    traces: tuple[Trace, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class TestResult:
    """One test's result as the evaluator reported it (``outcome``: passed, failed, error, skipped, missing)."""

    __test__ = False  # not a pytest class, despite the name

    test_id: str
    outcome: str
    duration_s: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Evaluation:
    """The evaluator's verdict.

    Attributes:
        trace_rewards: Per-trace rewards by trace index; empty for a session-level reward.
        test_outcomes: The result of each test the evaluator ran.
        log_ref: Where the evaluation's full log is.
    """

    reward: float
    status: TerminalStatus
    trace_rewards: tuple[float, ...] = ()
    error_message: str = ""
    test_outcomes: tuple[TestResult, ...] = ()
    log_ref: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class SessionArtifacts:
    """What a session's agent did, kept on its result (:mod:`gateway.kept` builds it with the caps).

    Attributes:
        patch: The collected workspace patch, at most ``PipelineConfig.result_patch_limit_bytes``.
        patch_truncated: Whether ``patch`` was cut.
        test_outcomes: The evaluator's per-test results.
        eval_log_ref: Where the evaluation log is.
        harness_stdout: The tail of the harness's stdout, at most ``result_log_limit_bytes``.
        harness_stderr: The tail of the harness's stderr, likewise.
        harness_log_truncated: Whether either log was cut.
    """

    patch: bytes = b""
    patch_truncated: bool = False
    test_outcomes: tuple[TestResult, ...] = ()
    eval_log_ref: str = ""
    harness_stdout: str = ""
    harness_stderr: str = ""
    harness_log_truncated: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Reconstruction:
    """Traces built from a session's completions."""

    traces: list[Trace]
    stats: ReconstructionStats


@dataclasses.dataclass(frozen=True, slots=True)
class SessionState:
    """A snapshot of a session.

    Attributes:
        stage_entered_at: Unix time the session entered ``stage``.
        queued: Whether the session waits to enter ``stage`` (for a worker or buffer space) rather than
            being served by it.
    """

    session_id: str
    task_id: str
    sample_index: int
    attempt: int
    stage: Stage
    gateway_id: str
    stage_entered_at: float
    deadline: float
    status: TerminalStatus | None = None
    error_message: str = ""
    queued: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class SessionResult:
    """The outcome of a session; it mirrors a line of ``sessions.jsonl`` plus its traces."""

    session_id: str
    task_id: str
    sample_index: int
    attempt: int
    gateway_id: str
    status: TerminalStatus
    reward: float
    traces: list[Trace]
    timings: Mapping[str, float]
    completions: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    reconstruction: ReconstructionStats | None = None
    error_message: str = ""
    artifacts: SessionArtifacts = dataclasses.field(default_factory=SessionArtifacts)
    harness_exit_code: int | None = None
    """The harness's exit code when it ran to an exit (``None``: it never ran, or was killed at its budget)."""
    dependency_unavailable: bool = False
    """The session failed because the proxy, evaluator or reconstructor was unreachable (an outage)."""

    @property
    def idempotency_key(self) -> str:
        """Deliveries of the same session attempt carry the same key."""
        return f"{self.session_id}/{self.attempt}"


@dataclasses.dataclass(frozen=True, slots=True)
class SessionEvent:
    """One state change; ``previous`` is ``None`` for a current-state event sent to a new watcher."""

    state: SessionState
    time: float
    previous: Stage | None = None
    result: SessionResult | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class StageSnapshot:
    """A pool's counters at one moment.

    Attributes:
        workers: Slots in the pool.
        queue_length: Sessions waiting for a slot.
        occupancy: Slots held.
        entered: Slots granted since start.
        exited: Slots released since start.
        mean_residence_s: Mean time a slot was held, over released slots (0 before the first).
    """

    stage: Stage
    workers: int
    queue_length: int
    occupancy: int
    entered: int
    exited: int
    mean_residence_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class Capacity:
    """The gateway's capacity and load.

    Attributes:
        capacity: Sessions accepted at once.
        active: Sessions accepted and not done.
        available: Further sessions StartSession would accept now.
        stages: Load of each stage's pool.
        draining: Whether new sessions are refused.
    """

    gateway_id: str
    capacity: int
    active: int
    available: int
    stages: list[StageSnapshot]
    draining: bool


def completion_totals(records: list[CompletionRecord]) -> tuple[int, int]:
    """Return the total prompt and response token counts over ``records``."""
    return sum(len(r.prompt_token_ids) for r in records), sum(len(r.response_token_ids) for r in records)
