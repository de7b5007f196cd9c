"""Plain records, the frozen config objects of the domain, and the two state machines (task, session).

Both machines are explicit tables of allowed transitions; :func:`check_task_transition` and
:func:`check_session_transition` are called before every change is persisted, so an illegal move is a bug that
surfaces at once instead of a corrupt row.

Session machine::

    pending ──dispatch──> starting ──gateway accepted──> running ──final result──> done
       ^                     │  │                           │
       └──busy / retry───────┘  └──────final (lost)────────>│
       └──────────────────────infra_error, attempts left────┘
    pending / starting / running ──cancel, early stop, deadline──> done (cancelled)

Task machine::

    pending ──first dispatch──> running ──all sessions done / early stop / deadline──> completed
    pending / running ──cancel──> cancelled
    pending / running ──rejected by every gateway──> failed
"""

from __future__ import annotations

import dataclasses
import enum
import json

from polar_core.errors import Internal
from polar_core.records import TerminalStatus

__all__ = [
    "CallbackTarget",
    "CoreConfig",
    "DeliveryConfig",
    "DeliveryRecord",
    "DeliveryState",
    "GatewayRecord",
    "NewTask",
    "PauseMode",
    "PolicyConfig",
    "PolicyRecord",
    "PolicyUpdateRecord",
    "ProxyOutcome",
    "ProxyRecord",
    "ProxyUpdateState",
    "ResultRecord",
    "SchedulerConfig",
    "SessionRecord",
    "SessionState",
    "StalePolicy",
    "TaskRecord",
    "TaskState",
    "UpdateOutcome",
    "check_session_transition",
    "check_task_transition",
]


class TaskState(enum.StrEnum):
    """Lifecycle state of a task."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        """Whether the task can no longer change."""
        return self in (TaskState.COMPLETED, TaskState.CANCELLED, TaskState.FAILED)


class SessionState(enum.StrEnum):
    """Where a session is, as the rollout server sees it."""

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"

    @property
    def in_flight(self) -> bool:
        """Whether a gateway may be running the session."""
        return self in (SessionState.STARTING, SessionState.RUNNING)


class StalePolicy(enum.StrEnum):
    """What happens to a session sampled more than a task's ``max_policy_lag`` versions behind."""

    KEEP = "keep"
    RESAMPLE = "resample"


class DeliveryState(enum.StrEnum):
    """State of one callback delivery (one session result to one target)."""

    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


_TASK_MOVES: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.RUNNING, TaskState.COMPLETED, TaskState.CANCELLED, TaskState.FAILED}),
    TaskState.RUNNING: frozenset({TaskState.COMPLETED, TaskState.CANCELLED, TaskState.FAILED}),
    TaskState.COMPLETED: frozenset(),
    TaskState.CANCELLED: frozenset(),
    TaskState.FAILED: frozenset(),
}

_SESSION_MOVES: dict[SessionState, frozenset[SessionState]] = {
    SessionState.PENDING: frozenset({SessionState.STARTING, SessionState.DONE}),
    SessionState.STARTING: frozenset({SessionState.RUNNING, SessionState.PENDING, SessionState.DONE}),
    SessionState.RUNNING: frozenset({SessionState.PENDING, SessionState.DONE}),
    SessionState.DONE: frozenset(),
}


def check_task_transition(old: TaskState, new: TaskState) -> None:
    """Raise :class:`Internal` unless ``old -> new`` is a legal task transition (or no change)."""
    if old != new and new not in _TASK_MOVES[old]:
        raise Internal(f"illegal task transition {old} -> {new}")


def check_session_transition(old: SessionState, new: SessionState) -> None:
    """Raise :class:`Internal` unless ``old -> new`` is a legal session transition (or no change)."""
    if old != new and new not in _SESSION_MOVES[old]:
        raise Internal(f"illegal session transition {old} -> {new}")


@dataclasses.dataclass(frozen=True, slots=True)
class CallbackTarget:
    """Where a task's session results are pushed.

    Attributes:
        kind: ``"http"`` (POST JSON to ``target``) or ``"grpc"`` (TrainerCallbackService at ``target``).
        target: The URL or ``host:port``.
        max_attempts: Delivery attempts before the result is dead-lettered; 0 means the server's default.
    """

    kind: str
    target: str
    max_attempts: int = 0


