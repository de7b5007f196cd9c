"""Staleness: how far behind the fleet's policy a session was sampled, and what a task does about it.

The fleet's policy version is an integer (``UpdatePolicy`` sets it; 0 means none was set). Proxies stamp its wire
form on every call, so a call's lag is ``current - parse_version(call.policy_version)``; a version that is not
decimal digits is the initial policy, 0 (the one rule of :mod:`polar_core.policy_version`, so it can over-estimate
a lag but never hide one). A session's lag is that of its oldest call, measured when its result is recorded. Past
the task's ``max_policy_lag`` the task's :class:`StalePolicy` decides: keep the session (the lag travels with every
trace, for importance-sampling correction) or discard the attempt and sample the session again (see
``docs/rollout.md``, "Staleness").

The current version comes through the :class:`~rollout_server.ports.CurrentPolicyVersion` port;
:class:`StoreCurrentPolicyVersion` (the default) reads the version ``UpdatePolicy`` stored.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable

from polar_core.policy_version import INITIAL, parse_version
from polar_core.records import TerminalStatus
from rollout_server.models import ResultRecord, StalePolicy, TaskRecord
from rollout_server.store import Store

__all__ = [
    "StaleDecision",
    "StoreCurrentPolicyVersion",
    "decide",
    "dropped_result",
    "policy_lag",
    "with_lag",
]


def policy_lag(current: int, versions: Iterable[str]) -> int:
    """Versions the oldest of ``versions`` is behind ``current``; 0 when there is none or it is not behind."""
    numbers = [parse_version(v) for v in versions]
    return max(0, current - min(numbers)) if numbers else 0


def fleet_version(current: int, versions: Iterable[str]) -> int:
    """The fleet's version as a session saw it: ``current``, or a newer version one of its calls carries.

    A call cannot be sampled under a version the fleet has not reached, so a port that lags behind (the default
    one reads past results) is corrected by the session's own calls.
    """
    return max([current, *(parse_version(v) for v in versions)])


def with_lag(result: ResultRecord, current: int) -> ResultRecord:
    """``result`` with its ``fleet_version`` and ``policy_lag``, given the fleet's ``current`` version."""
    fleet = fleet_version(current, result.policy_versions)
    return dataclasses.replace(result, fleet_version=fleet, policy_lag=policy_lag(fleet, result.policy_versions))


class StaleDecision(enum.Enum):
    """What to do with a recorded result, given its lag and its task's bound."""

    FRESH = "fresh"  # within the bound (or no bound): record it
    KEEP = "keep"  # beyond the bound, kept with its lag (counted in sessions_stale_kept)
    RESAMPLE = "resample"  # beyond the bound: discard the attempt, dispatch the session again
    DROP = "drop"  # beyond the bound, resampling asked for but no time left: record it without its traces


def decide(task: TaskRecord, lag: int, *, now: float) -> StaleDecision:
    """Apply ``task``'s staleness bound to a result with ``lag``, recorded at ``now``.

    ``resample`` only while the task's deadline is ahead; after it the stale result is dropped, never delivered.
    """
    if task.max_policy_lag is None or lag <= task.max_policy_lag:
        return StaleDecision.FRESH
    if task.stale_policy is StalePolicy.KEEP:
        return StaleDecision.KEEP
    if task.state.terminal or now >= task.deadline:
        return StaleDecision.DROP
    return StaleDecision.RESAMPLE


def dropped_result(result: ResultRecord, task: TaskRecord) -> ResultRecord:
    """The final result of a stale session that could not be sampled again: cancelled, traces discarded."""
    return dataclasses.replace(
        result,
        status=TerminalStatus.CANCELLED,
        reward=0.0,
        error_message=(
            f"policy lag {result.policy_lag} is beyond max_policy_lag {task.max_policy_lag} and the task deadline "
            "leaves no time to sample the session again"
        ),
        payload=b"",
    )


class StoreCurrentPolicyVersion:
    """The default :class:`~rollout_server.ports.CurrentPolicyVersion`: the fleet's stored policy version.

    ``UpdatePolicy`` stores the new version before any proxy is paused, so the store's current policy is the
    fleet's version; before any update, the newest integer version a recorded call carried is the best the rollout
    server knows.
    """

    def __init__(self, store: Store) -> None:
        self._store = store

    async def current_version(self) -> int:
        """The fleet's current version (the initial one, 0, when none was set and no result carried a later one)."""
        policy = await self._store.current_policy()
        seen = max((parse_version(v) for v in await self._store.policy_versions()), default=INITIAL)
        return max(policy.version if policy is not None else INITIAL, seen)
