"""Plain dataclasses of the evaluator domain: its records and its typed config (``convert.py`` maps the records
to and from protobuf; ``app.py`` builds the config from the settings)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from polar_core.records import AgentStatus, TerminalStatus, Trace

__all__ = [
    "Artifacts",
    "EvaluationResult",
    "EvaluatorConfig",
    "EvaluatorSpec",
    "PrepareParams",
    "TestOutcome",
    "TestStatus",
]


class TestStatus(enum.StrEnum):
    """The result of one test."""

    __test__ = False  # not a pytest class, despite the name

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    MISSING = "missing"


@dataclasses.dataclass(frozen=True, slots=True)
class EvaluatorConfig:
    """What the evaluation service takes (built from :class:`evaluator.settings.EvaluatorSettings`).

    Attributes:
        evaluations_dir: Where results and logs of evaluations are kept.
        runtimes_dir: Parent of local session directories.
        default_timeout_s: Evaluation time limit when neither the request nor the task sets one.
        prepare_timeout_s: Time limit of Prepare (runtime start and repository snapshot).
        local_isolation: Local runtime isolation: ``auto``, ``bwrap``, ``unshare`` or ``none``.
        local_python: The Python that runs tests in the local runtime.
        container_python: The Python command inside container images.
        docker_host: Docker daemon URL; empty uses the Docker SDK's defaults.
        docker_memory_limit: Memory limit of evaluation containers.
        docker_pids_limit: Process limit of evaluation containers.
        max_patch_bytes: The largest patch evaluated; a larger one is ``invalid_patch`` (the gateway's limit).
        min_isolation: The weakest local isolation allowed (``bwrap``, ``unshare`` or ``none``).
        read_only_roots: Host directories under which a task's ``runtime.read_only_paths`` may lie.
        allowed_images: Glob patterns of container images a task (or the session's image) may name.
        task_roots: Host directories a task's repository and test-patch paths must lie under; ``None`` checks
            nothing.
        disk_limit: The workspace disk quota of evaluation runtimes; ``None`` for none.
    """

    evaluations_dir: Path
    runtimes_dir: Path
    default_timeout_s: float = 1800.0
    prepare_timeout_s: float = 600.0
    local_isolation: str = "auto"
    local_python: str = "python3"
    container_python: str = "python3"
    docker_host: str = ""
    docker_memory_limit: str = "4g"
    docker_pids_limit: int = 1024
    max_patch_bytes: int = 64 * 1024 * 1024
    min_isolation: str = "bwrap"
    read_only_roots: tuple[Path, ...] = ()
    allowed_images: tuple[str, ...] = ()
    task_roots: tuple[Path, ...] | None = None
    disk_limit: str | None = "4g"


@dataclasses.dataclass(frozen=True, slots=True)
class EvaluatorSpec:
    """The task file's ``evaluator`` table: ``strategy`` plus strategy options."""

    strategy: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class PrepareParams:
    """What Prepare needs.

    Attributes:
        spec: The evaluator spec.
        task_id: For logs.
        session_id: For logs.
        repository_snapshot: Host path of the repository to evaluate in; overrides ``options["repo"]``.
        image: Container image; non-empty selects the Docker runtime.
        metadata: The task's metadata.
        request_id: Makes Prepare idempotent; empty means every call prepares anew.
    """

    spec: EvaluatorSpec
    task_id: str = ""
    session_id: str = ""
    repository_snapshot: str = ""
    image: str = ""
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    request_id: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Artifacts:
    """What the agent produced.

    Attributes:
        patch: The agent's change in git diff format; ``None`` or empty when it changed nothing.
        files: Files the agent produced, by path relative to the repository root.
        agent_status: How the agent run ended.
        traces: The session's traces, for evaluators that score traces individually.
    """

    patch: bytes | None = None
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    agent_status: AgentStatus = AgentStatus.COMPLETED
    traces: tuple[Trace, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class TestOutcome:
    """One test's result."""

    __test__ = False

    test_id: str
    status: TestStatus
    duration_s: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class EvaluationResult:
    """The score of one evaluation.

    Attributes:
        reward: The session's reward.
        status: The terminal status (separate from the reward).
        test_outcomes: Per-test results, when the strategy runs tests.
        trace_rewards: Per-trace rewards indexed by ``trace_index``; empty for a session-level reward.
        log_ref: Path of the evaluation log.
        error_message: Why the evaluation failed, when it did.
        duration_s: How long it ran.
    """

    reward: float
    status: TerminalStatus
    test_outcomes: tuple[TestOutcome, ...] = ()
    trace_rewards: tuple[float, ...] = ()
    log_ref: str = ""
    error_message: str = ""
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON form (for the stored result)."""
        return {
            "reward": self.reward,
            "status": self.status.value,
            "test_outcomes": [
                {"test_id": t.test_id, "status": t.status.value, "duration_s": t.duration_s} for t in self.test_outcomes
            ],
            "trace_rewards": list(self.trace_rewards),
            "log_ref": self.log_ref,
            "error_message": self.error_message,
            "duration_s": self.duration_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Inverse of :meth:`to_dict`."""
        return cls(
            reward=float(data["reward"]),
            status=TerminalStatus(data["status"]),
            test_outcomes=tuple(
                TestOutcome(t["test_id"], TestStatus(t["status"]), float(t["duration_s"]))
                for t in data.get("test_outcomes", [])
            ),
            trace_rewards=tuple(float(r) for r in data.get("trace_rewards", [])),
            log_ref=str(data.get("log_ref", "")),
            error_message=str(data.get("error_message", "")),
            duration_s=float(data.get("duration_s", 0.0)),
        )