@dataclasses.dataclass(slots=True)
class TaskRecord:
    """A task as stored.

    Attributes:
        task_id: Client-chosen or server-assigned id.
        spec: The submitted task, serialised (opaque to the domain; the gateway client sends it on).
        spec_hash: Digest of ``spec`` plus the submission options; equal hashes mean the same submission.
        num_samples: Sessions to run.
        priority: Higher dispatches first.
        early_stop_min_usable: When positive, stop once this many usable results exist.
        session_timeout_s: The agent budget per session (the task's ``timeout_seconds``).
        callback: Where results are pushed, if anywhere.
        state: Lifecycle state.
        submitted_at: Unix seconds.
        deadline: Unix seconds by which every session must be done.
        finished_at: Unix seconds when the task became terminal.
        error_message: Why the task failed or stopped early, for people.
        seq: Insertion order assigned by the store (newest tasks have the largest ``seq``).
        results_count: Number of session results recorded (the next result index).
        trace_context: The W3C trace context (``traceparent``, ``tracestate``) of the SubmitTask call, so the
            task's sessions are dispatched in the submitter's trace even after a restart; empty when untraced.
        max_policy_lag: The staleness bound (the task's, else the server's default at submission); ``None``
            means no bound.
        stale_policy: What happens to a session beyond ``max_policy_lag``.
    """

    task_id: str
    spec: bytes
    spec_hash: str
    num_samples: int
    priority: int
    early_stop_min_usable: int
    session_timeout_s: float
    callback: CallbackTarget | None
    state: TaskState
    submitted_at: float
    deadline: float
    finished_at: float | None = None
    error_message: str = ""
    seq: int = 0
    results_count: int = 0
    trace_context: dict[str, str] = dataclasses.field(default_factory=dict)
    max_policy_lag: int | None = None
    stale_policy: StalePolicy = StalePolicy.KEEP


@dataclasses.dataclass(slots=True)
class SessionRecord:
    """One sample of a task as stored.

    Attributes:
        session_id: Unique id, stable across attempts.
        task_id: The owning task.
        sample_index: Index within the task.
        state: Where the session is.
        attempt: The current (or last) attempt number, from 1; 0 before the first dispatch.
        infra_failures: Attempts that ended in ``infra_error`` (outages not counted).
        gateway_id: The gateway of the current attempt.
        not_before: Unix seconds before which the session must not be dispatched (retry backoff).
        dispatched_at: When the current attempt was dispatched.
        deadline: When the current attempt must be done (the gateway enforces it; the server double-checks).
        priority: Copied from the task, for dispatch order.
        task_seq: Copied from the task, for dispatch order.
        stale_resamples: Attempts discarded because they were beyond the task's ``max_policy_lag``
            (``resample``); they count in ``attempt`` but not against ``max_attempts``.
        outages: Attempts lost to an unreachable dependency of the gateway (proxy, evaluator, reconstructor), or
            whose start a restart of this server interrupted; they do not use up the session's attempts (the
            task's deadline bounds them instead).
    """

    session_id: str
    task_id: str
    sample_index: int
    state: SessionState = SessionState.PENDING
    attempt: int = 0
    infra_failures: int = 0
    gateway_id: str = ""
    not_before: float = 0.0
    dispatched_at: float | None = None
    deadline: float | None = None
    priority: int = 0
    task_seq: int = 0
    stale_resamples: int = 0
    outages: int = 0


