"""Per-task summaries and statistics: progress counts plus what makes the asynchronous boundary visible.

Policy age is measured in policy versions, not optimiser steps (the server does not see the trainer's steps):
a session's age is how many distinct versions newer than its *oldest* version the server has seen in any
result. Versions are read with :func:`polar_core.policy_version.parse_version`: by number, and a version that is
not a number is the initial policy, 0.

Policy *lag* is the fleet's measure (see :mod:`rollout_server.staleness`): how many versions a session's oldest
call was behind the fleet's current integer version when its result was recorded; it is stored with the result.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Sequence

from polar_core.policy_version import parse_version
from polar_core.records import TerminalStatus
from rollout_server.models import (
    DeliveryState,
    ResultRecord,
    SessionRecord,
    SessionState,
    StalePolicy,
    TaskRecord,
)

__all__ = ["Distribution", "PolicyAgeBucket", "TaskStatistics", "TaskSummary", "summarize"]

_TRUNCATED = frozenset({TerminalStatus.AGENT_TIMEOUT, TerminalStatus.EVAL_TIMEOUT})


@dataclasses.dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of one per-session quantity."""

    count: int = 0
    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        """Summarise ``values`` (nearest-rank percentiles)."""
        if not values:
            return cls()
        ordered = sorted(values)

        def rank(q: float) -> float:
            return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

        return cls(len(ordered), sum(ordered) / len(ordered), rank(0.5), rank(0.9), ordered[-1])


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyAgeBucket:
    """Usable sessions of one policy age and their mean reward."""

    policy_age: int
    sessions: int
    mean_reward: float


@dataclasses.dataclass(frozen=True, slots=True)
class TaskStatistics:
    """What happened to a task's sessions (see ``TaskStatistics`` in ``rollout_service.proto``)."""

    session_duration_s: Distribution
    calls: Distribution
    chains: Distribution
    policy_age: Distribution
    reward_by_policy_age: tuple[PolicyAgeBucket, ...]
    sessions_dropped: int
    sessions_retried: int
    sessions_truncated: int
    attempts_total: int
    deliveries_pending: int
    deliveries_dead_lettered: int
    deliveries_delivered: int
    policy_lag: Distribution = Distribution()
    sessions_stale_resampled: int = 0
    sessions_stale_kept: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class TaskSummary:
    """A task with its progress counts and statistics."""

    task: TaskRecord
    sessions_total: int
    sessions_done: int
    sessions_usable: int
    sessions_running: int
    sessions_by_status: dict[str, int]
    mean_reward: float
    statistics: TaskStatistics


def _policy_ages(results: Sequence[ResultRecord], known: Sequence[str]) -> dict[str, int]:
    ordered = sorted({parse_version(v) for v in known})
    position = {v: i for i, v in enumerate(ordered)}
    ages: dict[str, int] = {}
    for r in results:
        versions = [position[n] for n in (parse_version(v) for v in r.policy_versions) if n in position]
        if versions:
            ages[r.session_id] = len(ordered) - 1 - min(versions)
    return ages


def summarize(
    task: TaskRecord,
    sessions: Sequence[SessionRecord],
    results: Sequence[ResultRecord],
    known_policy_versions: Sequence[str],
    deliveries: dict[DeliveryState, int],
) -> TaskSummary:
    """Build a task's summary from its sessions and final results.

    Args:
        task: The task.
        sessions: All of its sessions.
        results: Its final results (payloads are not needed).
        known_policy_versions: Every policy version the server has seen.
        deliveries: Its callback deliveries counted by state.
    """
    by_status = Counter(r.status.value for r in results)
    usable = [r for r in results if r.status.trainable]
    ages = _policy_ages(usable, known_policy_versions)
    buckets: dict[int, list[float]] = defaultdict(list)
    for r in usable:
        if r.session_id in ages:
            buckets[ages[r.session_id]].append(r.reward)
    bound = task.max_policy_lag
    keeps = task.stale_policy is StalePolicy.KEEP and bound is not None
    statistics = TaskStatistics(
        session_duration_s=Distribution.of([r.duration_s for r in results if r.gateway_id]),
        calls=Distribution.of([float(r.calls) for r in results if r.gateway_id]),
        chains=Distribution.of([float(r.chains) for r in results if r.gateway_id]),
        policy_age=Distribution.of([float(a) for a in ages.values()]),
        reward_by_policy_age=tuple(
            PolicyAgeBucket(age, len(rewards), sum(rewards) / len(rewards)) for age, rewards in sorted(buckets.items())
        ),
        sessions_dropped=sum(1 for r in results if not r.status.trainable),
        sessions_retried=sum(1 for s in sessions if s.attempt - s.stale_resamples > 1),
        sessions_truncated=sum(1 for r in results if r.status in _TRUNCATED),
        attempts_total=sum(s.attempt for s in sessions),
        deliveries_pending=deliveries.get(DeliveryState.PENDING, 0),
        deliveries_dead_lettered=deliveries.get(DeliveryState.DEAD, 0),
        deliveries_delivered=deliveries.get(DeliveryState.DELIVERED, 0),
        policy_lag=Distribution.of([float(r.policy_lag) for r in results if r.gateway_id]),
        sessions_stale_resampled=sum(1 for s in sessions if s.stale_resamples > 0),
        sessions_stale_kept=sum(1 for r in results if keeps and bound is not None and r.policy_lag > bound),
    )
    return TaskSummary(
        task=task,
        sessions_total=len(sessions),
        sessions_done=len(results),
        sessions_usable=len(usable),
        sessions_running=sum(1 for s in sessions if s.state in (SessionState.STARTING, SessionState.RUNNING)),
        sessions_by_status=dict(by_status),
        mean_reward=sum(r.reward for r in usable) / len(usable) if usable else 0.0,
        statistics=statistics,
    )