@dataclasses.dataclass(slots=True)
class ResultRecord:
    """A session's final result (exactly one per session) or a non-final attempt result (ledger only).

    Attributes:
        session_id: The session.
        task_id: Its task.
        sample_index: Its index within the task.
        status: Terminal status (reward is separate).
        reward: The session's reward.
        attempt: The attempt that produced it.
        gateway_id: The gateway that ran it ("" for results the server made up, e.g. cancellations).
        idempotency_key: Dedup key; repeated reports and deliveries of one result share it.
        error_message: Why the session failed, for people.
        duration_s: Wall-clock seconds of the attempt.
        calls: Model calls captured.
        chains: Traces reconstructed.
        policy_versions: Distinct policy versions among the session's calls.
        payload: The full result as reported (serialised protobuf, traces included); empty when made up.
        result_index: Completion order within the task (assigned by the store; -1 until recorded).
        recorded_at: Unix seconds.
        policy_lag: Versions the session's oldest call was behind the fleet when the result was recorded.
        fleet_version: The fleet's version used for ``policy_lag`` (0: unknown); each trace's own lag is
            computed from it when the result is read back.
        harness_exit_code: The harness's exit code, when it ran to an exit.
        dependency_unavailable: The attempt was lost to an unreachable dependency (an outage, not the policy).
    """

    session_id: str
    task_id: str
    sample_index: int
    status: TerminalStatus
    reward: float
    attempt: int
    gateway_id: str
    idempotency_key: str
    error_message: str = ""
    duration_s: float = 0.0
    calls: int = 0
    chains: int = 0
    policy_versions: list[str] = dataclasses.field(default_factory=list)
    payload: bytes = b""
    result_index: int = -1
    recorded_at: float = 0.0
    policy_lag: int = 0
    fleet_version: int = 0
    harness_exit_code: int | None = None
    dependency_unavailable: bool = False


@dataclasses.dataclass(slots=True)
class GatewayRecord:
    """A gateway in the scheduling pool.

    Attributes:
        gateway_id: Stable id chosen by the gateway.
        address: ``host:port`` of its GatewayService.
        capacity: Maximum concurrent sessions.
        draining: Whether new sessions must not be scheduled onto it.
        lease_expires_at: Unix seconds after which it is considered gone unless it heartbeats.
        active_sessions: Sessions it reported running at its last heartbeat.
        labels: Placement labels.
        version: Its software version.
        stage_metrics: Its last reported stage load, ``{stage: {queue_length, occupancy, workers}}``.
    """

    gateway_id: str
    address: str
    capacity: int
    draining: bool = False
    lease_expires_at: float = 0.0
    active_sessions: int = 0
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    version: str = ""
    stage_metrics: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class DeliveryRecord:
    """One session result to push to a task's callback (the outbox row).

    Attributes:
        idempotency_key: The result's key; the trainer dedupes on it.
        task_id: The task.
        session_id: The session.
        target: Where to deliver.
        state: Pending, delivered or dead (dead-lettered after ``max_attempts`` failures).
        attempts: Delivery attempts made.
        next_attempt_at: Unix seconds of the next attempt.
        last_error: The last failure, for people.
    """

    idempotency_key: str
    task_id: str
    session_id: str
    target: CallbackTarget
    state: DeliveryState = DeliveryState.PENDING
    attempts: int = 0
    next_attempt_at: float = 0.0
    last_error: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class CoreConfig:
    """The knobs of the domain (a subset of :class:`~rollout_server.settings.RolloutSettings`)."""

    max_attempts: int = 3
    retry_backoff_s: float = 1.0
    session_grace_s: float = 300.0
    task_timeout_s: float = 6 * 3600.0
    max_active_tasks: int = 10_000
    heartbeat_interval_s: float = 5.0
    lease_ttl_s: float = 20.0
    callback_max_attempts: int = 8
    watch_poll_s: float = 1.0
    default_max_policy_lag: int | None = None
    default_stale_policy: StalePolicy = StalePolicy.KEEP
    server_version: str = ""
    """The Polar version this server runs; a gateway of another release is refused ("" compares nothing)."""


@dataclasses.dataclass(frozen=True, slots=True)
class NewTask:
    """A validated submission.

    Attributes:
        task_id: The task id (already assigned when the client left it empty).
        spec: The serialised task.
        spec_hash: Digest of the submission; equal digests mean an identical resubmission.
        num_samples: Sessions to run.
        priority: Dispatch priority.
        early_stop_min_usable: Early-stop target (0: none).
        session_timeout_s: Agent budget per session.
        callback: Where results are pushed.
        task_timeout_s: Limit for the whole task; ``None`` means the server's default.
        max_policy_lag: The task's staleness bound; ``None`` means the server's default.
        stale_policy: What to do beyond the bound; ``None`` means the server's default.
    """

    task_id: str
    spec: bytes
    spec_hash: str
    num_samples: int
    priority: int = 0
    early_stop_min_usable: int = 0
    session_timeout_s: float = 600.0
    callback: CallbackTarget | None = None
    task_timeout_s: float | None = None
    max_policy_lag: int | None = None
    stale_policy: StalePolicy | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Timing of the background loops."""

    dispatch_interval_s: float = 0.5
    dispatch_batch: int = 256
    busy_backoff_s: float = 1.0
    watchdog_interval_s: float = 1.0
    deadline_slack_s: float = 5.0
    static_gateways: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class DeliveryConfig:
    """Retry policy of callback delivery."""

    max_attempts: int = 8
    backoff_s: float = 0.5
    backoff_max_s: float = 60.0
    batch: int = 64
    concurrency: int = 16
    poll_s: float = 1.0


# Policy updates ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Limits of the coordinator.

    Attributes:
        drain_timeout_s: How long a draining proxy waits for its calls in flight when the caller gives no limit.
        server_version: The Polar version this server runs; a proxy of another release is refused ("" compares
            nothing).
    """

    drain_timeout_s: float = 60.0
    server_version: str = ""


class PauseMode(enum.StrEnum):
    """What a proxy does with its calls in flight while an update pauses it."""

    DRAIN = "drain"
    ABORT = "abort"


class ProxyUpdateState(enum.StrEnum):
    """Where one proxy stands after an update."""

    UPDATED = "updated"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyRecord:
    """A policy the fleet serves.

    Attributes:
        version: The policy version, from 1 (0: nothing set yet; the proxies serve their configured weights).
        weights_path: The checkpoint directory the backends load.
        updated_at: Unix seconds when the version was stored.
    """

    version: int
    weights_path: str
    updated_at: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class ProxyRecord:
    """A model proxy of the fleet (the ``proxies`` row).

    Attributes:
        proxy_id: The id the proxy chose.
        address: Its ModelProxyService gRPC address.
        backend: Its backend name.
        version: The policy version it last confirmed loading.
        paused: Whether a failed update (or a pending start-up load) holds its calls.
        error: Its last update error; empty when none.
        registered_at: Unix seconds of its last registration.
    """

    proxy_id: str
    address: str
    backend: str = ""
    version: int = 0
    paused: bool = False
    error: str = ""
    registered_at: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class ProxyOutcome:
    """One proxy's part in an update.

    Attributes:
        proxy_id: The proxy.
        address: Its address at the time of the update.
        state: Updated or failed.
        error: Why it failed; empty when updated.
        load_seconds: Seconds its backend took to load.
        aborted_calls: In-flight calls the pause aborted.
    """

    proxy_id: str
    address: str
    state: ProxyUpdateState
    error: str = ""
    load_seconds: float = 0.0
    aborted_calls: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class UpdateOutcome:
    """What an UpdatePolicy call achieved.

    Attributes:
        policy: The fleet's policy after the update.
        proxies: Every proxy's part, by proxy id.
        complete: Whether every proxy serves the new policy.
        seconds: Seconds from the first check to the last resume.
        replayed: Whether this outcome was stored by an earlier call.
    """

    policy: PolicyRecord
    proxies: tuple[ProxyOutcome, ...]
    complete: bool
    seconds: float
    replayed: bool = False

    def to_json(self) -> str:
        """The outcome as JSON (the stored form; ``policy`` and ``replayed`` are not part of it)."""
        parts = [dataclasses.asdict(p) for p in self.proxies]
        return json.dumps({"proxies": parts, "complete": self.complete, "seconds": self.seconds}, sort_keys=True)

    @classmethod
    def from_json(cls, policy: PolicyRecord, text: str) -> UpdateOutcome:
        """Rebuild a stored outcome of ``policy``."""
        raw = json.loads(text)
        proxies = tuple(ProxyOutcome(**{**p, "state": ProxyUpdateState(p["state"])}) for p in raw.get("proxies", []))
        return cls(policy, proxies, bool(raw["complete"]), float(raw["seconds"]))


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyUpdateRecord:
    """A stored policy version (the ``policies`` row) and the outcome of its update.

    Attributes:
        policy: The version and weights.
        outcome: The update's outcome; ``None`` while it runs (or when the server stopped during it).
    """

    policy: PolicyRecord
    outcome: UpdateOutcome | None = None
